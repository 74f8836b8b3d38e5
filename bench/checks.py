"""Proof that every measured approach produced the right output, before any speed is reported.

A fast wrong answer is worth nothing, so each check compares token counts (and, where the
outputs are at hand, the multiset of token ids) with an independent reference and raises
``CheckFailed`` naming the difference.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from transforms.core.tokenizer import load_tokenizer

IGNORE_INDEX = -100


class CheckFailed(AssertionError):
    """An output is wrong: no speed of that run may be reported."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def expect_equal(what: str, got: object, want: object) -> None:
    expect(got == want, f"{what}: got {got!r}, expected {want!r}")


def _histogram(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(ids.astype(np.int64), minlength=vocab_size)


def _column_values(table, column: str) -> np.ndarray:
    return pc.list_flatten(table[column]).to_numpy()


def _dropped(output: str) -> list[dict]:
    """Records the run left out (filtered/ and rejected/), with source and position."""
    rows = []
    for kind in ("filtered", "rejected"):
        for path in sorted(glob.glob(os.path.join(output, kind, "*.jsonl"))):
            with open(path, encoding="utf-8") as f:
                rows.extend(json.loads(line) for line in f)
    return rows


def balanced(manifest: Mapping, records: int, what: str) -> None:
    """Every record read and accounted for."""
    counts = manifest["records"]
    expect_equal(f"{what}: records read", counts["read"], records)
    expect(counts["balanced"], f"{what}: manifest records do not balance: {counts}")


def knowledge_run(output: str, manifest: Mapping, files: Sequence[str], documents: int,
                  ceiling_lengths: np.ndarray, ceiling_histogram: np.ndarray,
                  separator_id: int, what: str) -> None:
    """Ours against the ceiling: same documents, same tokens, one separator each, all in blocks.

    Documents the branch dropped (quality filters, deduplication) are found in filtered/ and
    rejected/ and taken out of the ceiling's counts; a document whose text the branch changed
    shows as a token count that differs, which fails.
    """
    balanced(manifest, documents, what)
    k = manifest["knowledge"]
    expect_equal(f"{what}: remainder policy", k["remainder_policy"], "drop")
    first_doc = dict(zip(map(os.path.abspath, files),
                         np.concatenate([[0], np.cumsum([pq.read_metadata(f).num_rows
                                                         for f in files])[:-1]]), strict=True))
    dropped = _dropped(output)
    dropped_index = sorted(int(first_doc[os.path.abspath(r["source"])] + r["position"])
                           for r in dropped)
    kept = np.ones(len(ceiling_lengths), dtype=bool)
    kept[dropped_index] = False
    expected_tokens = int(ceiling_lengths[kept].sum())
    expect_equal(f"{what}: documents kept", k["documents"], int(kept.sum()))
    expect_equal(f"{what}: document tokens (ceiling's count over the kept documents)",
                 k["tokens"], expected_tokens)
    expect_equal(f"{what}: separator tokens (one per document)", k["separator_tokens"],
                 k["documents"])
    expect_equal(f"{what}: tokens in blocks + remainder - padding",
                 k["tokens_out"] + k["remainder_tokens"] - k["pad_tokens"],
                 k["tokens"] + k["separator_tokens"])
    expect_equal(f"{what}: tokens out", k["tokens_out"], k["blocks"] * k["block_size"])

    table = ds.dataset(os.path.join(output, "pretrain"), format="parquet").to_table()
    expect_equal(f"{what}: pretrain rows", table.num_rows, k["blocks"])
    lengths = pc.list_value_length(table["input_ids"]).to_numpy()
    expect(bool((lengths == k["block_size"]).all()), f"{what}: a block is not block_size long")
    piece_sums = [sum(row) for row in table["seq_lengths"].to_pylist()]
    expect(all(s == k["block_size"] for s in piece_sums),
           f"{what}: seq_lengths do not sum to block_size in every row")

    # Token for token: the blocks hold the kept documents' ids and separators, less the
    # dropped remainder.
    expected = ceiling_histogram.copy()
    if dropped:
        texts = _texts_at(files, dropped_index)
        ids = load_tokenizer()(texts, split_special_tokens=True)["input_ids"]
        expected -= _histogram(np.concatenate([np.asarray(i) for i in ids]), len(expected))
    expected[separator_id] += k["documents"]
    got = _histogram(_column_values(table, "input_ids"), len(expected))
    missing = expected - got
    expect(bool((missing >= 0).all()),
           f"{what}: blocks hold token ids the documents do not (e.g. id "
           f"{int(np.argmin(missing))}, {-int(missing.min())} too many)")
    expect_equal(f"{what}: tokens missing from the blocks (the dropped remainder)",
                 int(missing.sum()), k["remainder_tokens"])


def _texts_at(files: Sequence[str], indices: Sequence[int]) -> list[str]:
    texts = [t for f in files for t in pq.read_table(f, columns=["text"])["text"].to_pylist()]
    return [texts[i] for i in indices]


def datasets_run(result: Mapping, ceiling_tokens: int, block_size: int) -> None:
    expect_equal("datasets: tokens (the ceiling's count)", result["tokens"], ceiling_tokens)
    expect_equal("datasets: tokens in blocks", result["tokens_in_blocks"],
                 result["blocks"] * block_size)
    expect_equal("datasets: tokens in blocks + dropped batch remainders",
                 result["tokens_in_blocks"] + result["dropped_tokens"], result["tokens"])


def trl_run(result: Mapping, examples: int, seq_len: int) -> None:
    expect_equal("TRL: examples", result["examples"], examples)
    expect_equal("TRL: packed tokens (its unpacked total: nothing truncated)",
                 result["packed_tokens"], result["tokens"])
    expect(result["longest_pack"] <= seq_len, f"TRL: a pack exceeds seq_len {seq_len}")


def instruction_run(output: str, manifest: Mapping, examples: int, trl: Mapping,
                    trl_histogram: np.ndarray, seq_len: int, what: str) -> None:
    """Ours against TRL: same examples, same token ids, same trained tokens, valid packs."""
    balanced(manifest, examples, what)
    i = manifest["instruction"]
    expect_equal(f"{what}: examples kept (nothing filtered or rejected: {_dropped(output)[:3]})",
                 i["examples"], examples)
    expect_equal(f"{what}: tokens (TRL's count)", i["tokens"], trl["tokens"])
    expect_equal(f"{what}: trained tokens (TRL's assistant mask)", i["trained_tokens"],
                 trl["trained_tokens"])
    expect_equal(f"{what}: packing efficiency", i["packing_efficiency"],
                 round(i["tokens"] / (i["packs"] * seq_len), 6))

    table = ds.dataset(os.path.join(output, "sft"), format="parquet").to_table()
    expect_equal(f"{what}: sft rows", table.num_rows, i["packs"])
    lengths = pc.list_value_length(table["input_ids"]).to_numpy()
    expect_equal(f"{what}: tokens in packs", int(lengths.sum()), i["tokens"])
    expect(int(lengths.max()) <= seq_len, f"{what}: a pack exceeds seq_len {seq_len}")
    for column in ("labels", "position_ids"):
        expect(bool((pc.list_value_length(table[column]).to_numpy() == lengths).all()),
               f"{what}: {column} and input_ids differ in length")
    segments = table["seq_lengths"].to_pylist()
    expect(all(sum(s) == n for s, n in zip(segments, lengths, strict=True)),
           f"{what}: seq_lengths do not sum to the row length")
    positions = _column_values(table, "position_ids")
    starts = np.cumsum([0, *(n for s in segments for n in s)])[:-1]
    expect(bool((positions[starts] == 0).all()) and int(np.count_nonzero(positions == 0))
           == len(starts), f"{what}: position_ids do not restart exactly at each segment")
    labels = _column_values(table, "labels")
    # The first token of a segment is never trained; with ChatML it is <|im_start|>, which the
    # assistant mask never covers, so the count is the mask's.
    expect_equal(f"{what}: trained labels in packs", int(np.count_nonzero(labels != IGNORE_INDEX)),
                 i["trained_tokens"])
    got = _histogram(_column_values(table, "input_ids"), len(trl_histogram))
    expect(bool(np.array_equal(got, trl_histogram)),
           f"{what}: token ids differ from TRL's on the same examples "
           f"({int(np.abs(got - trl_histogram).sum())} ids differ)")
