"""The default tokenizer's build facts (its saved files' names, its vocabulary's digest) and
the output's tokenizer files copied from the build. No shared data needed: these run on a clean
clone, as CI runs."""

import hashlib
import json
import os

import pytest

from transforms.core import tokenizer as tk
from transforms.io.tokenizer_files import write_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tk.load_tokenizer()


def _plain_vocab_digest(tokenizer) -> str:
    plain = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False,
                       separators=(",", ":"))
    return hashlib.sha256(plain.encode("utf-8")).hexdigest()


def test_a_default_whose_vocabulary_grew_is_hashed_again():
    """The build's digest serves only the vocabulary it was computed on."""
    fresh = tk._load_default(tk.build_default_tokenizer())
    built = tk.tokenizer_identity(fresh)["vocab_sha256"]
    assert built == _plain_vocab_digest(fresh)
    fresh.add_tokens(["<|an extra token|>"])
    grown = tk.tokenizer_identity(fresh)
    assert grown["vocab_size"] == 151647
    assert grown["vocab_sha256"] == _plain_vocab_digest(fresh) != built


def test_the_saved_default_is_what_save_pretrained_writes(tok, tmp_path):
    """write_tokenizer copies the default's build files instead of saving it again."""
    written = write_tokenizer(None, None, str(tmp_path / "out"))
    tok.save_pretrained(tmp_path / "saved")
    assert written == sorted(os.listdir(tmp_path / "saved")) == [
        "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    for name in written:
        assert (tmp_path / "out" / "tokenizer" / name).read_bytes() == (
            tmp_path / "saved" / name).read_bytes(), name
