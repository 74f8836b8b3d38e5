"""Tests for transforms.core.packing: hand-computed cases, determinism, efficiency and
invariants."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.core import packing
from transforms.core.packing import (
    NO_SOURCE,
    PRETRAIN_SCHEMA,
    SFT_SCHEMA,
    Blocks,
    blocks_to_table,
    build_packed_rows,
    concat_blocks,
    cut_blocks,
    join_documents,
    join_streams,
    pack_best_fit_decreasing,
    packing_efficiency,
    pad_packs,
)
from transforms.core.vocabulary import (
    IGNORE_INDEX,
)

SETTINGS = settings(max_examples=150, deadline=None)


def arrays(*docs: list[int]) -> list[np.ndarray]:
    return [np.array(d, dtype=np.int32) for d in docs]


def as_lists(bins: list[np.ndarray]) -> list[list[int]]:
    return [b.tolist() for b in bins]


def reference_bfd(lengths: list[int], capacity: int, max_segments: int | None) -> list[list[int]]:
    """Straightforward O(n^2) best-fit decreasing, the specification the fast version must match."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        fits = [
            b
            for b in range(len(bins))
            if room[b] >= lengths[i] and (max_segments is None or len(bins[b]) < max_segments)
        ]
        if fits:
            b = min(fits, key=lambda b: (room[b], b))
            bins[b].append(i)
            room[b] -= lengths[i]
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def test_doctests() -> None:
    result = doctest.testmod(packing, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 6
    assert result.failed == 0


# ---------------------------------------------------------------- concat_blocks, by hand


def test_blocks_document_continues_into_next_block() -> None:
    # stream: 1 2 3 <0> 4 5 <0>  -> [1 2 3] [0 4 5] and one token (the last separator) left
    b = concat_blocks(arrays([1, 2, 3], [4, 5]), block_size=3, separator_id=0)
    assert b.input_ids.dtype == np.int32
    assert b.input_ids.tolist() == [[1, 2, 3], [0, 4, 5]]
    assert [s.tolist() for s in b.seq_lengths] == [[3], [1, 2]]
    assert all(s.dtype == np.int32 for s in b.seq_lengths)
    assert (b.tokens_in, b.tokens_out, b.remainder_tokens, b.pad_tokens) == (7, 6, 1, 0)


def test_blocks_pad_fills_last_block_as_its_own_piece() -> None:
    b = concat_blocks(arrays([1, 2, 3], [4, 5]), 3, 0, remainder="pad", pad_id=9)
    assert b.input_ids.tolist() == [[1, 2, 3], [0, 4, 5], [0, 9, 9]]
    assert [s.tolist() for s in b.seq_lengths] == [[3], [1, 2], [1, 2]]
    assert (b.tokens_in, b.tokens_out, b.remainder_tokens, b.pad_tokens) == (7, 9, 0, 2)


def test_blocks_three_documents_block_four() -> None:
    # stream: 1 2 3 0 | 4 5 0 6 | 0
    docs = arrays([1, 2, 3], [4, 5], [6])
    b = concat_blocks(docs, 4, 0)
    assert b.input_ids.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6]]
    assert [s.tolist() for s in b.seq_lengths] == [[4], [3, 1]]
    assert (b.tokens_in, b.tokens_out, b.remainder_tokens, b.pad_tokens) == (9, 8, 1, 0)
    p = concat_blocks(docs, 4, 0, remainder="pad", pad_id=7)
    assert p.input_ids.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [0, 7, 7, 7]]
    assert [s.tolist() for s in p.seq_lengths] == [[4], [3, 1], [1, 3]]
    assert (p.tokens_in, p.tokens_out, p.remainder_tokens, p.pad_tokens) == (9, 12, 0, 3)


def test_blocks_exact_fit_has_no_remainder_and_no_padding() -> None:
    for remainder in ("drop", "pad"):
        b = concat_blocks(arrays([1, 2], [3]), 5, 0, remainder=remainder, pad_id=-1)
        assert b.input_ids.tolist() == [[1, 2, 0, 3, 0]]
        assert [s.tolist() for s in b.seq_lengths] == [[3, 2]]
        assert (b.remainder_tokens, b.pad_tokens) == (0, 0)


def test_blocks_long_document_spans_blocks() -> None:
    b = concat_blocks(arrays(list(range(1, 8))), 3, 0)  # 1..7 then 0: 8 tokens
    assert b.input_ids.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert [s.tolist() for s in b.seq_lengths] == [[3], [3]]
    assert b.remainder_tokens == 2


def test_blocks_empty_input_and_empty_document() -> None:
    for remainder in ("drop", "pad"):
        b = concat_blocks([], 4, 0, remainder=remainder, pad_id=1)
        assert b.input_ids.shape == (0, 4) and b.input_ids.dtype == np.int32
        assert b.seq_lengths == []
        assert (b.tokens_in, b.tokens_out, b.remainder_tokens, b.pad_tokens) == (0, 0, 0, 0)
    # An empty document still contributes its separator.
    b = concat_blocks(arrays([], [5]), 3, 0)
    assert b.input_ids.tolist() == [[0, 5, 0]]
    assert [s.tolist() for s in b.seq_lengths] == [[1, 2]]


def test_blocks_accept_wider_ints_but_refuse_lossy_values() -> None:
    b = concat_blocks([np.array([151643, 7], dtype=np.int64)], 3, 0)
    assert b.input_ids.dtype == np.int32 and b.input_ids.tolist() == [[151643, 7, 0]]
    with pytest.raises(ValueError, match="int32 range"):
        concat_blocks([np.array([2**31], dtype=np.int64)], 2, 0)
    with pytest.raises(ValueError, match="integers"):
        concat_blocks([np.array([1.5])], 2, 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_size": 0}, "block_size"),
        ({"remainder": "keep"}, "remainder"),
        ({"remainder": "pad"}, "pad_id"),
        ({"separator_id": 2**31}, "separator_id"),
        ({"token_arrays": [np.array([[1, 2]])]}, "1-D"),
    ],
)
def test_blocks_reject_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"token_arrays": arrays([1, 2]), "block_size": 2, "separator_id": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        concat_blocks(**args)


def test_non_int_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="block_size"):
        concat_blocks(arrays([1]), 2.0, 0)
    with pytest.raises(TypeError, match="pad_id"):
        concat_blocks(arrays([1]), 2, 0, remainder="pad", pad_id="0")
    with pytest.raises(TypeError, match="capacity"):
        pack_best_fit_decreasing(np.array([1]), True)


def test_blocks_to_table() -> None:
    table = blocks_to_table(concat_blocks(arrays([1, 2, 3], [4, 5]), 3, 0, sources=[4, 7]))
    assert table.schema == PRETRAIN_SCHEMA
    assert table.to_pydict() == {"input_ids": [[1, 2, 3], [0, 4, 5]],
                                 "seq_lengths": [[3], [1, 2]], "sources": [[4], [4, 7]]}
    empty = blocks_to_table(concat_blocks([], 3, 0))
    assert empty.schema == PRETRAIN_SCHEMA and empty.num_rows == 0


def test_sources_follow_pieces_across_block_edges_and_padding() -> None:
    """A document cut at a block edge gives both pieces its input; the pad run has none."""
    b = concat_blocks(arrays([1, 2, 3, 4], [5]), 3, 0, remainder="pad", pad_id=9, sources=[2, 5])
    assert [s.tolist() for s in b.seq_lengths] == [[3], [2, 1], [1, 2]]
    assert [s.tolist() for s in b.sources] == [[2], [2, 5], [5, NO_SOURCE]]


def test_sources_must_match_the_documents() -> None:
    with pytest.raises(ValueError, match="2 sources for 1 items"):
        join_documents(arrays([1]), 0, sources=[0, 1])
    with pytest.raises(ValueError, match="int32 range"):
        join_documents(arrays([1]), 0, sources=[2**31])
    stream = join_documents(arrays([1]), 0)
    assert stream.piece_sources.tolist() == [NO_SOURCE]


# ---------------------------------------------------------------- concat_blocks, properties

docs_strategy = st.lists(st.lists(st.integers(1, 2**31 - 1), max_size=12), max_size=12)


def token_sources(lengths: list[np.ndarray], sources: list[np.ndarray]) -> list[int]:
    """Each token's input, read off the pieces' lengths and sources."""
    return [int(s) for ls, ss in zip(lengths, sources, strict=True)
            for s in np.repeat(ss, ls)]


def reference_sources(docs: list[list[int]], sources: list[int]) -> list[int]:
    """Each token's input in the joined stream: its document's, separator included."""
    return [source for doc, source in zip(docs, sources, strict=True) for _ in range(len(doc) + 1)]


def blocks_token_sources(b: Blocks) -> list[int]:
    assert [len(s) for s in b.sources] == [len(s) for s in b.seq_lengths]
    return token_sources(b.seq_lengths, b.sources)


@SETTINGS
@given(docs=docs_strategy, block_size=st.integers(1, 9), remainder=st.sampled_from(["drop", "pad"]))
def test_blocks_conserve_tokens(docs: list[list[int]], block_size: int, remainder: str) -> None:
    sep, pad = 0, -1
    b = concat_blocks(arrays(*docs), block_size, sep, remainder=remainder, pad_id=pad)
    joined = [t for d in docs for t in [*d, sep]]
    flat = b.input_ids.reshape(-1).tolist()
    assert b.input_ids.shape == (len(flat) // block_size, block_size)
    assert b.tokens_in == len(joined)
    assert b.tokens_out == len(flat) == b.tokens_in - b.remainder_tokens + b.pad_tokens
    if remainder == "drop":
        assert b.pad_tokens == 0 and 0 <= b.remainder_tokens < block_size
        assert flat == joined[: len(flat)]
    else:
        assert b.remainder_tokens == 0 and 0 <= b.pad_tokens < block_size
        assert flat == joined + [pad] * b.pad_tokens
    assert len(b.seq_lengths) == len(b.input_ids)
    assert all(s.sum() == block_size and (s > 0).all() for s in b.seq_lengths)
    table = blocks_to_table(b)
    assert table.column("input_ids").to_pylist() == b.input_ids.tolist()
    assert table.column("seq_lengths").to_pylist() == [s.tolist() for s in b.seq_lengths]
    assert table.column("sources").to_pylist() == [s.tolist() for s in b.sources]


@SETTINGS
@given(docs=docs_strategy, block_size=st.integers(1, 9), remainder=st.sampled_from(["drop", "pad"]),
       seed=st.integers(0, 2**32 - 1))
def test_blocks_sources_give_every_token_its_document_input(
    docs: list[list[int]], block_size: int, remainder: str, seed: int
) -> None:
    sources = np.random.default_rng(seed).integers(0, 4, len(docs)).tolist()
    b = concat_blocks(arrays(*docs), block_size, 0, remainder=remainder, pad_id=-1,
                      sources=sources)
    expected = reference_sources(docs, sources) + [NO_SOURCE] * b.pad_tokens
    assert blocks_token_sources(b) == expected[: b.tokens_out]


@SETTINGS
@given(chunks=st.lists(docs_strategy, min_size=1, max_size=4), block_size=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_carried_tails_keep_their_sources_when_joined(
    chunks: list[list[list[int]]], block_size: int, seed: int
) -> None:
    """Each chunk's full blocks, then its tail joined with the other chunks' tails (as the
    knowledge branch does): every token keeps its document's input."""
    rng = np.random.default_rng(seed)
    heads, tails, expected_heads, expected_tails = [], [], [], []
    for docs in chunks:
        sources = rng.integers(0, 4, len(docs)).tolist()
        b = cut_blocks(join_documents(arrays(*docs), 0, sources), block_size, "carry")
        heads.append(b)
        tails.append(b.tail)
        reference = reference_sources(docs, sources)
        expected_heads += reference[: b.tokens_out]
        expected_tails += reference[b.tokens_out:]
        assert b.tail.piece_lengths.sum() == len(b.tail.tokens)
        assert len(b.tail.piece_sources) == len(b.tail.piece_lengths)
    last = cut_blocks(join_streams(tails), block_size, "pad", pad_id=-1)
    found = [t for b in [*heads, last] for t in blocks_token_sources(b)]
    assert found == expected_heads + expected_tails + [NO_SOURCE] * last.pad_tokens


@SETTINGS
@given(docs=docs_strategy, block_size=st.integers(1, 9), remainder=st.sampled_from(["drop", "pad"]))
def test_blocks_seq_lengths_mark_document_ends(
    docs: list[list[int]], block_size: int, remainder: str
) -> None:
    """Piece edges are exactly the document ends and block edges within the output."""
    b = concat_blocks(arrays(*docs), block_size, 0, remainder=remainder, pad_id=-1)
    doc_ends = np.cumsum([0, *(len(d) + 1 for d in docs)])
    expected = set(doc_ends[doc_ends <= b.tokens_out].tolist())
    expected |= set(range(0, b.tokens_out + 1, block_size))
    pieces = [p for s in b.seq_lengths for p in s.tolist()]
    assert np.cumsum([0, *pieces]).tolist() == sorted(expected)


# ---------------------------------------------------------------- best-fit decreasing


def test_bfd_textbook_example() -> None:
    # capacity 10, items 2 5 4 7 1 3 8 -> sorted 8 7 5 4 3 2 1 -> {8,2} {7,3} {5,4,1}
    bins = pack_best_fit_decreasing(np.array([2, 5, 4, 7, 1, 3, 8]), 10)
    assert as_lists(bins) == [[6, 0], [3, 5], [1, 2, 4]]
    assert all(b.dtype in (np.int64, np.intp) for b in bins)


def test_bfd_prefers_tightest_bin_over_first() -> None:
    # 7 -> bin0 (room 3), 5 -> bin1 (room 5), 4 -> bin1 (room 1); the 1 goes to bin1 (room 1),
    # not to bin0 (room 3) as first-fit would.
    assert as_lists(pack_best_fit_decreasing(np.array([5, 7, 4, 1]), 10)) == [[1], [0, 2, 3]]


def test_bfd_ties() -> None:
    # equal lengths are placed by index; equal room goes to the lowest bin
    assert as_lists(pack_best_fit_decreasing(np.array([4, 4, 4, 4]), 8)) == [[0, 1], [2, 3]]
    assert as_lists(pack_best_fit_decreasing(np.array([6, 6, 2]), 8)) == [[0, 2], [1]]
    assert as_lists(pack_best_fit_decreasing(np.array([2, 6, 6]), 8)) == [[1, 0], [2]]


def test_bfd_max_segments() -> None:
    lengths = np.array([1, 1, 1, 1, 1])
    assert as_lists(pack_best_fit_decreasing(lengths, 100, max_segments=2)) == [
        [0, 1],
        [2, 3],
        [4],
    ]
    assert as_lists(pack_best_fit_decreasing(lengths, 100, max_segments=1)) == [
        [i] for i in range(5)
    ]


def test_bfd_empty_and_exact() -> None:
    assert pack_best_fit_decreasing(np.array([], dtype=np.int32), 8) == []
    assert as_lists(pack_best_fit_decreasing(np.array([8, 8]), 8)) == [[0], [1]]


@pytest.mark.parametrize(
    ("lengths", "capacity", "max_segments", "match"),
    [
        ([3, 9], 8, None, "item 1 has length 9 > capacity 8"),
        ([3, 0], 8, None, "item 1 has length 0"),
        ([3, -2], 8, None, "item 1 has length -2"),
        ([3], 0, None, "capacity"),
        ([3], 8, 0, "max_segments"),
        ([[3]], 8, None, "1-D"),
        ([1.5], 8, None, "integer"),
    ],
)
def test_bfd_rejects_bad_arguments(lengths, capacity, max_segments, match) -> None:
    with pytest.raises(ValueError, match=match):
        pack_best_fit_decreasing(np.array(lengths), capacity, max_segments)


def test_bfd_is_deterministic_and_dtype_independent() -> None:
    lengths = np.random.default_rng(7).integers(1, 300, size=3000)
    first = as_lists(pack_best_fit_decreasing(lengths, 512))
    assert as_lists(pack_best_fit_decreasing(lengths.copy(), 512)) == first
    assert as_lists(pack_best_fit_decreasing(lengths.astype(np.int32), 512)) == first
    assert as_lists(pack_best_fit_decreasing(lengths.tolist(), 512)) == first


def test_bfd_permuting_equal_items_permutes_indices_only() -> None:
    """Equal lengths are indistinguishable, so swapping their positions keeps the bins' shapes,
    and each bin still lists equal items in ascending index order."""
    lengths = np.random.default_rng(3).choice([100, 200, 300, 700], size=400)
    perm = np.random.default_rng(4).permutation(len(lengths))
    bins = pack_best_fit_decreasing(lengths, 1024)
    permuted = pack_best_fit_decreasing(lengths[perm], 1024)
    assert [lengths[b].tolist() for b in bins] == [lengths[perm][b].tolist() for b in permuted]
    for b in permuted:
        for value in np.unique(lengths[perm][b]):
            same = b[lengths[perm][b] == value]
            assert (np.diff(same) > 0).all()


def test_bfd_efficiency_on_realistic_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(mean=math.log(300), sigma=0.9, size=2000), 16, 2048)
    lengths = lengths.astype(np.int64)
    bins = pack_best_fit_decreasing(lengths, 2048)
    real = int(lengths.sum())
    lower_bound = math.ceil(real / 2048)
    efficiency = packing_efficiency(real, len(bins), 2048)
    # observed: median 290, 415 packs = the lower bound ceil(848708 / 2048), efficiency 0.9986
    assert efficiency > 0.99
    assert lower_bound <= len(bins) <= lower_bound + 1
    assert all(lengths[b].sum() <= 2048 for b in bins)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 64), max_size=60),
    capacity=st.integers(64, 160),
    max_segments=st.one_of(st.none(), st.integers(1, 6)),
)
def test_bfd_invariants_and_reference(lengths: list[int], capacity: int, max_segments) -> None:
    bins = pack_best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity, max_segments)
    flat = np.concatenate(bins).tolist() if bins else []
    assert sorted(flat) == list(range(len(lengths)))  # each index exactly once, none split
    arr = np.array(lengths, dtype=np.int64)
    for b in bins:
        assert len(b) >= 1 and arr[b].sum() <= capacity
        assert max_segments is None or len(b) <= max_segments
    assert as_lists(bins) == reference_bfd(lengths, capacity, max_segments)


# ---------------------------------------------------------------- packed SFT rows


def test_build_packed_rows_by_hand() -> None:
    ids = arrays([5, 6, 7], [8, 9], [10, 11, 12, 13])
    labels = arrays([-100, 6, 7], [8, 9], [-100, -100, 12, 13])
    table = build_packed_rows(ids, labels, [np.array([2, 0]), np.array([1])], [3, 0, 1])
    assert table.schema == SFT_SCHEMA
    assert table.to_pylist() == [
        {
            "input_ids": [10, 11, 12, 13, 5, 6, 7],
            "labels": [-100, -100, 12, 13, -100, 6, 7],
            "position_ids": [0, 1, 2, 3, 0, 1, 2],
            "seq_lengths": [4, 3],
            "sources": [1, 3],
        },
        {"input_ids": [8, 9], "labels": [-100, 9], "position_ids": [0, 1], "seq_lengths": [2],
         "sources": [0]},
    ]
    assert labels[1].tolist() == [8, 9]  # the caller's arrays are not modified


def test_build_packed_rows_empty_and_errors() -> None:
    empty = build_packed_rows([], [], [], [])
    assert empty.schema == SFT_SCHEMA and empty.num_rows == 0
    with pytest.raises(ValueError, match="labels"):
        build_packed_rows(arrays([1, 2]), arrays([1]), [np.array([0])], [0])
    with pytest.raises(ValueError, match="labels"):
        build_packed_rows(arrays([1, 2]), [], [np.array([0])], [0])
    with pytest.raises(ValueError, match="outside"):
        build_packed_rows(arrays([1, 2]), arrays([1, 2]), [np.array([1])], [0])
    with pytest.raises(ValueError, match="outside"):
        build_packed_rows(arrays([1, 2]), arrays([1, 2]), [np.array([-1])], [0])
    with pytest.raises(ValueError, match="sources"):
        build_packed_rows(arrays([1, 2]), arrays([1, 2]), [np.array([0])], [0, 1])


def test_schemas_are_int32_lists() -> None:
    assert PRETRAIN_SCHEMA.names == ["input_ids", "seq_lengths", "sources"]
    assert SFT_SCHEMA.names == ["input_ids", "labels", "position_ids", "seq_lengths", "sources"]
    for field in [*PRETRAIN_SCHEMA, *SFT_SCHEMA]:
        assert field.type == pa.list_(pa.int32())


examples_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, 151_000), st.booleans()), min_size=1, max_size=40),
    max_size=30,
)


@SETTINGS
@given(examples=examples_strategy, capacity=st.integers(40, 120))
def test_packed_rows_roundtrip(examples: list[list[tuple[int, bool]]], capacity: int) -> None:
    ids = [np.array([t for t, _ in ex], dtype=np.int32) for ex in examples]
    labels = [np.array([t if trained else IGNORE_INDEX for t, trained in ex]) for ex in examples]
    sources = np.arange(len(ids), dtype=np.int32) % 3
    bins = pack_best_fit_decreasing(np.array([len(x) for x in ids], dtype=np.int64), capacity)
    table = build_packed_rows(ids, labels, bins, sources)
    assert table.num_rows == len(bins)
    rows = table.to_pylist()
    for b, row in zip(bins, rows, strict=True):
        assert len(row["input_ids"]) <= capacity
        assert row["seq_lengths"] == [len(ids[i]) for i in b]
        assert row["sources"] == sources[b].tolist()
        n = len(row["input_ids"])
        assert len(row["labels"]) == len(row["position_ids"]) == n == sum(row["seq_lengths"])
        start = 0
        for i, length in zip(b.tolist(), row["seq_lengths"], strict=True):
            seg = slice(start, start + length)
            assert row["input_ids"][seg] == ids[i].tolist()
            assert row["labels"][seg] == [IGNORE_INDEX, *labels[i][1:].tolist()]
            assert row["position_ids"][seg] == list(range(length))
            start += length
    real = sum(len(x) for x in ids)
    assert real == sum(len(r["input_ids"]) for r in rows)
    if bins:
        assert 0 < packing_efficiency(real, len(bins), capacity) <= 1


@SETTINGS
@given(examples=examples_strategy, capacity=st.integers(40, 120))
def test_padded_packs_give_the_padding_no_source(examples: list[list[tuple[int, bool]]],
                                                 capacity: int) -> None:
    ids = [np.array([t for t, _ in ex], dtype=np.int32) for ex in examples]
    labels = [np.array([t if trained else IGNORE_INDEX for t, trained in ex]) for ex in examples]
    sources = np.arange(len(ids), dtype=np.int32) % 3
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    bins = pack_best_fit_decreasing(lengths, capacity)
    table = build_packed_rows(*pad_packs(ids, labels, bins, sources, lengths, capacity, 0)[:4])
    for b, row in zip(bins, table.to_pylist(), strict=True):
        room = capacity - int(lengths[b].sum())
        assert len(row["input_ids"]) == capacity
        assert row["sources"] == sources[b].tolist() + [NO_SOURCE] * bool(room)
        assert row["seq_lengths"][-1] == (room or lengths[b[-1]])


# ---------------------------------------------------------------- efficiency


def test_packing_efficiency() -> None:
    assert packing_efficiency(4096, 2, 2048) == 1.0
    assert packing_efficiency(3000, 2, 2048) == pytest.approx(3000 / 4096)
    assert packing_efficiency(0, 0, 2048) is None
    with pytest.raises(ValueError, match="cannot fit"):
        packing_efficiency(5000, 2, 2048)
    with pytest.raises(ValueError, match="capacity"):
        packing_efficiency(1, 1, 0)
    with pytest.raises(ValueError, match=">= 0"):
        packing_efficiency(-1, 1, 8)
