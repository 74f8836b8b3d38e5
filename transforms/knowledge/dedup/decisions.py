"""Deduplication's decisions, one small file per chunk in staging: pass one writes them and the
main pass reads back its own chunk's file alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import Record
from transforms.core.vocabulary import Drop
from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.dedup.components import Decision
from transforms.knowledge.dedup.minhash import CHUNK, CONTENT, RecordKey, record_key
from transforms.knowledge.quality import text_hash

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
                file_numbers: Mapping[str, int]) -> Drop | None:
        """The ``Drop`` of a record to drop (its message names the surviving copy), else None. A
        decision counts only for the text it was made for, so a stale file drops nothing."""
        found = self.drops.get(record_key(record, file_numbers))
        if found is None or found[0] != text_hash(record.value):
            return None
        _, reason, (index, number, position) = found
        return Drop(reason, f"copy of the document at position {position} of {files[number]} "
                            f"(input {index})")
