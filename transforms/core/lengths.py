"""Token counters per --input: the power-of-two length histograms the manifest and the data
report show, the trained tokens that reveal a response mapped onto the wrong column, and the
examples truncated at ``seq_len``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

SOURCE_PREFIX = "source."  # per --input counters: source.<input index>.<branch>.<name>


def length_buckets(lengths: np.ndarray) -> np.ndarray:
    """The power of two at or above each length: the manifest's length histogram.

    >>> length_buckets(np.array([1, 2, 3, 64, 65])).tolist()
    [1, 2, 4, 64, 128]
    """
    _, exponents = np.frexp(np.maximum(lengths - 1, 0))
    return np.left_shift(1, exponents)


def source_length_counts(branch: str, lengths: np.ndarray,
                         input_indices: Iterable[int]) -> dict[str, int]:
    """Per ``--input``: records, tokens and length histogram of one branch's tokenized records,
    so the report can draw each source's distribution (the outputs no longer know sources).

    >>> source_length_counts("knowledge", np.array([3, 5, 100]), [0, 0, 1])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'source.0.knowledge.records': 2, 'source.0.knowledge.tokens': 8,
     'source.0.knowledge.le_4': 1, 'source.0.knowledge.le_8': 1,
     'source.1.knowledge.records': 1, 'source.1.knowledge.tokens': 100,
     'source.1.knowledge.le_128': 1}
    """
    counts: dict[str, int] = {}
    indices = np.fromiter(input_indices, dtype=np.int64, count=len(lengths))
    buckets = length_buckets(lengths)
    for index in np.unique(indices).tolist():
        mine = indices == index
        prefix = f"{SOURCE_PREFIX}{index}.{branch}."
        counts[prefix + "records"] = int(mine.sum())
        counts[prefix + "tokens"] = int(lengths[mine].sum())
        for bound, count in zip(*np.unique(buckets[mine], return_counts=True), strict=True):
            counts[f"{prefix}le_{int(bound)}"] = int(count)
    return counts


SHORT_REPLY_TOKENS = 2  # a one-token answer and its end-of-turn token


def source_example_counts(trained: np.ndarray, tokens_cut: np.ndarray,
                          input_indices: Sequence[int]) -> dict[str, int]:
    """Per ``--input``, the examples' trained tokens and how many train on a reply of at most
    ``SHORT_REPLY_TOKENS`` tokens: what shows a mapping onto the wrong column (a 0/1 label
    mapped as the response trains every example to answer one token); and how many examples
    the overflow policy truncated, with the tokens it cut, so the report can say which source
    loses its long conversations at ``seq_len``.

    >>> source_example_counts(np.array([1, 2, 40]), np.array([0, 5, 0]), [0, 0, 1])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'source.0.instruction.trained_tokens': 3, 'source.0.instruction.short_replies': 2,
     'source.0.instruction.truncated': 1, 'source.0.instruction.truncated_tokens': 5,
     'source.1.instruction.trained_tokens': 40, 'source.1.instruction.short_replies': 0,
     'source.1.instruction.truncated': 0, 'source.1.instruction.truncated_tokens': 0}
    """
    counts: dict[str, int] = {}
    indices = np.asarray(input_indices, dtype=np.int64)
    for index in np.unique(indices).tolist():
        mine = indices == index
        prefix = f"{SOURCE_PREFIX}{index}.instruction."
        counts[prefix + "trained_tokens"] = int(trained[mine].sum())
        counts[prefix + "short_replies"] = int((trained[mine] <= SHORT_REPLY_TOKENS).sum())
        counts[prefix + "truncated"] = int(np.count_nonzero(tokens_cut[mine]))
        counts[prefix + "truncated_tokens"] = int(tokens_cut[mine].sum())
    return counts
