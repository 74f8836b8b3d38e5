"""The worked training examples run as a user runs them, on the shared pipeline run, and the
tokenizer the pipeline saved loads with ``AutoTokenizer`` and encodes as the pipeline did."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from examples import train_pretrain, train_sft
from tests.conftest import require_shared_data
from tests.support.loader_run import loader_output
from transforms.core.tokenizer import tokenizer_identity

require_shared_data()
FOLD_VOCAB = 512  # the examples' quick-CPU mode: seconds per run instead of minutes
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="module")
def output() -> Path:
    return loader_output()


def test_saved_tokenizer_encodes_as_the_pipeline_did(output, qwen_tokenizer) -> None:
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(output / "tokenizer")
    texts = ["Hello, world!", "def f(x):\n    return x ** 2\n", "床前明月光\uff0c疑是地上霜\u3002",
             "안녕하세요 <|im_end|> <|endoftext|>"]
    for text in texts:
        assert saved.encode(text) == qwen_tokenizer.encode(text)
    chat = [{"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"}]
    assert saved.apply_chat_template(chat, tokenize=False) == \
        qwen_tokenizer.apply_chat_template(chat, tokenize=False)
    assert (saved.eos_token_id, saved.pad_token_id, len(saved)) == \
        (qwen_tokenizer.eos_token_id, qwen_tokenizer.pad_token_id, len(qwen_tokenizer))
    recorded = json.loads((output / "manifest.json").read_text())["tokenizer"]
    identity = tokenizer_identity(saved)
    assert {k: v for k, v in identity.items() if k != "name"} == \
        {k: v for k, v in recorded.items() if k != "name"}  # vocabulary, template and all


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_example_trains_with_sft_trainer(output) -> None:
    losses = train_sft.main([str(output), "--steps", "2", "--fold_vocab", str(FOLD_VOCAB)])
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert losses[0] == pytest.approx(math.log(FOLD_VOCAB), rel=0.1)  # random weights: uniform


def test_pretrain_example_resumes_on_the_next_batch(output, tmp_path) -> None:
    """Stopped after 2 steps and resumed from its checkpoint, the loop trains on the same
    batches, with the same losses, as the run that never stopped."""
    common = [str(output), "--fold_vocab", str(FOLD_VOCAB), "--batch_size", "2",
              "--num_workers", "1", "--seed", "3"]
    whole = train_pretrain.main([*common, "--steps", "4"])
    checkpoint = str(tmp_path / "ckpt.pt")
    first = train_pretrain.main([*common, "--steps", "2", "--checkpoint", checkpoint])
    rest = train_pretrain.main([*common, "--steps", "4", "--checkpoint", checkpoint, "--resume"])
    assert [e["step"] for e in first + rest] == [1, 2, 3, 4]
    assert [e["batch"] for e in first + rest] == [e["batch"] for e in whole]
    assert len({e["batch"] for e in whole}) == 4
    for resumed, uninterrupted in zip(first + rest, whole, strict=True):
        assert resumed["loss"] == pytest.approx(uninterrupted["loss"], rel=1e-5)
