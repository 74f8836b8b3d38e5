"""Labels: a rendered conversation's tokens, with the ids of its trained spans as labels and
-100 elsewhere. Encoding never changes the shared tokenizer: it uses tiktoken where its ids are
proven equal to the backend's, and private copies of the backend otherwise.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from transforms.core.fast_encoder import (
    SEPARATOR,
    SEPARATOR_ID,
    TiktokenEncoder,
    encode_joined,
    fast_raw_encoder,
    joinable,
    qwen2_encoding,
    qwen2_ranks,
)
from transforms.core.tokenizer import private_backend
from transforms.core.vocabulary import (
    CONTROL_TOKEN_TEXT,
    IGNORE_INDEX,
    NO_TRAINED_TOKENS,
    Drop,
)
from transforms.instruction.rendering.control_tokens import ControlTokens, alternation
from transforms.instruction.rendering.values import EncodedExample, MaskOptions, Rendered

if TYPE_CHECKING:
    from tokenizers import Encoding
    from transformers import PreTrainedTokenizerBase


class Labeller:
    """What labelling needs from one tokenizer, looked up once per batch."""

    def __init__(self, tok: PreTrainedTokenizerBase, options: MaskOptions,
                 control: ControlTokens) -> None:
        self.tools = _backend_tools(tok.backend_tokenizer)
        self.control = control
        self.end_ids = None if options.train_end_of_turn else _special_ids(tok)

    def start(self, rendered: list[Rendered]) -> Callable[[], list[EncodedExample | Drop]]:
        """Starts encoding the texts without control-token text in the background (where the
        tokenizer allows); the returned function gives each text's example or drop, in order,
        once its tokens are in."""
        plain = [k for k, r in enumerate(rendered) if r.marked is None]
        fast = self.tools.pieces
        tokens = None if fast is None else fast.start([rendered[k].text for k in plain])
        return functools.partial(self._finish, rendered, plain, tokens)

    def _finish(self, rendered: list[Rendered], plain: list[int],
                tokens: Callable[[], _TokenRun] | None) -> list[EncodedExample | Drop]:
        done: dict[int, EncodedExample | Drop] = {}
        # Ids and offsets are millions of small objects: a cyclic collection meanwhile would scan
        # them all.
        with _gc_paused():
            if tokens is not None:
                run = tokens()
                fast = list(itertools.compress(plain, run.accepted))
                done.update(zip(fast, self._masked_run(run, [rendered[k] for k in fast]),
                                strict=True))
            slow = [k for k in plain if k not in done]
            if slow:
                backend = self.tools.control_backend
                encodings = backend.encode_batch([rendered[k].text for k in slow],
                                                 add_special_tokens=False)
                done.update((k, self._example(rendered[k], encoding))
                            for k, encoding in zip(slow, encodings, strict=True))
            return [done[k] if k in done else self._example(r, None)
                    for k, r in enumerate(rendered)]

    def _example(self, rendered: Rendered, plain: Encoding | None
                 ) -> EncodedExample | Drop:
        """One example from the backend's encoding of its text, or of its marked rendering
        (``plain`` None)."""
        if plain is not None:
            ids, offsets = plain.ids, plain.offsets
        else:
            try:
                ids, offsets = self._encode_marked(rendered.marked)
            except Drop as e:
                return e
        input_ids = np.asarray(ids, dtype=np.int32)
        ranges = list(_token_ranges(offsets, rendered.spans))
        first = np.array([a for a, _ in ranges], dtype=np.int64)
        stop = np.array([b for _, b in ranges], dtype=np.int64)
        return self._labelled(_TokenRun(input_ids, [0, len(input_ids)]), first, stop,
                              [rendered.method])[0]

    def _masked_run(self, run: _TokenRun, rendered: list[Rendered]
                    ) -> list[EncodedExample | Drop]:
        """The examples of texts encoded end to end (``_PieceEncoder``), all masked at once.

        Each span's tokens are found from byte offsets: a token's character offsets are the
        characters its bytes fall in, and spans start and end at character boundaries, so a
        token overlaps a span in characters exactly when it does in bytes (a token holding part
        of a character counts as holding all of it). A text's tokens end after every earlier
        text's and before every later text's, so one search over the whole run finds them.
        """
        owners, lows, highs = [], [], []
        for i, r in enumerate(rendered):
            to_bytes = ((lambda at: at) if r.text.isascii()
                        else (lambda at, text=r.text: len(text[:at].encode("utf-8"))))
            for start, end in r.spans:
                if end > start:
                    owners.append(i)
                    lows.append(to_bytes(start))
                    highs.append(to_bytes(end))
        owner = np.array(owners, dtype=np.int64)
        bounds = np.array(run.bounds, dtype=np.int64)
        base = run.ends[bounds[:-1]][owner]  # byte offset of each span's text in the run
        token_ends = run.ends[1:]
        first = np.searchsorted(token_ends, base + np.array(lows, dtype=np.int64), "right")
        # Tokens starting before the span's end: those ending before it, and one more.
        stop = np.minimum(np.searchsorted(token_ends, base + np.array(highs, dtype=np.int64),
                                          "left") + 1, bounds[owner + 1])
        return self._labelled(run, first, stop, [r.method for r in rendered])

    def _labelled(self, run: _TokenRun, first: np.ndarray, stop: np.ndarray,
                  methods: list[str]) -> list[EncodedExample | Drop]:
        """Each text's example: labels are the ids in the token ranges [first, stop), less the
        end-of-turn tokens that close a range unless they are trained; an error for a text
        with no trained token."""
        keep = stop > first
        first, stop = first[keep], stop[keep]
        if self.end_ids is not None:
            end_ids = np.fromiter(self.end_ids, dtype=np.int64, count=len(self.end_ids))
            while True:
                closing = (stop > first) & np.isin(run.ids[stop - 1], end_ids)
                if not closing.any():
                    break
                stop = stop - closing
        depth = np.zeros(len(run.ids) + 1, dtype=np.int64)
        np.add.at(depth, first, 1)
        np.add.at(depth, stop, -1)
        trained = np.cumsum(depth[:-1]) > 0
        labels = np.where(trained, run.ids, IGNORE_INDEX).astype(np.int32)
        counts = np.concatenate(([0], np.cumsum(trained)))[run.bounds]
        return [EncodedExample(run.ids[a:b], labels[a:b], mask_method=method) if n_end > n_start
                else Drop(NO_TRAINED_TOKENS, "no token of the rendered text is trained")
                for a, b, n_start, n_end, method in zip(
                    run.bounds, run.bounds[1:], counts.tolist(), counts[1:].tolist(), methods,
                    strict=False)]

    def _encode_marked(self, marked: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and offsets (into the unmarked text) of a marked rendering.

        As in transformers' ``encode_marked_chat``: the text between marked tokens is encoded
        normally, each marked token as plain text, each piece after the first behind a newline
        that is then dropped (so a SentencePiece tokenizer adds no prefix space).
        """
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        position = 0
        for k, piece in enumerate(self.control.markers.split(marked)):
            if not piece:  # an empty text piece, or None for a lone marker
                continue
            as_text = k % 2 == 1
            piece_ids, piece_offsets = self._encode_piece(piece, as_text, first=k == 0)
            if as_text and self.control.ids.intersection(piece_ids):
                raise Drop(CONTROL_TOKEN_TEXT, f"the tokenizer encodes {piece!r} as a "
                                    "control token even as plain text")
            ids += piece_ids
            offsets += [(position + a, position + b) for a, b in piece_offsets]
            position += len(piece)
        return ids, offsets

    def _encode_piece(self, piece: str, as_text: bool, first: bool
                      ) -> tuple[list[int], list[tuple[int, int]]]:
        # Control-token text as plain text: the private copy with ``encode_special_tokens`` set.
        backend = self.tools.text_backend if as_text else self.tools.control_backend
        if not first:
            newline = backend.encode("\n", add_special_tokens=False).ids
            encoding = backend.encode("\n" + piece, add_special_tokens=False)
            if encoding.ids[: len(newline)] == newline:
                shifted = [(a - 1, b - 1) for a, b in encoding.offsets[len(newline) :]]
                return encoding.ids[len(newline) :], shifted
        encoding = backend.encode(piece, add_special_tokens=False)
        return encoding.ids, encoding.offsets



def _token_ranges(
    offsets: list[tuple[int, int]], spans: list[tuple[int, int]]
) -> Iterator[tuple[int, int]]:
    """Token index ranges [first, stop) of the tokens overlapping each character span.

    Offsets of a tokenization are non-decreasing, so the first token ending after the span's
    start and the first token starting at or after its end are found by binary search.
    """
    for start, end in spans:
        if end > start:
            first = bisect.bisect_right(offsets, start, key=itemgetter(1))
            stop = bisect.bisect_left(offsets, end, key=itemgetter(0))
            if stop > first:
                yield first, stop


def _special_ids(tok: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of special tokens: the end-of-turn markers that close a trained span."""
    added = (i for i, token in tok.added_tokens_decoder.items() if token.special)
    return frozenset((*added, *tok.all_special_ids))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()



# --- encoding without offsets -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TokenRun:
    """Texts' tokens end to end, so that a batch is masked with a few array operations."""

    ids: np.ndarray  # int32
    bounds: list[int]  # where each text's tokens start, then the total
    ends: np.ndarray | None = None  # int64: 0, then the byte offset at which each token ends
    accepted: Sequence[bool] = ()  # which of the texts given to ``_PieceEncoder`` are here


class _PieceEncoder:
    """Encodes rendered texts without offsets, with ids proven equal to the backend's.

    The backend cuts a text at its added tokens first and encodes each piece between them on its
    own (normalised, pre-tokenised, BPE); no merge ever crosses an added token. Where the backend
    is the offline Qwen2 tokenizer (``fast_raw_encoder`` proves it, and ``_piece_encoder`` that
    every added token is matched as written, without stripping, and is no prefix of another),
    tiktoken does the same with the added tokens as its special tokens: it takes the first token
    that matches at a position, the backend the longest, and with no token a prefix of another
    they are the same. It encodes a thread's share of the texts in one call (``encode_joined``).
    A piece that normalisation would change (not NFC) or that cannot be UTF-8 (lone surrogates)
    sends its whole text back to the backend, so byte offsets are always offsets into the text
    itself; token ends are cumulative byte lengths of the tokens.
    """

    def __init__(self, backend: Tokenizer, fast: TiktokenEncoder) -> None:
        self.fast = fast
        self.normalize = backend.normalizer.normalize_str
        added = backend.get_added_tokens_decoder()
        added_ids = {token.content: i for i, token in added.items()}
        self.split = re.compile(f"({alternation(tuple(added_ids)).pattern})").split
        self.added = frozenset(added_ids)
        self.joined = joinable(added_ids)
        self.encoding = qwen2_encoding(
            backend, {**added_ids, SEPARATOR: SEPARATOR_ID} if self.joined else added_ids)
        ranks = qwen2_ranks(backend)  # each token's bytes: the backend's vocabulary, decoded
        self.nbytes = np.zeros(max([*ranks.values(), *added]) + 1, dtype=np.int64)
        self.nbytes[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(
            map(len, ranks), np.int64, len(ranks))
        for i, token in added.items():
            self.nbytes[i] = len(token.content.encode("utf-8"))

    def _plain(self, text: str) -> bool:
        """Whether every piece of ``text`` between added tokens is UTF-8 and NFC already."""
        for piece in self.split(text)[::2]:
            if piece.isascii():
                continue
            try:
                piece.encode("utf-8")
            except UnicodeEncodeError:
                return False
            if self.normalize(piece) != piece:
                return False
        return True

    def start(self, texts: Sequence[str]) -> Callable[[], _TokenRun]:
        """Starts encoding the texts on the tiktoken encoder's threads; the returned function
        waits and gives the tokens of those it took (the others the backend must encode)."""
        plain = [text.isascii() or self._plain(text) for text in texts]
        encoded = self.fast.submit_slices(self._encode_slice,
                                          list(itertools.compress(texts, plain)))
        return lambda: self._assemble(plain, encoded())

    def _encode_slice(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids, in one tiktoken call where ``encode_joined`` can make it."""
        found = encode_joined(self.encoding, texts) if self.joined else None
        if found is None:  # the separator's text, if a text holds it, is text
            found = [self.encoding.encode_to_numpy(text, allowed_special=self.added,
                                                   disallowed_special=())
                     for text in texts]
        return found

    def _assemble(self, plain: list[bool], encoded: list[np.ndarray]) -> _TokenRun:
        bounds = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=bounds[1:])
        array = (np.concatenate(encoded).astype(np.int32, copy=False) if encoded
                 else np.empty(0, dtype=np.int32))
        ends = np.zeros(len(array) + 1, dtype=np.int64)
        np.cumsum(self.nbytes[array], out=ends[1:])
        return _TokenRun(array, bounds.tolist(), ends, plain)


def _piece_encoder(backend: Tokenizer, fallback: Callable[[str], list[int]]
                   ) -> _PieceEncoder | None:
    """A ``_PieceEncoder`` where its ids are proven equal to the backend's, else None.

    ``fallback`` encodes one text as the backend does without ``encode_special_tokens``.
    """
    post = backend.post_processor
    if post is not None and json.loads(post.__getstate__()).get("trim_offsets", False):
        return None  # trimmed offsets are not the tokens' bytes
    added = backend.get_added_tokens_decoder().values()
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
        return None  # matched around or after normalisation: not a plain split of the text
    # In sorted order a token that is a prefix of others comes just before one of them.
    if any(b.startswith(a) for a, b in itertools.pairwise(sorted(t.content for t in added))):
        return None  # tiktoken's first match at a position may not be the backend's longest
    fast = fast_raw_encoder(backend, fallback)
    return None if fast is None else _PieceEncoder(backend, fast)


class _BackendTools:
    """What encoding derives from one backend, made once per process and backend.

    Encoding never uses the shared backend itself, whose settings other callers change
    (``private_backend``), but tiktoken where it is proven and otherwise two private copies,
    made when first needed.
    """

    def __init__(self, backend: Tokenizer, signature: tuple) -> None:
        self.backend = backend
        self.signature = signature

    @functools.cached_property
    def control_backend(self) -> Tokenizer:
        """A private copy that encodes added-token text as the added tokens."""
        return private_backend(self.backend, encode_special_tokens=False)

    @functools.cached_property
    def text_backend(self) -> Tokenizer:
        """A private copy that encodes added-token text as plain text."""
        return private_backend(self.backend, encode_special_tokens=True)

    @functools.cached_property
    def pieces(self) -> _PieceEncoder | None:
        return _piece_encoder(self.backend, lambda text: self.control_backend.encode(
            text, add_special_tokens=False).ids)


_TOOLS: dict[int, _BackendTools] = {}


_TOOLS_LOCK = threading.Lock()


def _backend_tools(backend: Tokenizer) -> _BackendTools:
    """The backend's ``_BackendTools``, made again if its added tokens changed."""
    signature = tuple((i, t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized)
                      for i, t in sorted(backend.get_added_tokens_decoder().items()))
    with _TOOLS_LOCK:
        tools = _TOOLS.get(id(backend))
        if tools is None or tools.backend is not backend or tools.signature != signature:
            while len(_TOOLS) >= 16:
                _TOOLS.pop(next(iter(_TOOLS)))
            tools = _TOOLS[id(backend)] = _BackendTools(backend, signature)
        return tools

