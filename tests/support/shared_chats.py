"""The shared chat, instruction and math data as canonical conversations, for the template tests.

Every file of ``../shared/data`` that holds instruction data, adapted once per process; GSM8K
rows are read as question -> answer.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.conftest import SHARED_DATA, require_shared_data
from transforms.core.vocabulary import (
    Drop,
)
from transforms.instruction.adapters import (
    Conversation,
    to_conversation,
)

require_shared_data()

SWEEP_FILES = (
    *sorted(f"chat/{p.name}" for p in (SHARED_DATA / "chat").glob("*.json")),
    *sorted(f"instruction/{p.name}" for p in (SHARED_DATA / "instruction").iterdir()),
    *sorted(f"math/{p.name}" for p in (SHARED_DATA / "math").glob("gsm8k_*.jsonl")),
)
# Files whose rows are in no instruction format (utterance logs, seed tasks with instances).
NOT_ADAPTABLE = frozenset({
    "chat/taskmaster4_coffee_data_07.json",
    "instruction/stanford_alpaca_seed_tasks.jsonl",
})


def _rows(relative: str) -> list[dict]:
    path = SHARED_DATA / relative
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


@functools.cache
def adapted(relative: str) -> tuple[tuple[Conversation, ...], int]:
    """The file's conversations that adapt cleanly (GSM8K: question -> answer), and how many
    rows did not."""
    rows = _rows(relative)
    if Path(relative).name.startswith("gsm8k"):
        rows = [{"prompt": r["question"], "response": r["answer"]} for r in rows]
    conversations, failed = [], 0
    for row in rows:
        try:
            conversations.append(to_conversation(row))
        except Drop:
            failed += 1
    return tuple(conversations), failed


@functools.cache
def sweep_conversations() -> tuple[tuple[str, tuple[Conversation, ...]], ...]:
    """Every adaptable shared file with all its conversations; asserts the others adapt to
    nothing and the adaptable ones lose no row."""
    files = []
    for relative in SWEEP_FILES:
        conversations, failed = adapted(relative)
        if relative in NOT_ADAPTABLE:
            assert not conversations, relative
            continue
        assert conversations and not failed, relative
        files.append((relative, conversations))
    return tuple(files)


def gsm8k_rows(relative: str = "math/gsm8k_test.jsonl") -> list[dict]:
    return _rows(relative)
