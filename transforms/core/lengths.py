"""Token-length counters: the power-of-two histograms the manifest and the data report show."""

from __future__ import annotations

from collections.abc import Iterable

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
