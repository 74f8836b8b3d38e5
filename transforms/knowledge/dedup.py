"""Deduplication across the whole dataset: exact copies and near copies (MinHash + LSH).

Only small keys are shuffled, never the documents (README, "Determinism and memory": on the
DirectRunner a shuffle holds all its data in memory). Pass one turns every kept document into
``DocumentKeys``: its node (record key, chunk and a hash of its normalised text) and, for
near-duplicate detection, a MinHash signature and its LSH band keys. ``FindDuplicates`` groups
those keys, verifies candidate pairs by their estimated Jaccard similarity and joins copies into
clusters by label propagation over the shuffle (``ConnectedComponents``), one decision per
document to drop. The decisions are grouped by chunk and written to one small file per chunk
(``write_decisions``); the main pass's ``DropDuplicates`` reads its own chunk's file. Nothing
that grows with the documents or the duplicates is held on one worker or sent to every worker
(docs/dedup.md).

The surviving copy is always the one with the smallest record key (input index, source,
position), whatever the runner, worker count or bundle boundaries.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import Record
from transforms.core.steps import METRICS_NAMESPACE
from transforms.core.vocabulary import (
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
)
from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.quality import TextStats, ngram_hashes, text_hash
from transforms.knowledge.words import mix

MODES = ("none", "exact", "near")

# (input index, file number, position): orders the copies. Files are numbered in path order, so
# this sorts like (input index, source, position) while every shuffled key stays a few ints.
RecordKey = tuple[int, int, int]
# A document in the duplicate graph: its record key, then the number of its chunk (where its
# decision goes) and the hash of its text (which the main pass checks). The record key alone
# orders nodes: it is unique.
Node = tuple[int, int, int, int, bytes]
CHUNK, CONTENT = 3, 4
Pair = tuple[Node, Node]
Decision = tuple[Node, str, Node]  # (document to drop, reason, surviving document)
# Rounds of label propagation (--dedup_rounds): a cluster's labels are final after as many
# rounds as the longest shortest path from a member to its smallest one, and one more round
# confirms it. Exact groups and LSH buckets are stars around their smallest member (one hop);
# paths grow only where near copies chain through different bands.
MAX_ROUNDS = 8

SEED = 0x5EED  # of the MinHash hash: fixed, so signatures agree across runs and workers
_HALF = np.uint64(32)
_EMPTY = 1 << 32  # a bin no shingle reached: above every 32-bit value
# One row per document and band, for the band shuffle: the band key as a number, then the
# document's node (record key, chunk number and content hash).
_BAND_ROW = np.dtype([("band", "<u8"), ("key", "<i8", (4,)), ("content", "V16")])


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
    def near(self) -> bool:
        return self.mode == "near"


@dataclasses.dataclass(frozen=True)
class DocumentKeys:
    """What pass one keeps of a document: under a kilobyte, however long the text is."""

    node: Node
    bands: tuple[bytes, ...] = ()  # LSH band keys (near mode)
    signature: bytes = b""  # MinHash signature, little-endian uint32 (near mode)


def record_key(record: Record, file_numbers: Mapping[str, int]) -> RecordKey:
    return (record.input_index, file_numbers[record.source], record.position)


def file_numbering(paths: Iterable[str]) -> tuple[str, ...]:
    """File number -> path, in path order: both passes number the files alike."""
    return tuple(sorted(set(paths)))


def chunk_number(chunk_id: str) -> int:
    """A chunk's number in the shuffled nodes (a signed 64-bit hash of its id): it names the
    chunk's decision file. Two chunks that shared one would share a file, which still holds
    only decisions found by record key and text hash."""
    return int.from_bytes(hashlib.blake2b(chunk_id.encode("utf-8"), digest_size=8).digest(),
                          "little", signed=True)


DECISIONS = "dedup-decisions"  # under the staging directory: one file per chunk with drops
_DECISION_SCHEMA = pa.schema([
    ("input", pa.int64()), ("file", pa.int64()), ("position", pa.int64()),
    ("digest", pa.binary(16)), ("reason", pa.string()),
    ("kept_input", pa.int64()), ("kept_file", pa.int64()), ("kept_position", pa.int64()),
])


def decisions_path(directory: str, chunk: int) -> str:
    return FileSystems.join(directory, f"{chunk & 0xFFFFFFFFFFFFFFFF:016x}.arrow")


def write_decisions(group: tuple[int, Iterable[Decision]], directory: str) -> str:
    """One chunk's decisions, sorted, to its file (a retried bundle writes the same bytes);
    the path out."""
    chunk, decisions = group
    rows = sorted(decisions)
    columns = list(zip(*((*node[:CHUNK], node[CONTENT], reason, *kept[:CHUNK])
                         for node, reason, kept in rows), strict=True))
    path = decisions_path(directory, chunk)
    write_arrow(path, pa.table(dict(zip(_DECISION_SCHEMA.names, columns, strict=True)),
                               schema=_DECISION_SCHEMA))
    return path


class WriteDecisions(beam.PTransform):
    """Decisions in, grouped by chunk and written to one file per chunk; the paths out."""

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory

    def expand(self, decisions: beam.PCollection) -> beam.PCollection:
        return (decisions
                | "ByChunk" >> beam.Map(lambda decision: (decision[0][CHUNK], decision))
                | "GroupByChunk" >> beam.GroupByKey()
                | "Write" >> beam.Map(write_decisions, self.directory))


@dataclasses.dataclass(frozen=True)
class ChunkDecisions:
    """The decisions of one chunk, as the main pass reads them back: by record key, each with
    the hash of the text it was made for, its reason and the surviving record's key."""

    drops: Mapping[RecordKey, tuple[bytes, str, RecordKey]]

    @classmethod
    def read(cls, path: str) -> ChunkDecisions:
        """The file's decisions; none without a file (a chunk with nothing to drop)."""
        if not FileSystems.exists(path):
            return cls({})
        rows = read_arrow(path).to_pylist()
        return cls({(row["input"], row["file"], row["position"]): (
            row["digest"], row["reason"],
            (row["kept_input"], row["kept_file"], row["kept_position"])) for row in rows})

    def verdict(self, record: Record, files: Sequence[str],
                file_numbers: Mapping[str, int]) -> tuple[str, str] | None:
        """(reason, message naming the surviving copy) for a record to drop, else None. A
        decision counts only for the text it was made for, so a stale file drops nothing."""
        found = self.drops.get(record_key(record, file_numbers))
        if found is None or found[0] != text_hash(record.value):
            return None
        _, reason, (index, number, position) = found
        return reason, (f"copy of the document at position {position} of {files[number]} "
                        f"(input {index})")


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


def document_keys(key: RecordKey, chunk: int, stats: TextStats, config: DedupConfig,
                  hasher: MinHasher | None) -> DocumentKeys:
    """The keys pass one emits for one document; MinHash keys only with a ``hasher``."""
    node = (*key, chunk, stats.digest)
    if hasher is None:
        return DocumentKeys(node)
    found = shingles(stats, config.ngram)
    if not len(found):  # no words: only an exact copy can match it
        return DocumentKeys(node)
    signature = hasher.signature(found)
    return DocumentKeys(node, band_keys(signature, config.bands), signature.tobytes())


# --------------------------------------------------------------------------- resolution


def later_copies(group: tuple[bytes, Iterable[Node]]) -> Iterator[Pair]:
    """(copy, first) for every node of an exact group but its smallest (``first``)."""
    _, nodes = group
    first, *others = sorted(nodes)
    for other in others:
        yield other, first


# A node's state between rounds: (label, exact copy, label changed last round, neighbours).
State = tuple[Node, bool, bool, tuple[Node, ...]]


def _start(group: tuple[Node, Iterable[tuple[Node, bool]]]) -> tuple[Node, State]:
    """A node labelled with itself, with its neighbours; an exact copy if any edge says so."""
    node, ends = group
    ends = list(ends)
    return node, (node, any(exact for _, exact in ends), True,
                  tuple(sorted({neighbour for neighbour, _ in ends})))


def _messages(state: tuple[Node, State]) -> Iterator[tuple[Node, tuple]]:
    """A node's own state, and its label to each neighbour if it changed last round (a label
    that did not change has nothing new to tell)."""
    node, (label, exact, changed, neighbours) = state
    yield node, (label, (exact, neighbours))
    if changed:
        for neighbour in neighbours:
            yield neighbour, (label, None)


class _Relabel(beam.CombineFn):
    """A node's next state from its own and its neighbours' labels: the smallest label wins.
    The accumulator is the node's own state and one label, however many neighbours send."""

    def create_accumulator(self) -> tuple:
        return None, None, None  # own label, (exact copy, neighbours), smallest label received

    def add_input(self, accumulator: tuple, message: tuple) -> tuple:
        label, facts = message  # facts: None for a neighbour's label
        received = (None, None, label) if facts is None else (label, facts, None)
        return self.merge_accumulators([accumulator, received])

    def merge_accumulators(self, accumulators: Iterable[tuple]) -> tuple:
        own, facts, best = None, None, None
        for a_own, a_facts, a_best in accumulators:
            if a_facts is not None:
                own, facts = a_own, a_facts
            if a_best is not None and (best is None or a_best < best):
                best = a_best
        return own, facts, best

    def extract_output(self, accumulator: tuple) -> State:
        own, (exact, neighbours), best = accumulator
        changed = best is not None and best < own
        return (best if changed else own), exact, changed, neighbours


class _CountChanged(beam.DoFn):
    """Counts the labels a round changed (a Beam metric per round: how fast it converges)."""

    def __init__(self, round_number: int):
        self.name = f"dedup.round_{round_number:02d}.changed"

    def setup(self) -> None:
        self.counter = beam.metrics.Metrics.counter(METRICS_NAMESPACE, self.name)

    def process(self, state: tuple[Node, State]) -> Iterator[tuple[Node, State]]:
        if state[1][2]:
            self.counter.inc()
        yield state


def _drop_decisions(state: tuple[Node, State], rounds: int) -> Iterator[Decision]:
    """The decision for a node that is not its cluster's smallest; refuses to decide on labels
    that the last round still changed (the graph's diameter is beyond ``rounds``)."""
    node, (label, exact, changed, _) = state
    if changed:
        raise RuntimeError(
            f"deduplication's clusters did not converge in {rounds} rounds of label propagation "
            f"(a chain of near copies longer than that); rerun with --dedup_rounds above {rounds}")
    if label < node:
        yield node, DUPLICATE_EXACT if exact else DUPLICATE_NEAR, label


class ConnectedComponents(beam.PTransform):
    """Edges (exact copies to their first, verified near pairs) in; one ``Decision`` per node
    that is not the smallest of its connected component out.

    Min-label propagation (hash-min): every node starts labelled with itself; in each round a
    node whose label changed sends it to its neighbours, and every node takes the smallest
    label it received. After ``rounds`` rounds each label is its component's smallest node,
    provided the last round changed nothing (checked; the job fails otherwise). Each round is
    one ``CombinePerKey`` by node: what any one step holds is one node's state (its label and
    its neighbours), never the graph.
    """

    def __init__(self, rounds: int = MAX_ROUNDS):
        super().__init__()
        self.rounds = rounds

    def expand(self, edges: beam.PCollection) -> beam.PCollection:
        state = (
            edges
            | "BothEnds" >> beam.FlatMap(lambda edge: ((edge[0], (edge[1], edge[2])),
                                                       (edge[1], (edge[0], False))))
            | "ByNode" >> beam.GroupByKey()
            | "Start" >> beam.Map(_start))
        for number in range(1, self.rounds + 1):
            state = (
                state
                | f"Round{number:02d}Send" >> beam.FlatMap(_messages)
                | f"Round{number:02d}Relabel" >> beam.CombinePerKey(_Relabel())
                | f"Round{number:02d}Count" >> beam.ParDo(_CountChanged(number)))
        return state | "Decide" >> beam.FlatMap(_drop_decisions, self.rounds)


class FindDuplicates(beam.PTransform):
    """Batches of ``DocumentKeys`` (one per chunk) in; one ``Decision`` (node, reason,
    surviving node) per document to drop out.

    Shuffles: the content hashes, the band keys (node per band, as packed ``_BAND_ROW``
    bytes), and the signatures of documents that have a candidate pair. Each travels in
    batches, one per chunk and bucket (a stable hash of the key, modulo ``buckets``), and is
    grouped by key inside its bucket: a shuffled element per document and band cost more than
    all the rest of deduplication. ``buckets`` bounds what one bucket holds, so size it to the
    input. Exact copies (to their group's first) and verified near pairs are the edges of
    ``ConnectedComponents``. Exact-only keys carry no bands, so the near-duplicate steps then
    see nothing.
    """

    def __init__(self, threshold: float, buckets: int = 1, rounds: int = MAX_ROUNDS):
        super().__init__()
        self.threshold = threshold
        self.buckets = buckets
        self.rounds = rounds

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        buckets = self.buckets
        exact = (
            batches
            | "ByContent" >> beam.FlatMap(lambda batch: by_bucket(
                ((doc.node[CONTENT], doc.node) for doc in batch), buckets))
            | "GroupByContent" >> beam.GroupByKey()
            | "LaterCopies" >> beam.FlatMap(later_copies_in_bucket)
            | "ExactEdges" >> beam.MapTuple(lambda copy, first: (copy, first, True)))
        pairs = (
            batches
            | "ByBand" >> beam.FlatMap(band_rows_by_bucket, buckets)
            | "GroupByBand" >> beam.GroupByKey()
            | "CandidatePairs" >> beam.FlatMap(packed_candidate_pairs_in_bucket)
            # A pair is found in every band its two members share (up to all of them): once is
            # enough, and the first member of a large cluster would otherwise meet each of its
            # pairs that many times in the signature join. Packed, a pair is one small bytes
            # object in the combiner table that Distinct keeps per bundle.
            | "DistinctPairs" >> beam.Distinct()
            | "UnpackPairs" >> beam.Map(unpack_pair))
        near = (
            {
                "signature": batches | "Signatures" >> beam.FlatMap(lambda batch: by_bucket(
                    ((doc.node, doc.signature) for doc in batch if doc.bands), buckets)),
                "pairs": pairs | "PairsByMember" >> beam.FlatMap(
                    lambda pair: ((bucket_of(member, buckets), (member, pair))
                                  for member in pair)),
            }
            | "JoinSignatures" >> beam.CoGroupByKey()
            | "SignaturePerPair" >> beam.FlatMap(_signature_per_pair)
            | "GroupByPair" >> beam.GroupByKey()
            | "Verify" >> beam.FlatMap(_verified, self.threshold)
            | "NearEdges" >> beam.MapTuple(lambda a, b: (a, b, False)))
        return ((exact, near)
                | "AllEdges" >> beam.Flatten()
                | "Clusters" >> ConnectedComponents(self.rounds))


def bucket_of(key: bytes | Node, buckets: int) -> int:
    """A stable bucket for a key: the same in every process. Content hashes and band keys are
    blake2b digests already, so their first bytes serve; nodes are hashed."""
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
    rows["key"] = np.repeat(np.array([doc.node[:CONTENT] for doc in docs], dtype=np.int64),
                            per_doc, axis=0)
    rows["content"] = np.repeat(np.frombuffer(b"".join(doc.node[CONTENT] for doc in docs),
                                              "V16"), per_doc)
    bucket = rows["band"] % np.uint64(buckets)
    for number in np.unique(bucket).tolist():
        yield number, rows[bucket == number].tobytes()


def packed_candidate_pairs_in_bucket(bucket: tuple[int, Iterable[bytes]]) -> Iterator[bytes]:
    """The pairs to verify of each band key in a bucket that more than one document shares:
    its smallest member with each other member, one node per content hash (exact copies share
    every band and are settled by the exact step; a member that is not similar to the smallest
    one may still meet its near copies in another band). Each pair is packed as ``_PAIR`` bytes
    (``unpack_pair``): a pair is found in every band its members share, and ``Distinct`` holds
    up to 10^5 of them per bundle (the SDK's combiner-lifting table), in 96 bytes each rather
    than as two Python nodes."""
    for firsts, others in _pair_rows(bucket):
        packed = np.empty(len(firsts), dtype=_PACKED_PAIR)
        packed["a_key"], packed["a_content"] = firsts["key"], firsts["content"]
        packed["b_key"], packed["b_content"] = others["key"], others["content"]
        blob, width = packed.tobytes(), _PACKED_PAIR.itemsize
        yield from (blob[i:i + width] for i in range(0, len(blob), width))


def unpack_pair(packed: bytes) -> Pair:
    a0, a1, a2, a3, a_content, b0, b1, b2, b3, b_content = _PAIR.unpack(packed)
    return (a0, a1, a2, a3, a_content), (b0, b1, b2, b3, b_content)


_PACKED_PAIR = np.dtype([("a_key", "<i8", (4,)), ("a_content", "V16"),
                         ("b_key", "<i8", (4,)), ("b_content", "V16")])
_PAIR = struct.Struct("<4q16s4q16s")


def _pair_rows(bucket: tuple[int, Iterable[bytes]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The candidate pairs of a bucket's band rows, as (first members, other members) rows,
    at most ``_PAIR_BATCH`` pairs at a time, in numpy: the rows are ordered by band key, then
    taken a slice of about ``_SLICE_ROWS`` at a time (whole band keys only), and in each slice
    the rows of band keys that more than one document has are sorted by node, the first node
    per band and content kept, and each band's first kept node paired with each other one.
    Nothing per row becomes a Python object and the sorting is per slice, so a bucket holds
    its rows, their order and one slice, however many of them are copies (issue 20: a Python
    node per shared row made a bucket's memory grow with its duplicates)."""
    _, blobs = bucket
    rows = np.concatenate([np.frombuffer(blob, _BAND_ROW) for blob in blobs])
    order = np.argsort(rows["band"], kind="stable")
    band = rows["band"][order]
    start = 0
    while start < len(rows):
        # The slice ends after a whole band key: all of a key's rows are in one slice.
        end = int(np.searchsorted(band, band[min(start + _SLICE_ROWS, len(rows)) - 1], "right"))
        same = band[start + 1:end] == band[start:end - 1]
        shared = np.zeros(end - start, dtype=bool)
        shared[1:] = same
        shared[:-1] |= same
        if shared.any():
            yield from _slice_pairs(rows[order[start:end][shared]])
        start = end


def _slice_pairs(rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    # The content hash as two big-endian numbers: they sort as the bytes do, so the sort below
    # orders nodes as tuples compare (record key, chunk, content).
    content = rows["content"].copy().view(">u8").reshape(-1, 2)
    key = rows["key"]
    order = np.lexsort((content[:, 1], content[:, 0], key[:, 3], key[:, 2], key[:, 1],
                        key[:, 0], rows["band"]))
    rows, content = rows[order], content[order]
    band = rows["band"]
    # The first (smallest) node of each band and content: a stable sort by (band, content)
    # keeps node order inside each run, so a run's first row is that node.
    by_content = np.lexsort((np.arange(len(rows)), content[:, 1], content[:, 0], band))
    b, c = band[by_content], content[by_content]
    run_start = np.ones(len(rows), dtype=bool)
    run_start[1:] = (b[1:] != b[:-1]) | (c[1:, 0] != c[:-1, 0]) | (c[1:, 1] != c[:-1, 1])
    keep = np.zeros(len(rows), dtype=bool)
    keep[by_content[run_start]] = True
    rows = rows[keep]
    band = rows["band"]
    group_start = np.ones(len(rows), dtype=bool)
    group_start[1:] = band[1:] != band[:-1]
    first = np.maximum.accumulate(np.where(group_start, np.arange(len(rows)), 0))
    others = np.flatnonzero(~group_start)
    for start in range(0, len(others), _PAIR_BATCH):
        batch = others[start:start + _PAIR_BATCH]
        yield rows[first[batch]], rows[batch]


_SLICE_ROWS = 1 << 16  # band rows sorted by node at a time (more for a larger band key)
_PAIR_BATCH = 4096  # candidate pairs made Python objects at a time


def _signature_per_pair(joined: tuple[int, Mapping[str, list]]) -> Iterator[tuple]:
    _, sides = joined
    signatures = dict(item for batch in sides["signature"] for item in batch)
    for member, pair in sides["pairs"]:
        yield pair, signatures[member]


def _verified(pair_signatures: tuple[Pair, Iterable[bytes]], threshold: float) -> list[Pair]:
    pair, signatures = pair_signatures
    first, second = list(signatures)
    return [pair] if similarity(first, second) >= threshold else []
