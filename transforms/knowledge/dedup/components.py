"""Finding and resolving copies through the shuffle: exact groups and verified LSH candidate
pairs are the edges, and label propagation joins them into clusters, one decision per document
to drop. Only small keys travel, batched per chunk and bucket."""

from __future__ import annotations

import collections
import hashlib
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np

from transforms.core.steps import METRICS_NAMESPACE
from transforms.core.vocabulary import (
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
)
from transforms.knowledge.dedup.config import MAX_ROUNDS
from transforms.knowledge.dedup.minhash import CONTENT, DocumentKeys, Node, similarity

Pair = tuple[Node, Node]
Decision = tuple[Node, str, Node]  # (document to drop, reason, surviving document)
# One row per document and band, for the band shuffle: the band key as a number, then the
# document's node (record key, chunk number and content hash).
_BAND_ROW = np.dtype([("band", "<u8"), ("key", "<i8", (4,)), ("content", "V16")])


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
