"""``--system_prompt``: ``template`` (the default), ``none`` and a text, on real conversations,
with the default tokenizer and real tokenizers of other families.

The reference for the ids is transformers' own ``apply_chat_template``: under ``template`` with
the conversation as it is, under ``none`` with ``default_system_message=""`` (what the pipeline
passes the template), under a text with that text as a first system message.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline.cli import main
from tests.conftest import EXAMPLES, SHARED_DATA, require_shared_data
from tests.support.shared_chats import adapted
from transforms.core.tokenizer import BUILTIN_TEMPLATES, load_tokenizer
from transforms.core.vocabulary import IGNORE_INDEX
from transforms.instruction.adapters import Conversation
from transforms.instruction.chat_template import (
    check_system_prompt,
    encode_conversations,
    template_default_system,
)
from transforms.instruction.rendering.renderer import SYSTEM_NONE, SYSTEM_TEMPLATE
from transforms.instruction.rendering.values import MaskOptions

require_shared_data()

TEXT = "You are a terse math tutor."
MODES = (SYSTEM_TEMPLATE, SYSTEM_NONE, TEXT)
# "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" in the default tokenizer.
QWEN2_DEFAULT_SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
QWEN2_USER_HEADER_IDS = [151644, 872, 198]  # "<|im_start|>user\n"
TOKENIZERS = SHARED_DATA.parent / "tokenizers"
# Real conversations: chats, instructions with an input, tool calls (the system turn holds the
# tool definitions), math.
FILES = ("chat/kto_en_demo_messages.json", "instruction/alpaca_en_demo.json",
         "chat/glaive_toolcall_en_demo.json", "math/gsm8k_test.jsonl")
PER_FILE = 12


def conversations() -> list[Conversation]:
    found = [c for relative in FILES for c in adapted(relative)[0][:PER_FILE]]
    assert len(found) == PER_FILE * len(FILES)
    return found


def own_system(conversation: Conversation) -> bool:
    return conversation.messages[0]["role"] == "system"


def reference_ids(tok, conversation: Conversation, mode: str) -> list[int]:
    """transformers' ids for the conversation under ``mode``."""
    messages, extra = list(conversation.messages), {}
    if mode == SYSTEM_NONE:
        extra["default_system_message"] = ""
    elif mode != SYSTEM_TEMPLATE and not own_system(conversation):
        messages.insert(0, {"role": "system", "content": mode})
    tools = list(conversation.tools) if conversation.tools else None
    return list(tok.apply_chat_template(messages, tools=tools, tokenize=True,
                                        **extra)["input_ids"])


def trained_ids(example) -> list[int]:
    return example.input_ids[example.labels != IGNORE_INDEX].tolist()


@pytest.fixture(scope="module")
def encoded(qwen_tokenizer) -> dict[str, list]:
    """The shared conversations encoded by the default tokenizer under each mode."""
    chats = conversations()
    return {mode: encode_conversations(qwen_tokenizer, chats, MaskOptions(), system_prompt=mode)
            for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_default_tokenizer_ids_are_transformers_ids_under_each_mode(qwen_tokenizer, encoded,
                                                                   mode):
    for conversation, example in zip(conversations(), encoded[mode], strict=True):
        assert example.input_ids.tolist() == reference_ids(qwen_tokenizer, conversation, mode)


def test_default_tokenizer_system_turn_under_each_mode(qwen_tokenizer, encoded):
    """template: Qwen2's default system turn opens every conversation without one; none: the
    user turn opens it (with tools, the system turn holds only the tool definitions); a text:
    the text's system turn. The trained tokens are the same under all three."""
    text_turn = qwen_tokenizer.encode(f"<|im_start|>system\n{TEXT}<|im_end|>\n")
    checked = {"plain": 0, "tools": 0, "own system": 0}
    for k, conversation in enumerate(conversations()):
        template, none, text = (encoded[mode][k] for mode in MODES)
        assert trained_ids(template) == trained_ids(none) == trained_ids(text)
        if own_system(conversation):
            assert template.input_ids.tolist() == none.input_ids.tolist() == text.input_ids.tolist()
            checked["own system"] += 1
        elif conversation.tools:
            rendered = {m: qwen_tokenizer.decode(encoded[m][k].input_ids) for m in MODES}
            assert rendered[SYSTEM_TEMPLATE].startswith(
                "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
            assert rendered[SYSTEM_NONE].startswith("<|im_start|>system\n# Tools\n")
            assert rendered[TEXT].startswith(f"<|im_start|>system\n{TEXT}\n\n# Tools\n")
            checked["tools"] += 1
        else:
            n = len(QWEN2_DEFAULT_SYSTEM_IDS)
            assert template.input_ids[:n].tolist() == QWEN2_DEFAULT_SYSTEM_IDS
            assert none.input_ids.tolist() == template.input_ids[n:].tolist()
            assert none.labels.tolist() == template.labels[n:].tolist()
            assert none.input_ids[:3].tolist() == QWEN2_USER_HEADER_IDS
            assert text.input_ids[:len(text_turn)].tolist() == text_turn
            assert text.input_ids[len(text_turn):].tolist() == none.input_ids.tolist()
            checked["plain"] += 1
    assert checked["plain"] >= 2 * PER_FILE and checked["tools"] >= 1


def test_real_tokenizer_ids_under_each_mode():
    """Llama 3.1's stock template has no default system prompt: template and none give the same
    ids, a text adds its system turn; each as transformers renders it."""
    tok = load_tokenizer(str(TOKENIZERS / "llama3_1"))  # the path other tests load it by
    chats = [c for c in conversations() if not c.tools]  # its stock template drops tools
    results = {mode: encode_conversations(tok, chats, MaskOptions(), system_prompt=mode)
               for mode in MODES}
    header = f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{TEXT}<|eot_id|>"
    for k, conversation in enumerate(chats):
        template, none, text = (results[mode][k] for mode in MODES)
        assert template.input_ids.tolist() == reference_ids(tok, conversation, SYSTEM_TEMPLATE)
        assert none.input_ids.tolist() == template.input_ids.tolist()
        assert text.input_ids.tolist() == reference_ids(tok, conversation, TEXT)
        if not own_system(conversation):
            assert tok.decode(text.input_ids).startswith(header)
        assert trained_ids(template) == trained_ids(none) == trained_ids(text)


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_builtin_templates_default_system_prompt_and_none(name):
    """Only ChatML writes a default system prompt, and under none no built-in template does."""
    tok = load_tokenizer(None, name)
    expected = "You are a helpful assistant." if name == "chatml" else None
    assert template_default_system(tok, SYSTEM_TEMPLATE) == expected
    assert template_default_system(tok, SYSTEM_NONE) is None
    check_system_prompt(tok, SYSTEM_NONE)


def stubborn(tok):
    """The default tokenizer with a template that always writes its own default system prompt,
    as Qwen2.5's stock template does."""
    other = copy.copy(tok)
    other.chat_template = (
        "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>"
        "\\n' }}{%- endif %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + "
        "m.content + '<|im_end|>\\n' }}{%- endfor %}")
    return other


def test_none_is_refused_for_a_template_that_cannot_leave_its_default_out(qwen_tokenizer):
    tok = stubborn(qwen_tokenizer)
    assert template_default_system(tok, SYSTEM_NONE) == "You are Qwen."
    check_system_prompt(tok, SYSTEM_TEMPLATE)
    check_system_prompt(tok, TEXT)
    with pytest.raises(ValueError, match=r"--system_prompt none: .*'You are Qwen\.'"):
        check_system_prompt(tok, SYSTEM_NONE)


def test_command_line_refuses_an_empty_prompt_and_a_stubborn_template(tmp_path, capsys):
    template = tmp_path / "stubborn.jinja"
    template.write_text(stubborn(load_tokenizer()).chat_template)
    base = ["--input", str(EXAMPLES / "messages_sample.json"), "--output", str(tmp_path / "out")]
    for extra, message in (
            (["--system_prompt", " "], "for no system turn, give 'none'"),
            (["--system_prompt", "none", "--chat_template", str(template)],
             "--system_prompt none: the chat template writes its own system prompt")):
        with pytest.raises(SystemExit) as stopped:
            main([*base, *extra])
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()


def test_a_run_under_none_writes_no_system_turn(tmp_path, qwen_tokenizer):
    """The option reaches the workers: every packed segment of a real run starts with the user
    turn, and the manifest records the mode."""
    output = tmp_path / "out"
    main(["--input", str(EXAMPLES / "messages_sample.json"), "--output", str(output),
          "--system_prompt", "none"])
    rows = pq.read_table(output / "sft").to_pylist()
    segments = 0
    for row in rows:
        ids = np.asarray(row["input_ids"])
        for start in np.cumsum([0, *row["seq_lengths"][:-1]]):
            assert ids[start:start + 2].tolist() == QWEN2_USER_HEADER_IDS[:2]
            segments += 1
    manifest = json.loads((output / "manifest.json").read_text())
    assert segments == manifest["instruction"]["examples"] == 60
    assert manifest["config"]["instruction"]["system_prompt"] == SYSTEM_NONE
