"""Deduplication's configuration (the ``--dedup*`` options), apart from the steps: the MinHash
keys and the label propagation both read it."""

from __future__ import annotations

import dataclasses

MODES = ("none", "exact", "near")
# Rounds of label propagation (--dedup_rounds): a cluster's labels are final after as many
# rounds as the longest shortest path from a member to its smallest one, and one more round
# confirms it. Exact groups and LSH buckets are stars around their smallest member (one hop);
# paths grow only where near copies chain through different bands.
MAX_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    """``mode``: ``near`` finds exact and near copies, ``exact`` exact copies only, ``none``
    turns deduplication off. Near copies are documents whose word ``ngram`` shingle sets have
    an estimated Jaccard similarity >= ``threshold`` under ``num_perm`` MinHash functions, found
    through ``bands`` LSH bands of ``num_perm / bands`` rows each; their clusters are resolved
    in at most ``rounds`` rounds of label propagation."""

    mode: str = "near"
    ngram: int = 5
    num_perm: int = 128
    bands: int = 16
    threshold: float = 0.8
    rounds: int = MAX_ROUNDS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"dedup mode must be one of {MODES}, got {self.mode!r}")
        if self.num_perm % self.bands:
            raise ValueError(f"--dedup_num_perm={self.num_perm} must be a multiple of "
                             f"--dedup_bands={self.bands} (each band takes the same rows)")

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @property
    def near(self) -> bool:
        return self.mode == "near"


@dataclasses.dataclass(frozen=True)
class BoilerplateConfig:
    """Boilerplate across documents: a paragraph of at least ``min_chars`` characters (spacing
    collapsed) that ``min_documents`` or more documents hold stays only in the first of them
    by the run's order and is removed from the others; with ``lines``, each line of at least
    ``min_chars`` inside a paragraph of several lines counts too. A document left with fewer
    words than the quality rules' ``--min_words`` is filtered."""

    min_chars: int = 100
    min_documents: int = 3
    lines: bool = False

    def __post_init__(self) -> None:
        if self.min_documents < 2:
            raise ValueError(f"--boilerplate_min_documents={self.min_documents} must be at "
                             "least 2: a paragraph in one document is no boilerplate")
