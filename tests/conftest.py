"""Shared test fixtures: where the shared real datasets live, their texts, and one tokenizer per
session."""

import csv
import functools
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
EXAMPLES = ROOT / "examples" / "data"
TEST_DATA = ROOT / "tests" / "data"



def require_shared_data() -> None:
    """Skips the calling test module when the shared real datasets are absent (a clone of the
    project alone): the tests that need them say so instead of failing."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared real datasets in {SHARED_DATA} (the folder beside the "
                    "repository), which is absent", allow_module_level=True)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from transforms.core.tokenizer import load_tokenizer

    return load_tokenizer()


@functools.cache
def pretrain_documents() -> list[str]:
    """Every shared pretraining text file whole (CRLF kept: the books have it), the lines of the
    one-article-per-line file, and every JSONL record's text."""
    require_shared_data()
    texts = []
    for path in sorted((SHARED_DATA / "pretrain").iterdir()):
        raw = path.read_bytes().decode("utf-8")
        if path.suffix == ".jsonl":
            texts += [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
            continue
        texts.append(raw)
        if path.name == "llamafactory_wiki_demo.txt":
            texts += [line for line in raw.split("\n") if line.strip()]
    return texts


def _strings(value, out):
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out)


@functools.cache
def other_shared_texts() -> list[str]:
    """Every string of the other shared datasets: Chinese poems, Korean chats and NLI, code,
    math, instructions, tool calls, preference pairs."""
    require_shared_data()
    texts = []
    for path in sorted(SHARED_DATA.glob("*/*")):
        if path.parent.name == "pretrain":
            continue
        if path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    _strings(json.loads(line), texts)
        elif path.suffix == ".json":
            _strings(json.loads(path.read_text(encoding="utf-8")), texts)
        elif path.suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as f:
                for row in csv.reader(f):
                    _strings(row, texts)
    return texts
