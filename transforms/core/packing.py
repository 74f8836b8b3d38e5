"""Fixed-length blocks for pretraining and best-fit-decreasing packing for SFT.

Pure numpy / pyarrow functions with no Beam imports, so they can be unit-tested directly and
called inside a DoFn on one bounded, ordered chunk of records at a time. Every result depends
only on the order and values of the input (ties are broken by input index), which is what keeps
the pipeline's output independent of runner, worker count and bundle boundaries.

Token sequences are numpy ``int32`` arrays throughout; Arrow list columns are built from one flat
values array plus int32 offsets, never from Python lists of ints.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from transforms.core.vocabulary import (
    IGNORE_INDEX,
)

REMAINDER_POLICIES = ("drop", "pad", "carry")

_INT32_LIST = pa.list_(pa.int32())

PRETRAIN_SCHEMA = pa.schema([("input_ids", _INT32_LIST), ("seq_lengths", _INT32_LIST),
                             ("sources", _INT32_LIST)])
SFT_SCHEMA = pa.schema(
    [
        ("input_ids", _INT32_LIST),
        ("labels", _INT32_LIST),
        ("position_ids", _INT32_LIST),
        ("seq_lengths", _INT32_LIST),
        ("sources", _INT32_LIST),
    ]
)
# ``sources`` is aligned with ``seq_lengths``: the index of the ``--input`` each piece came from,
# so tokens can be counted (or left out) per input after packing. Padding comes from no input.
NO_SOURCE = -1

_INT32_MIN, _INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max
_BIN_ID_BITS = 32  # BFD keys are (remaining << 32) | bin_id, so one int compares like the tuple


@dataclasses.dataclass(frozen=True, eq=False)  # numpy fields: compare them explicitly
class TokenStream:
    """Documents joined back to back: the tokens, the lengths of the pieces they form and the
    input each piece came from.

    A piece is a document (or the part of one) with its trailing separator, so piece lengths
    sum to ``len(tokens)``. A chunk's tail after its last full block is a stream too, which is
    how leftover tokens (and their sources) travel to a later group instead of being dropped.
    """

    tokens: np.ndarray  # int32
    piece_lengths: np.ndarray  # int32, sums to len(tokens)
    piece_sources: np.ndarray  # int32, one input index per piece

    @classmethod
    def empty(cls) -> TokenStream:
        return cls(np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int32))


@dataclasses.dataclass(frozen=True, eq=False)  # numpy fields: compare them explicitly
class Blocks:
    """Fixed-length pretraining rows plus the token accounting the manifest reports.

    ``seq_lengths[i]`` holds the lengths of the document pieces in block ``i`` in order (a piece
    includes the separator that ends its document; under ``remainder="pad"`` the padding of the
    last block is its own final piece), so each sums to the block size. ``sources[i]`` holds,
    piece for piece, the input index of the document each came from (``NO_SOURCE`` for the
    padding); a document cut at a block edge gives both of its pieces its source.
    ``tokens_in == tokens_out + remainder_tokens + len(tail.tokens) - pad_tokens``.
    """

    input_ids: np.ndarray  # (n_blocks, block_size) int32
    seq_lengths: list[np.ndarray]  # one int32 array per block
    sources: list[np.ndarray]  # one int32 array per block, aligned with seq_lengths
    tokens_in: int  # document tokens + one separator per document
    tokens_out: int  # n_blocks * block_size
    remainder_tokens: int  # tokens of the final partial block dropped by remainder="drop"
    pad_tokens: int  # pad tokens added by remainder="pad"
    tail: TokenStream  # tokens after the last full block, kept by remainder="carry"


def _int32_values(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as int32, refusing non-integers and silent wrap-around of wider ints."""
    if values.dtype == np.int32:
        return values
    if values.size == 0:
        return values.astype(np.int32)
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{what} must hold integers, got dtype {values.dtype}")
    if values.min() < _INT32_MIN or values.max() > _INT32_MAX:
        raise ValueError(f"{what} hold values outside the int32 range")
    return values.astype(np.int32)


def _concat_int32(arrays: Sequence[np.ndarray], what: str) -> np.ndarray:
    """One new flat int32 array holding ``arrays`` back to back (never a view of the inputs)."""
    for i, array in enumerate(arrays):
        if np.ndim(array) != 1:
            raise ValueError(f"{what}[{i}] must be 1-D, got shape {np.shape(array)}")
    if not len(arrays):
        return np.empty(0, dtype=np.int32)
    return _int32_values(np.concatenate(arrays), what)


def _lengths(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{name}={value} is outside the int32 range")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _list_array(values: np.ndarray, offsets: np.ndarray) -> pa.ListArray:
    """A ``list<int32>`` array from flat int32 values and row offsets (length n_rows + 1)."""
    if offsets[-1] > _INT32_MAX:
        raise ValueError("too many values for one list<int32> column (int32 offsets overflow)")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def join_documents(token_arrays: Sequence[np.ndarray], separator_id: int,
                   sources: Sequence[int] | np.ndarray | None = None) -> TokenStream:
    """Each document followed by ``separator_id``, back to back; ``sources`` gives each
    document's input index (``NO_SOURCE`` for all when None: provenance not needed).

    >>> s = join_documents([np.array([1, 2, 3]), np.array([4, 5])], separator_id=0,
    ...                    sources=[0, 2])
    >>> s.tokens.tolist(), s.piece_lengths.tolist(), s.piece_sources.tolist()
    ([1, 2, 3, 0, 4, 5, 0], [4, 3], [0, 2])
    """
    _check_int("separator_id", separator_id)
    tokens = _concat_int32(token_arrays, "token_arrays")
    piece_lengths = (_lengths(token_arrays) + 1).astype(np.int32)
    piece_sources = _piece_sources(sources, len(token_arrays))
    piece_ends = np.cumsum(piece_lengths, dtype=np.int64)
    stream = np.full(len(tokens) + len(piece_lengths), separator_id, dtype=np.int32)
    is_token = np.ones(len(stream), dtype=bool)
    is_token[piece_ends - 1] = False
    stream[is_token] = tokens
    return TokenStream(stream, piece_lengths, piece_sources)


def _piece_sources(sources: Sequence[int] | np.ndarray | None, n_items: int) -> np.ndarray:
    """One int32 input index per item: ``sources`` checked, or ``NO_SOURCE`` for all."""
    if sources is None:
        return np.full(n_items, NO_SOURCE, np.int32)
    found = _int32_values(np.asarray(sources, dtype=np.int64).reshape(-1), "sources")
    if len(found) != n_items:
        raise ValueError(f"{len(found)} sources for {n_items} items")
    return found


def join_streams(streams: Sequence[TokenStream]) -> TokenStream:
    """Streams back to back, in the given order (tails of several chunks, say)."""
    if not streams:
        return TokenStream.empty()
    return TokenStream(_concat_int32([s.tokens for s in streams], "tokens"),
                       _concat_int32([s.piece_lengths for s in streams], "piece_lengths"),
                       _concat_int32([s.piece_sources for s in streams], "piece_sources"))


def concat_blocks(
    token_arrays: Sequence[np.ndarray],
    block_size: int,
    separator_id: int,
    remainder: str = "drop",
    pad_id: int | None = None,
    sources: Sequence[int] | np.ndarray | None = None,
) -> Blocks:
    """Join documents, each followed by ``separator_id``, and cut the stream into full blocks.

    Pretraining wastes no compute on padding this way; a document may continue into the next
    block, and ``seq_lengths`` records where documents end so attention can be kept per document
    (``sources``, each document's input index, says where each piece came from). See
    ``cut_blocks`` for the remainder policies.

    >>> b = concat_blocks([np.array([1, 2, 3]), np.array([4, 5])], block_size=3, separator_id=0)
    >>> b.input_ids.tolist(), [s.tolist() for s in b.seq_lengths]
    ([[1, 2, 3], [0, 4, 5]], [[3], [1, 2]])
    >>> b.tokens_in, b.tokens_out, b.remainder_tokens
    (7, 6, 1)
    >>> b = concat_blocks([np.array([1, 2, 3])], 3, 0, remainder="pad", pad_id=9)
    >>> b.input_ids.tolist(), [s.tolist() for s in b.seq_lengths], b.pad_tokens
    ([[1, 2, 3], [0, 9, 9]], [[3], [1, 2]], 2)
    """
    return cut_blocks(join_documents(token_arrays, separator_id, sources), block_size,
                      remainder, pad_id)


def cut_blocks(
    stream: TokenStream, block_size: int, remainder: str = "drop", pad_id: int | None = None
) -> Blocks:
    """Cut a joined stream into rows of exactly ``block_size`` tokens.

    The tokens after the last full block are dropped (``"drop"``, counted in
    ``remainder_tokens``), padded into one more block with ``pad_id`` (``"pad"``, counted in
    ``pad_tokens``, the pad run its own ``seq_lengths`` piece), or returned as ``tail``
    (``"carry"``) so a later group can use them. A piece keeps the source of the stream piece
    it is cut from, on both sides of a block edge and into the tail; the pad run has
    ``NO_SOURCE``.

    >>> s = join_documents([np.array([1, 2, 3]), np.array([4, 5])], separator_id=0,
    ...                    sources=[0, 1])
    >>> b = cut_blocks(s, 3, remainder="carry")
    >>> b.input_ids.tolist(), [p.tolist() for p in b.sources], b.tail.piece_lengths.tolist()
    ([[1, 2, 3], [0, 4, 5]], [[0], [0, 1]], [1])
    >>> b.tail.tokens.tolist(), b.tail.piece_sources.tolist()
    ([0], [1])
    """
    _check_int("block_size", block_size, minimum=1)
    if remainder not in REMAINDER_POLICIES:
        raise ValueError(f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}")
    if remainder == "pad":
        if pad_id is None:
            raise ValueError('remainder="pad" needs a pad_id')
        _check_int("pad_id", pad_id)
    tokens_in = len(stream.tokens)
    piece_ends = np.cumsum(stream.piece_lengths, dtype=np.int64)
    if (piece_ends[-1] if len(piece_ends) else 0) != tokens_in:
        raise ValueError("piece_lengths must sum to the number of tokens")
    if len(stream.piece_sources) != len(piece_ends):
        raise ValueError("piece_sources must have one entry per piece")
    n_blocks, partial = divmod(tokens_in, block_size)
    if remainder == "pad" and partial:
        n_blocks += 1
    n_out = n_blocks * block_size

    out = stream.tokens[:n_out]
    if n_out > tokens_in:
        out = np.concatenate([out, np.full(n_out - tokens_in, pad_id, dtype=np.int32)])

    # Piece boundaries are the document ends and the block edges; the pad run ends at n_out.
    block_edges = np.arange(0, n_out + 1, block_size, dtype=np.int64)
    cuts = np.union1d(piece_ends[piece_ends < n_out], block_edges)
    pieces = np.diff(cuts).astype(np.int32)
    sources = _sources_from(cuts[:-1], piece_ends, stream.piece_sources)
    split_at = np.searchsorted(cuts, block_edges[1:-1])
    tail = TokenStream.empty()
    if remainder == "carry" and tokens_in > n_out:
        tail_cuts = np.union1d([n_out], piece_ends[piece_ends > n_out])
        tail = TokenStream(stream.tokens[n_out:].copy(), np.diff(tail_cuts).astype(np.int32),
                           _sources_from(tail_cuts[:-1], piece_ends, stream.piece_sources))
    return Blocks(
        input_ids=out.reshape(n_blocks, block_size),
        seq_lengths=np.split(pieces, split_at) if n_blocks else [],
        sources=np.split(sources, split_at) if n_blocks else [],
        tokens_in=tokens_in,
        tokens_out=n_out,
        remainder_tokens=max(tokens_in - n_out, 0) if remainder == "drop" else 0,
        pad_tokens=max(n_out - tokens_in, 0),
        tail=tail,
    )


def _sources_from(starts: np.ndarray, piece_ends: np.ndarray, piece_sources: np.ndarray
                  ) -> np.ndarray:
    """The source of the stream piece holding each start position; ``NO_SOURCE`` past the
    stream's end (padding)."""
    found = np.full(len(starts), NO_SOURCE, np.int32)
    index = np.searchsorted(piece_ends, starts, side="right")
    inside = index < len(piece_ends)
    found[inside] = piece_sources[index[inside]]
    return found


def blocks_to_table(blocks: Blocks) -> pa.Table:
    """The ``PRETRAIN_SCHEMA`` table of ``blocks``: one row per block.

    >>> t = blocks_to_table(concat_blocks([np.array([1, 2, 3]), np.array([4, 5])], 3, 0,
    ...                                   sources=[0, 1]))
    >>> t.to_pydict()
    {'input_ids': [[1, 2, 3], [0, 4, 5]], 'seq_lengths': [[3], [1, 2]], 'sources': [[0], [0, 1]]}
    """
    n_blocks, block_size = blocks.input_ids.shape
    ids_offsets = np.arange(n_blocks + 1, dtype=np.int64) * block_size
    return pa.Table.from_arrays(
        [
            _list_array(blocks.input_ids.reshape(-1), ids_offsets),
            _list_array(
                _concat_int32(blocks.seq_lengths, "seq_lengths"),
                _offsets(_lengths(blocks.seq_lengths)),
            ),
            _list_array(
                _concat_int32(blocks.sources, "sources"),
                _offsets(_lengths(blocks.sources)),
            ),
        ],
        schema=PRETRAIN_SCHEMA,
    )


def pack_best_fit_decreasing(
    lengths: np.ndarray, capacity: int, max_segments: int | None = None
) -> list[np.ndarray]:
    """Group items into as few bins of ``capacity`` as best-fit decreasing manages.

    Items are taken longest first (ties: lower index first) and each goes into the open bin with
    the least remaining room that still fits it (ties: lowest bin index), else into a new bin.
    A bin holding ``max_segments`` items is closed. Returns each bin's item indices in the order
    they were placed; bins are numbered in the order they were opened. Runs in O(n log n) plus a
    memmove per placement. Items longer than ``capacity`` are refused: overflow is the caller's
    policy, never silent truncation here.

    >>> [b.tolist() for b in pack_best_fit_decreasing(np.array([4, 8, 1, 4, 2, 1]), 10)]
    [[1, 4], [0, 3, 2, 5]]
    >>> [b.tolist() for b in pack_best_fit_decreasing(np.array([3, 3, 3]), 10, max_segments=2)]
    [[0, 1], [2]]
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not (lengths.size == 0 or np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(
            f"lengths must be a 1-D integer array, got {lengths.dtype} {lengths.shape}"
        )
    _check_int("capacity", capacity, minimum=1)
    if max_segments is not None:
        _check_int("max_segments", max_segments, minimum=1)
    if lengths.size and lengths.min() < 1:
        bad = int(np.argmax(lengths < 1))
        raise ValueError(f"item {bad} has length {lengths[bad]}; lengths must be >= 1")
    if lengths.size and lengths.max() > capacity:
        bad = int(np.argmax(lengths > capacity))
        raise ValueError(f"item {bad} has length {lengths[bad]} > capacity {capacity}")

    order = np.argsort(-lengths.astype(np.int64), kind="stable")
    bin_of = np.empty(len(order), dtype=np.int64)  # bin of the i-th placed item
    open_keys: list[int] = []  # sorted (remaining << 32) | bin_id of bins that can take more
    counts: list[int] = []  # items per bin
    segment_cap = max_segments if max_segments is not None else len(order) + 1
    for i, length in enumerate(lengths[order].tolist()):
        pos = bisect.bisect_left(open_keys, length << _BIN_ID_BITS)
        if pos < len(open_keys):
            key = open_keys.pop(pos)
            bin_id, remaining = key & ((1 << _BIN_ID_BITS) - 1), key >> _BIN_ID_BITS
            counts[bin_id] += 1
        else:
            bin_id, remaining = len(counts), capacity
            counts.append(1)
        bin_of[i] = bin_id
        remaining -= length
        if remaining and counts[bin_id] < segment_cap:
            bisect.insort(open_keys, (remaining << _BIN_ID_BITS) | bin_id)

    by_bin = np.argsort(bin_of, kind="stable")  # placement order kept within each bin
    return np.split(order[by_bin], np.cumsum(counts)[:-1]) if counts else []


def pad_packs(ids: list[np.ndarray], labels: list[np.ndarray], bins: list[np.ndarray],
              sources: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int
              ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], np.ndarray, int]:
    """Every pack filled to ``seq_len`` with one more segment of ``pad_id`` (labels
    ``IGNORE_INDEX``, source ``NO_SOURCE``), as pretraining pads its last block; also the pad
    tokens added. The first four are ``build_packed_rows``'s arguments.

    >>> ids, labels, bins, sources, n = pad_packs([np.array([5, 6])], [np.array([-100, 6])],
    ...                                           [np.array([0])], np.array([3]), np.array([2]),
    ...                                           4, 0)
    >>> [b.tolist() for b in bins], ids[1].tolist(), labels[1].tolist(), sources.tolist(), n
    ([[0, 1]], [0, 0], [-100, -100], [3, -1], 2)
    """
    rooms = [seq_len - int(lengths[b].sum()) for b in bins]
    padded = [np.append(b, len(ids) + k) if room else b
              for k, (b, room) in enumerate(zip(bins, rooms, strict=True))]
    ids = ids + [np.full(room, pad_id, np.int32) for room in rooms]
    labels = labels + [np.full(room, IGNORE_INDEX, np.int32) for room in rooms]
    sources = np.concatenate([sources, np.full(len(rooms), NO_SOURCE, np.int32)])
    return ids, labels, padded, sources, sum(rooms)


def build_packed_rows(
    input_ids: Sequence[np.ndarray], labels: Sequence[np.ndarray], bins: list[np.ndarray],
    sources: Sequence[int] | np.ndarray,
) -> pa.Table:
    """The ``SFT_SCHEMA`` table with one padding-free row per bin.

    Segments are concatenated in bin order. ``labels`` keep the caller's values (-100 = no loss)
    except that each segment's first token is forced to -100, so no segment is trained to predict
    the start of the next. ``position_ids`` restart at 0 per segment, which is how flash-attention
    finds the boundaries; ``seq_lengths`` lists the segment lengths for TRL-style collators, and
    ``sources`` each segment's input index (``sources`` holds one per item).

    >>> ids = [np.array([5, 6, 7]), np.array([8, 9])]
    >>> labels = [np.array([-100, 6, 7]), np.array([8, 9])]
    >>> build_packed_rows(ids, labels, [np.array([0, 1])], [0, 1]).to_pylist()
    [{'input_ids': [5, 6, 7, 8, 9], 'labels': [-100, 6, 7, -100, 9], \
'position_ids': [0, 1, 2, 0, 1], 'seq_lengths': [3, 2], 'sources': [0, 1]}]
    """
    if len(input_ids) != len(labels):
        raise ValueError(f"{len(input_ids)} input_ids but {len(labels)} labels")
    lengths, label_lengths = _lengths(input_ids), _lengths(labels)
    if not np.array_equal(lengths, label_lengths):
        bad = int(np.argmax(lengths != label_lengths))
        raise ValueError(f"item {bad}: {lengths[bad]} input_ids but {label_lengths[bad]} labels")
    item_sources = _piece_sources(sources, len(input_ids))

    bin_sizes = _lengths(bins)
    order = np.concatenate(bins).astype(np.int64) if bins else np.empty(0, np.int64)
    if order.size and (order.min() < 0 or order.max() >= len(input_ids)):
        raise ValueError(f"bins refer to items outside 0..{len(input_ids) - 1}")

    seg_lengths = lengths[order]
    seg_offsets = _offsets(seg_lengths)
    picks = order.tolist()
    flat_ids = _concat_int32([input_ids[i] for i in picks], "input_ids")
    flat_labels = _concat_int32([labels[i] for i in picks], "labels")  # a fresh copy
    seg_starts = seg_offsets[:-1]
    flat_labels[seg_starts[seg_lengths > 0]] = IGNORE_INDEX
    position_ids = np.arange(seg_offsets[-1], dtype=np.int64) - np.repeat(seg_starts, seg_lengths)
    row_offsets = seg_offsets[_offsets(bin_sizes)]
    return pa.Table.from_arrays(
        [
            _list_array(flat_ids, row_offsets),
            _list_array(flat_labels, row_offsets),
            _list_array(position_ids.astype(np.int32), row_offsets),
            _list_array(seg_lengths.astype(np.int32), _offsets(bin_sizes)),
            _list_array(item_sources[order], _offsets(bin_sizes)),
        ],
        schema=SFT_SCHEMA,
    )


def packing_efficiency(real_tokens: int, n_packs: int, capacity: int) -> float | None:
    """Real tokens / (packs x capacity): the share of packed compute that is not padding.

    Zero packs have no efficiency: None (``null`` in the manifest).

    >>> packing_efficiency(3000, 2, 2048)
    0.732421875
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if real_tokens < 0 or n_packs < 0:
        raise ValueError(f"counts must be >= 0, got real_tokens={real_tokens}, n_packs={n_packs}")
    if real_tokens > n_packs * capacity:
        raise ValueError(f"{real_tokens} tokens cannot fit in {n_packs} packs of {capacity}")
    return real_tokens / (n_packs * capacity) if n_packs else None
