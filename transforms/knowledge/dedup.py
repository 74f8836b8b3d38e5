"""Deduplication across the whole dataset: exact copies and near copies (MinHash + LSH).

Only small keys are shuffled, never the documents (README, "Determinism and memory": on the
DirectRunner a shuffle holds all its data in memory). Pass one turns every kept document into
``DocumentKeys``: its record key, a hash of its normalised text and, for near-duplicate
detection, a MinHash signature and its LSH band keys. ``FindDuplicates`` groups those keys,
verifies candidate pairs by their estimated Jaccard similarity, joins verified pairs into
clusters and returns one dict: the record keys to drop, each with its reason and the key of the
copy that survives. The main pass drops them chunk by chunk, with that dict (in a
``DuplicateIndex``) as a side input.

The surviving copy is always the one with the smallest record key (input index, source,
position), whatever the runner, worker count or bundle boundaries.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np

from transforms.core.records import Record
from transforms.core.vocabulary import (
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
)
from transforms.knowledge.quality import TextStats, ngram_hashes, text_hash
from transforms.knowledge.words import mix

MODES = ("none", "exact", "near")

# (input index, file number, position): orders the copies. Files are numbered in path order, so
# this sorts like (input index, source, position) while every shuffled key stays a few ints.
RecordKey = tuple[int, int, int]
Pair = tuple[RecordKey, RecordKey]

SEED = 0x5EED  # of the MinHash hash: fixed, so signatures agree across runs and workers
_HALF = np.uint64(32)
_EMPTY = 1 << 32  # a bin no shingle reached: above every 32-bit value
# One row per document and band, for the band shuffle: the band key as a number, then the
# document's record key and content hash.
_BAND_ROW = np.dtype([("band", "<u8"), ("key", "<i8", (3,)), ("content", "V16")])


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    """``mode``: ``near`` finds exact and near copies, ``exact`` exact copies only, ``none``
    turns deduplication off. Near copies are documents whose word ``ngram`` shingle sets have
    an estimated Jaccard similarity >= ``threshold`` under ``num_perm`` MinHash functions, found
    through ``bands`` LSH bands of ``num_perm / bands`` rows each."""

    mode: str = "near"
    ngram: int = 5
    num_perm: int = 128
    bands: int = 16
    threshold: float = 0.8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"dedup mode must be one of {MODES}, got {self.mode!r}")
        if self.num_perm % self.bands:
            raise ValueError(f"--dedup_num_perm={self.num_perm} must be a multiple of "
                             f"--dedup_bands={self.bands} (each band takes the same rows)")

    @property
    def near(self) -> bool:
        return self.mode == "near"


@dataclasses.dataclass(frozen=True)
class DocumentKeys:
    """What pass one keeps of a document: under a kilobyte, however long the text is."""

    key: RecordKey
    content: bytes  # hash of the normalised text
    bands: tuple[bytes, ...] = ()  # LSH band keys (near mode)
    signature: bytes = b""  # MinHash signature, little-endian uint32 (near mode)


def record_key(record: Record, file_numbers: Mapping[str, int]) -> RecordKey:
    return (record.input_index, file_numbers[record.source], record.position)


@dataclasses.dataclass(frozen=True)
class DuplicateIndex:
    """The main pass's side input: the records to drop, each with its reason and survivor."""

    files: tuple[str, ...]  # file number -> path, in path order
    drops: Mapping[RecordKey, tuple[str, RecordKey]]

    @classmethod
    def numbering(cls, paths: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(set(paths)))

    @functools.cached_property
    def file_numbers(self) -> dict[str, int]:
        return {path: number for number, path in enumerate(self.files)}

    def verdict(self, record: Record) -> tuple[str, str] | None:
        """(reason, message naming the surviving copy) for a record to drop, else None."""
        found = self.drops.get(record_key(record, self.file_numbers))
        if found is None:
            return None
        reason, (index, number, position) = found
        return reason, (f"copy of the document at position {position} of {self.files[number]} "
                        f"(input {index})")


def content_hash(text: str) -> bytes:
    """128-bit hash of the text: equal normalised texts, equal hashes (``TextStats.digest``)."""
    return text_hash(text)


def _stable_uint64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def shingles(stats: TextStats, n: int) -> np.ndarray:
    """64-bit hashes of the word ``n``-grams of a document (one of all its words if fewer).

    Words are the quality rules' words (``transforms.knowledge.words``: punctuation and spacing
    ignored,
    each Han or kana character a word) by their folded ids (case and apostrophe style do not
    count), which every process computes alike.
    """
    if not stats.word_count:
        return np.empty(0, dtype=np.uint64)
    return ngram_hashes(stats.words.folded_ids, min(n, stats.word_count))


class MinHasher:
    """``num_perm`` MinHash values per document from one hash per shingle: one permutation
    hashing (Li, Owen and Zhang, 2012) with optimal densification (Shrivastava, 2017).

    Each shingle's 64-bit hash picks one of ``num_perm`` bins (its high half) and a value (its
    low half); a bin keeps its smallest value. A bin no shingle reached takes the value of the
    first filled bin along its own fixed probe order, so for every bin the chance that two
    documents agree is their Jaccard similarity, as with ``num_perm`` independent hash
    functions, at the cost of one hash per shingle instead of ``num_perm``. The hash is
    splitmix64's finaliser after a seeded offset, and the probe orders come from the same
    mix, so signatures agree across runs, workers and numpy versions.
    """

    def __init__(self, num_perm: int, seed: int = SEED):
        self.bins = num_perm
        self.offset = np.uint64(_stable_uint64(f"{seed}:offset".encode()))
        keys = mix(np.arange(num_perm * num_perm, dtype=np.uint64) + self.offset)
        self.probes = np.argsort(keys.reshape(num_perm, num_perm), axis=1)

    def signature(self, shingle_hashes: np.ndarray) -> np.ndarray:
        """The value of each bin over the shingles, as uint32 (all-ones when empty)."""
        if not len(shingle_hashes):
            return np.full(self.bins, _EMPTY - 1, dtype="<u4")
        hashes = mix(shingle_hashes + self.offset)
        bins = ((hashes >> _HALF) * np.uint64(self.bins)) >> _HALF  # the high half, scaled
        values = np.full(self.bins, _EMPTY, dtype=np.uint64)
        np.minimum.at(values, bins.astype(np.intp), hashes & np.uint64(_EMPTY - 1))
        empty = np.flatnonzero(values == _EMPTY)
        if len(empty):
            probes = self.probes[empty]
            first_filled = np.argmax(values[probes] != _EMPTY, axis=1)
            values[empty] = values[probes[np.arange(len(empty)), first_filled]]
        return values.astype("<u4")


def band_keys(signature: np.ndarray, bands: int) -> tuple[bytes, ...]:
    """One key per band of rows; documents that share any band key are candidates."""
    data = signature.astype("<u4").tobytes()
    width = len(data) // bands
    return tuple(
        hashlib.blake2b(i.to_bytes(2, "little") + data[i * width:(i + 1) * width],
                        digest_size=8).digest()
        for i in range(bands))


def similarity(signature_a: bytes, signature_b: bytes) -> float:
    """Estimated Jaccard similarity: the share of MinHash values that agree."""
    a, b = np.frombuffer(signature_a, "<u4"), np.frombuffer(signature_b, "<u4")
    return float(np.mean(a == b))


def document_keys(key: RecordKey, stats: TextStats, config: DedupConfig,
                  hasher: MinHasher | None) -> DocumentKeys:
    """The keys pass one emits for one document; MinHash keys only with a ``hasher``."""
    if hasher is None:
        return DocumentKeys(key, stats.digest)
    found = shingles(stats, config.ngram)
    if not len(found):  # no words: only an exact copy can match it
        return DocumentKeys(key, stats.digest)
    signature = hasher.signature(found)
    return DocumentKeys(key, stats.digest, band_keys(signature, config.bands),
                        signature.tobytes())


# --------------------------------------------------------------------------- resolution


def later_copies(group: tuple[bytes, Iterable[RecordKey]]) -> Iterator[Pair]:
    """(copy, first) for every key of an exact group but its smallest (``first``)."""
    _, keys = group
    first, *others = sorted(keys)
    for other in others:
        yield other, first


def candidate_pairs(group: tuple[bytes, Iterable[tuple[RecordKey, bytes]]]) -> Iterator[Pair]:
    """Pairs to verify from one LSH bucket: its smallest member with each other member.

    Exact copies share every bucket and are settled by the exact step, so only the first key
    per content hash takes part. A member that is not similar to the smallest one may still meet
    its near copies in another band.
    """
    _, members = group
    first_by_content: dict[bytes, RecordKey] = {}
    for key, content in sorted(members):
        first_by_content.setdefault(content, key)
    first, *others = sorted(first_by_content.values())
    for other in others:
        yield first, other


def resolve_duplicates(exact: Iterable[Pair],
                       near: Iterable[Pair]) -> dict[RecordKey, tuple[str, RecordKey]]:
    """The keys to drop, each with its reason and the key of the copy that survives.

    Verified near pairs are joined into clusters (union-find, the smallest key as root); every
    member but the root is a near copy. An exact copy names its group's first key, or the root
    that key's cluster leads to.
    """
    parent: dict[RecordKey, RecordKey] = {}  # non-roots only

    def root(key: RecordKey) -> RecordKey:
        path = []
        while key in parent:
            path.append(key)
            key = parent[key]
        for node in path:  # path compression
            parent[node] = key
        return key

    for a, b in near:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    drops = {key: (DUPLICATE_NEAR, root(key)) for key in list(parent)}
    for copy, first in exact:
        drops[copy] = (DUPLICATE_EXACT, root(first))
    return drops


class FindDuplicates(beam.PTransform):
    """Batches of ``DocumentKeys`` (one per chunk) in; one dict {record key: (reason, surviving
    key)} out.

    Shuffles: the content hashes, the band keys (record key and content hash per band, as
    packed ``_BAND_ROW`` bytes), and the signatures of documents that have a candidate pair.
    Each travels in batches, one per chunk and bucket (a stable hash of the key, modulo
    ``buckets``), and is grouped by key inside its bucket: a shuffled element per document and
    band cost more than all the rest of deduplication. ``buckets`` bounds what one bucket
    holds, so size it to the input. Exact-only keys carry no bands, so the near-duplicate steps
    then see nothing.
    """

    def __init__(self, threshold: float, buckets: int = 1):
        super().__init__()
        self.threshold = threshold
        self.buckets = buckets

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        buckets = self.buckets
        exact = (
            batches
            | "ByContent" >> beam.FlatMap(lambda batch: by_bucket(
                ((doc.content, doc.key) for doc in batch), buckets))
            | "GroupByContent" >> beam.GroupByKey()
            | "LaterCopies" >> beam.FlatMap(later_copies_in_bucket)
            | "CollectCopies" >> beam.combiners.ToList())
        pairs = (
            batches
            | "ByBand" >> beam.FlatMap(band_rows_by_bucket, buckets)
            | "GroupByBand" >> beam.GroupByKey()
            | "CandidatePairs" >> beam.FlatMap(candidate_pairs_in_bucket))
        verified = (
            {
                "signature": batches | "Signatures" >> beam.FlatMap(lambda batch: by_bucket(
                    ((doc.key, doc.signature) for doc in batch if doc.bands), buckets)),
                "pairs": pairs | "PairsByMember" >> beam.FlatMap(
                    lambda pair: ((bucket_of(member, buckets), (member, pair))
                                  for member in pair)),
            }
            | "JoinSignatures" >> beam.CoGroupByKey()
            | "SignaturePerPair" >> beam.FlatMap(_signature_per_pair)
            | "GroupByPair" >> beam.GroupByKey()
            | "Verify" >> beam.FlatMap(_verified, self.threshold)
            | "CollectPairs" >> beam.combiners.ToList())
        return exact | "Resolve" >> beam.Map(resolve_duplicates,
                                             beam.pvalue.AsSingleton(verified))


def bucket_of(key: bytes | RecordKey, buckets: int) -> int:
    """A stable bucket for a key: the same in every process. Content hashes and band keys are
    blake2b digests already, so their first bytes serve; record keys are hashed."""
    if not isinstance(key, bytes):
        key = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(key[:8], "little") % buckets


def by_bucket(items: Iterable[tuple[Any, Any]], buckets: int) -> Iterator[tuple[int, list]]:
    """(bucket, [(key, value), ...]) for each bucket that ``items``' keys fall in."""
    found: dict[int, list] = collections.defaultdict(list)
    for key, value in items:
        found[bucket_of(key, buckets)].append((key, value))
    return iter(found.items())


def regroup(bucket: tuple[int, Iterable[list]]) -> Iterator[tuple[Any, list]]:
    """A bucket's batches as (key, [values]) per key, like a GroupByKey of the items."""
    _, batches = bucket
    found: dict[Any, list] = collections.defaultdict(list)
    for batch in batches:
        for key, value in batch:
            found[key].append(value)
    return iter(found.items())


def later_copies_in_bucket(bucket: tuple[int, Iterable[list]]) -> Iterator[Pair]:
    """``later_copies`` of each content hash in a bucket that more than one document has:
    nearly every hash is one document's alone, and passing each on as an element to be dropped
    cost more than the grouping."""
    for group in regroup(bucket):
        if len(group[1]) > 1:
            yield from later_copies(group)


def band_rows_by_bucket(batch: Iterable[DocumentKeys], buckets: int
                        ) -> Iterator[tuple[int, bytes]]:
    """(bucket, packed ``_BAND_ROW`` rows) for each bucket that the batch's band keys fall in;
    the bucket is ``bucket_of`` the band key."""
    docs = [doc for doc in batch if doc.bands]
    if not docs:
        return
    per_doc = [len(doc.bands) for doc in docs]
    rows = np.empty(sum(per_doc), dtype=_BAND_ROW)
    rows["band"] = np.frombuffer(b"".join(band for doc in docs for band in doc.bands), "<u8")
    rows["key"] = np.repeat(np.array([doc.key for doc in docs], dtype=np.int64), per_doc, axis=0)
    rows["content"] = np.repeat(np.frombuffer(b"".join(doc.content for doc in docs), "V16"),
                                per_doc)
    bucket = rows["band"] % np.uint64(buckets)
    for number in np.unique(bucket).tolist():
        yield number, rows[bucket == number].tobytes()


def candidate_pairs_in_bucket(bucket: tuple[int, Iterable[bytes]]) -> Iterator[Pair]:
    """``candidate_pairs`` of each band key in a bucket that more than one document shares:
    numpy finds those few among the bucket's rows, and only they become Python objects."""
    _, blobs = bucket
    rows = np.concatenate([np.frombuffer(blob, _BAND_ROW) for blob in blobs])
    rows = rows[np.argsort(rows["band"], kind="stable")]
    same = rows["band"][1:] == rows["band"][:-1]
    shared = np.zeros(len(rows), dtype=bool)
    shared[1:] = same
    shared[:-1] |= same
    rows = rows[shared]
    members: dict[int, list[tuple[RecordKey, bytes]]] = collections.defaultdict(list)
    for band, key, content in zip(rows["band"].tolist(), rows["key"].tolist(),
                                  map(bytes, rows["content"]), strict=True):
        members[band].append((tuple(key), content))
    for group in members.items():
        yield from candidate_pairs(group)


def _signature_per_pair(joined: tuple[int, Mapping[str, list]]) -> Iterator[tuple]:
    _, sides = joined
    signatures = dict(item for batch in sides["signature"] for item in batch)
    for member, pair in sorted(set(sides["pairs"])):  # a pair found in several bands, once
        yield pair, signatures[member]


def _verified(pair_signatures: tuple[Pair, Iterable[bytes]], threshold: float) -> list[Pair]:
    pair, signatures = pair_signatures
    first, second = list(signatures)
    return [pair] if similarity(first, second) >= threshold else []
