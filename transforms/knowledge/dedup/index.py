"""Deduplication across runs: each run's index of the documents it published (``dedup_index/``,
``--write_dedup_index``) and the join of a later run's keys with earlier indexes
(``--dedup_against``).

An index row is a kept document's id, the hash of its text as deduplication keyed it and, in
near mode, its MinHash band keys and signature: under a kilobyte whatever the document's
length, and no text. Deduplication's first pass writes every keyed document's keys to a staging
file per chunk (``write_chunk_keys``); the main pass's ``IndexDocuments`` takes from it the
documents that are still there once every filter, split and mix has run, so the index holds what
was published. A later run reads the earlier indexes as more ``DocumentKeys`` of nodes that sort
before all of its own (input index -1), so in any cluster that holds one, an earlier document is
the survivor and every copy in this run is filtered as ``duplicate_earlier_run``; within-run
rules are otherwise unchanged. The earlier keys go through the same shuffle as the run's own:
no side input grows with the index. Earlier runs are numbered by their sorted paths, so the
order they are given in changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from transforms.core.steps import PARTS, VALIDATION_MARK, ChunkStep, Part, partition_of
from transforms.core.vocabulary import DUPLICATE_EARLIER_RUN
from transforms.io.formats import DEDUP_INDEX
from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.dedup.components import Decision
from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.dedup.minhash import (
    CONTENT,
    DocumentKeys,
    Node,
    chunk_number,
)
from transforms.knowledge.document_records import document_id

KEYS = "dedup-keys"  # under the staging directory: the first pass's keys, a file per chunk
EARLIER = -1  # the input index of an earlier run's documents: before every input of this run
INDEX_SCHEMA = pa.schema([
    ("branch", pa.string()),  # knowledge or instruction: each branch joins its own rows
    ("id", pa.string()),  # the document's id, as documents/ has it
    ("digest", pa.binary(16)),  # the hash of its normalised text
    ("bands", pa.list_(pa.binary(8))),  # its LSH band keys (near mode)
    ("signature", pa.binary()),  # its MinHash signature, little-endian uint32 (near mode)
])
# The first pass's keys of a chunk: the record key (input, file, position), then as the index.
_KEYS_SCHEMA = pa.schema([("input", pa.int64()), ("file", pa.int64()), ("position", pa.int64()),
                          *list(INDEX_SCHEMA)[2:]])
# What must agree for two runs' keys to be comparable (the threshold is this run's own).
COMPATIBLE = ("ngram", "num_perm", "bands")


def keys_path(directory: str, chunk_id: str) -> str:
    return FileSystems.join(directory, f"{chunk_number(chunk_id) & 0xFFFFFFFFFFFFFFFF:016x}.arrow")


def write_chunk_keys(path: str, keys: Sequence[DocumentKeys]) -> None:
    """A chunk's keyed documents, for ``IndexDocuments`` to take the published ones from."""
    write_arrow(path, pa.table({
        "input": [k.node[0] for k in keys], "file": [k.node[1] for k in keys],
        "position": [k.node[2] for k in keys], "digest": [k.node[CONTENT] for k in keys],
        "bands": [list(k.bands) for k in keys], "signature": [k.signature for k in keys],
    }, schema=_KEYS_SCHEMA))


def base_chunk_id(chunk_id: str) -> str:
    """The id a chunk was read under, without its validation mark or partition."""
    base = chunk_id.removesuffix(VALIDATION_MARK)
    partition = partition_of(chunk_id)
    return base if partition is None else base.removesuffix(f"|{partition}")


class IndexDocuments(ChunkStep):
    """Passes each chunk on and stages the index rows (``INDEX_SCHEMA``) of its documents or
    conversations (its ``origins``): the ones left once every filter, split and mix has run."""

    def __init__(self, branch: str, files: Sequence[str], keys_dir: str):
        self.branch = branch
        self.step_name = f"{DEDUP_INDEX}.{branch}"  # both branches may stage a chunk's rows
        self.files = tuple(files)
        self.keys_dir = keys_dir

    def setup(self) -> None:
        self.file_numbers = {path: number for number, path in enumerate(self.files)}

    def run(self, chunk: Any) -> Iterator:
        path = keys_path(self.keys_dir, base_chunk_id(chunk.chunk_id))
        keyed = read_arrow(path).to_pylist() if FileSystems.exists(path) else []
        by_key = {(row["input"], row["file"], row["position"]): row for row in keyed}
        found = [(origin, row) for origin in chunk.origins
                 if (row := by_key.get((origin[2], self.file_numbers.get(origin[0]), origin[1])))]
        if found:
            table = pa.table({
                "branch": [self.branch] * len(found),
                "id": [document_id(source, position) for (source, position, _), _ in found],
                "digest": [row["digest"] for _, row in found],
                "bands": [row["bands"] for _, row in found],
                "signature": [row["signature"] for _, row in found],
            }, schema=INDEX_SCHEMA)
            self.count(f"{self.branch}.dedup_index_rows", table.num_rows)
            yield beam.pvalue.TaggedOutput(PARTS, Part(DEDUP_INDEX, chunk.chunk_id,
                                                       self.step_name, table))
        yield chunk


# --------------------------------------------------------------------------- earlier runs


def index_files(path: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([f"{path.rstrip('/')}/*.parquet"])[0]
                  .metadata_list)


def index_rows(paths: Sequence[str]) -> int:
    """The rows of the earlier indexes, from their files' footers (read when the graph is
    built): what sizes the key buckets they join."""
    rows = 0
    for path in paths:
        for file in index_files(path):
            with FileSystems.open(file) as handle:
                rows += pq.ParquetFile(handle).metadata.num_rows
    return rows


def check_earlier_index(path: str, dedup: DedupConfig) -> None:
    """ValueError unless ``path`` is the ``dedup_index`` of a complete run whose keys this run
    can compare with its own (the same shingles, MinHash values and bands)."""
    if not index_files(path):
        raise ValueError(f"--dedup_against {path}: no index files (*.parquet) there; give the "
                         f"{DEDUP_INDEX} folder of a run made with --write_dedup_index=true")
    root = path.rstrip("/").rpartition("/")[0]
    manifest_path = FileSystems.join(root, "manifest.json")
    if not FileSystems.exists(manifest_path):
        raise ValueError(f"--dedup_against {path}: {manifest_path} is missing, so that run did "
                         "not complete")
    with FileSystems.open(manifest_path) as handle:
        earlier = json.loads(handle.read())["config"]["knowledge"]["dedup"]
    mine = {name: getattr(dedup, name) for name in COMPATIBLE}
    theirs = {name: earlier.get(name) for name in COMPATIBLE}
    if mine != theirs:
        raise ValueError(f"--dedup_against {path}: its keys were made with {theirs}, this run's "
                         f"with {mine}; give this run the same --dedup_ngram, --dedup_num_perm "
                         "and --dedup_bands")


def earlier_node(run: int, row: dict) -> Node:
    """An earlier run's document as a node: before every node of this run, ordered by run
    (sorted paths) and id."""
    position = int.from_bytes(bytes.fromhex(row["id"]), "big", signed=True)
    return (EARLIER, run, position, 0, row["digest"])


def earlier_keys(table: pa.Table, run: int) -> tuple[DocumentKeys, ...]:
    """A batch of an earlier index's rows as ``DocumentKeys``."""
    return tuple(DocumentKeys(earlier_node(run, row), tuple(row["bands"] or ()),
                              row["signature"] or b"")
                 for row in table.to_pylist())


class ReadEarlierIndexes(beam.PTransform):
    """The earlier runs' index rows of one branch as batches of ``DocumentKeys``, a batch per
    row group."""

    def __init__(self, paths: Sequence[str], branch: str):
        super().__init__()
        self.paths = tuple(sorted(paths))
        self.branch = branch

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = [(run, file) for run, path in enumerate(self.paths) for file in index_files(path)]
        return (pbegin
                | "IndexFiles" >> beam.Create(files)
                | "Reshuffle" >> beam.Reshuffle()
                | "ReadRowGroups" >> beam.FlatMap(_row_group_keys, self.branch))


def _row_group_keys(item: tuple[int, str], branch: str) -> Iterator[tuple[DocumentKeys, ...]]:
    run, path = item
    with FileSystems.open(path) as handle:
        parquet = pq.ParquetFile(pa.BufferReader(handle.read()))
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group)
            mine = table.filter(pc.equal(table["branch"], branch))
            if mine.num_rows:
                yield earlier_keys(mine, run)


def this_runs_decisions(decision: Decision) -> Iterator[Decision]:
    """A decision about a document of this run; an earlier run's survivor makes it a
    ``duplicate_earlier_run``. Decisions about earlier documents are nobody's to act on."""
    node, _, kept = decision
    if node[0] == EARLIER:
        return
    yield (node, DUPLICATE_EARLIER_RUN, kept) if kept[0] == EARLIER else decision


def earlier_message(kept: tuple[int, int, int], earlier: Sequence[str]) -> str:
    """What a ``duplicate_earlier_run`` drop says: the earlier run's index and document id."""
    _, run, position = kept
    return (f"copy of document {position & 0xFFFFFFFFFFFFFFFF:016x} of the earlier run indexed "
            f"at {sorted(earlier)[run]}")

