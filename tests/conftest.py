"""Shared test fixtures: where the shared real datasets live, and one tokenizer per session."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
EXAMPLES = ROOT / "examples" / "data"

if not SHARED_DATA.is_dir():
    raise RuntimeError(f"tests read real datasets from {SHARED_DATA}; it is missing")


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from transforms.tokenizer import load_tokenizer

    return load_tokenizer()
