"""Boilerplate across documents: paragraphs (and optionally lines) that many documents share.

Cookie notices, navigation, licence footers: the same paragraph in thousands of pages teaches
a model nothing after the first, and document deduplication cannot see it, since the pages
differ. CCNet (Wenzek et al., 2019) removes such paragraphs by hash; here a paragraph stays in
the first document that holds it, by the run's order (input, file, position), and leaves all
the others.

Pass one hashes each kept document's *units* (``units.unit_hashes``): its paragraphs of at least
``min_chars`` characters, and with ``lines`` the long lines of its paragraphs of several
lines. Each chunk sends one packed row per distinct unit: how many of its documents hold it
and the first of them (``chunk_rows``), so a unit in every document costs one row per chunk,
not per document. ``FindBoilerplate`` groups the rows by bucket of the unit's hash, adds up
each unit's documents and, for each unit held by ``min_documents`` or more, tells every chunk
that holds it which document keeps it. The main pass takes the units out of every other
document (``remove_units``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator

import apache_beam as beam
import numpy as np

from transforms.knowledge.dedup.config import BoilerplateConfig
from transforms.knowledge.dedup.minhash import RecordKey
from transforms.knowledge.dedup.units import split_paragraphs, unit_hash

# One row per distinct unit of a chunk: its hash, how many of the chunk's documents hold it,
# the first of them (record key) and the chunk's number.
_UNIT_ROW = np.dtype([("unit", "<u8"), ("documents", "<i8"), ("key", "<i8", (3,)),
                      ("chunk", "<i8")])
# What the main pass learns for a chunk: (unit hash, the document that keeps it).
Keeper = tuple[int, RecordKey]


@dataclasses.dataclass(frozen=True)
class Removal:
    """A document's text after its boilerplate units were taken out, and how many were."""

    text: str
    paragraphs: int = 0
    lines: int = 0


def remove_units(text: str, config: BoilerplateConfig,
                 removable: Callable[[int], bool]) -> Removal:
    """The text without its units whose hash is ``removable``: a paragraph goes with the break
    before it (after it, for the first), a line with its line break."""
    paragraphs, breaks = split_paragraphs(text)
    kept: list[str] = []
    removed_paragraphs = removed_lines = 0
    for number, paragraph in enumerate(paragraphs):
        found = unit_hash(paragraph, config.min_chars)
        if found is not None and removable(found):
            removed_paragraphs += 1
            continue
        left = paragraph
        if config.lines and "\n" in paragraph:
            lines = paragraph.split("\n")
            kept_lines = [line for line in lines
                          if (found := unit_hash(line, config.min_chars)) is None
                          or not removable(found)]
            removed_lines += len(lines) - len(kept_lines)
            left = "\n".join(kept_lines)
            if not kept_lines:
                continue
        if kept:
            kept.append(breaks[number - 1])
        kept.append(left)
    if not removed_paragraphs and not removed_lines:
        return Removal(text)
    return Removal("".join(kept), removed_paragraphs, removed_lines)


def chunk_rows(documents: Iterable[tuple[RecordKey, set[int]]], chunk: int) -> bytes:
    """A chunk's units as packed ``_UNIT_ROW`` rows: one per distinct unit, with the number of
    documents that hold it and the smallest of their keys."""
    counts: collections.Counter[int] = collections.Counter()
    first: dict[int, RecordKey] = {}
    for key, units in documents:
        counts.update(units)
        for unit in units:
            if unit not in first or key < first[unit]:
                first[unit] = key
    rows = np.empty(len(counts), dtype=_UNIT_ROW)
    rows["unit"] = np.fromiter(counts, np.uint64, len(counts))
    rows["documents"] = np.fromiter(counts.values(), np.int64, len(counts))
    rows["key"] = np.array([first[unit] for unit in counts], dtype=np.int64).reshape(-1, 3)
    rows["chunk"] = chunk
    return rows.tobytes()


def rows_by_bucket(packed: bytes, buckets: int) -> Iterator[tuple[int, bytes]]:
    """(bucket, rows) for each bucket of the unit hash that a chunk's rows fall in."""
    rows = np.frombuffer(packed, _UNIT_ROW)
    bucket = rows["unit"] % np.uint64(buckets)
    for number in np.unique(bucket).tolist():
        yield number, rows[bucket == number].tobytes()


def keepers_in_bucket(bucket: tuple[int, Iterable[bytes]], min_documents: int
                      ) -> Iterator[tuple[int, list[Keeper]]]:
    """For each chunk that holds a unit of the bucket that ``min_documents`` or more documents
    hold: (chunk, [(unit, the document that keeps it), ...]). In numpy: the rows are sorted by
    unit, then key, so each unit's first row names its first document."""
    _, blobs = bucket
    rows = np.concatenate([np.frombuffer(blob, _UNIT_ROW) for blob in blobs])
    key = rows["key"]
    rows = rows[np.lexsort((key[:, 2], key[:, 1], key[:, 0], rows["unit"]))]
    unit = rows["unit"]
    starts = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    sizes = np.diff(np.r_[starts, len(rows)])
    documents = np.repeat(np.add.reduceat(rows["documents"], starts), sizes)
    keepers = np.repeat(rows["key"][starts], sizes, axis=0)
    shared = documents >= min_documents
    rows, keepers = rows[shared], keepers[shared]
    by_chunk = np.argsort(rows["chunk"], kind="stable")
    chunks = rows["chunk"][by_chunk]
    for part in np.split(by_chunk, np.flatnonzero(chunks[1:] != chunks[:-1]) + 1):
        if len(part):
            yield int(rows["chunk"][part[0]]), list(zip(
                rows["unit"][part].tolist(), map(tuple, keepers[part].tolist()), strict=True))


class FindBoilerplate(beam.PTransform):
    """Packed unit rows (one blob per chunk) in; (chunk, [``Keeper``, ...]) out for every chunk
    that holds boilerplate. One shuffle of rows batched per chunk and bucket (a bucket holds
    the rows of ``buckets``' share of the units, and a unit in every document one row per
    chunk); no side input."""

    def __init__(self, min_documents: int, buckets: int = 1):
        super().__init__()
        self.min_documents = min_documents
        self.buckets = buckets

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        return (rows
                | "ByBucket" >> beam.FlatMap(rows_by_bucket, self.buckets)
                | "GroupByBucket" >> beam.GroupByKey()
                | "Keepers" >> beam.FlatMap(keepers_in_bucket, self.min_documents))

