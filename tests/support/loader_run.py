"""One pipeline run over real shared data for every training-side test module (the loader's,
its epochs', the training examples'), made once per test session.

Pretraining text, multi-turn chats and tool calls, in small row groups so there are many to deal,
with the unpacked examples (``--write_examples``) and the tokenizer written beside the outputs.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from tests.conftest import SHARED_DATA

INPUTS = [
    f"{SHARED_DATA}/pretrain/llamafactory_c4_demo.jsonl",
    f"{SHARED_DATA}/chat/fastchat_dummy_conversation.json",
    f"{SHARED_DATA}/chat/glaive_toolcall_en_demo.json",
]
ROW_GROUP_ROWS = 16
SEQ_LEN = 512


@functools.cache
def loader_output() -> Path:
    """The run's output directory (removed when the test process exits)."""
    from beam_pipeline.running import run

    out = Path(tempfile.mkdtemp(prefix="loader_run_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    run([*(f"--input={i}" for i in INPUTS), f"--output={out}", "--block_size=512",
         f"--seq_len={SEQ_LEN}", f"--row_group_rows={ROW_GROUP_ROWS}", "--num_shards=3",
         "--write_examples=true"])
    return out
