"""Deduplication's decisions, one small file per chunk in staging: pass one writes them and the
main pass reads back its own chunk's file alone. A file holds the chunk's documents to drop
(copies) and its boilerplate units to remove, each with the document that keeps it."""

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
from transforms.knowledge.dedup.paragraphs import Keeper
from transforms.knowledge.quality import text_hash

DECISIONS = "dedup-decisions"  # under the staging directory: one file per chunk with decisions
DROPS, UNITS = "drops", "units"  # the two kinds of decision, as WriteDecisions takes them
# A drop names the document (input, file, position) and its text hash; a unit to remove names
# its hash (``unit``) and leaves those null. Both name the document that is kept (kept_*).
_DECISION_SCHEMA = pa.schema([
    ("input", pa.int64()), ("file", pa.int64()), ("position", pa.int64()),
    ("digest", pa.binary(16)), ("reason", pa.string()),
    ("kept_input", pa.int64()), ("kept_file", pa.int64()), ("kept_position", pa.int64()),
    ("unit", pa.uint64()),
])


def decisions_path(directory: str, chunk: int) -> str:
    return FileSystems.join(directory, f"{chunk & 0xFFFFFFFFFFFFFFFF:016x}.arrow")


def write_decisions(chunk: int, drops: Iterable[Decision], units: Iterable[Keeper],
                    directory: str) -> str:
    """One chunk's decisions, sorted, to its file (a retried bundle writes the same bytes);
    the path out."""
    rows = [(*node[:CHUNK], node[CONTENT], reason, *kept[:CHUNK], None)
            for node, reason, kept in sorted(drops)]
    rows += [(None, None, None, None, None, *kept, unit) for unit, kept in sorted(units)]
    columns = list(zip(*rows, strict=True))
    path = decisions_path(directory, chunk)
    write_arrow(path, pa.table(dict(zip(_DECISION_SCHEMA.names, columns, strict=True)),
                               schema=_DECISION_SCHEMA))
    return path


def _write_chunk(group: tuple[int, Mapping[str, Iterable]], directory: str) -> str:
    chunk, found = group
    return write_decisions(chunk, found.get(DROPS, ()),
                           (keeper for batch in found.get(UNITS, ()) for keeper in batch),
                           directory)


class WriteDecisions(beam.PTransform):
    """``{DROPS: decisions, UNITS: (chunk, [Keeper, ...]) batches}`` in (either may be absent),
    grouped by chunk and written to one file per chunk; the paths out."""

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory

    def expand(self, decisions: Mapping[str, beam.PCollection]) -> beam.PCollection:
        keyed = dict(decisions)
        if DROPS in keyed:
            keyed[DROPS] = keyed[DROPS] | "ByChunk" >> beam.Map(
                lambda decision: (decision[0][CHUNK], decision))
        return (keyed
                | "GroupByChunk" >> beam.CoGroupByKey()
                | "Write" >> beam.Map(_write_chunk, self.directory))


@dataclasses.dataclass(frozen=True)
class ChunkDecisions:
    """The decisions of one chunk, as the main pass reads them back: the drops by record key,
    each with the hash of the text it was made for, its reason and the surviving record's key;
    the boilerplate units by hash, each with the key of the one document that keeps it."""

    drops: Mapping[RecordKey, tuple[bytes, str, RecordKey]]
    units: Mapping[int, RecordKey] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, path: str) -> ChunkDecisions:
        """The file's decisions; none without a file (a chunk with nothing to drop)."""
        if not FileSystems.exists(path):
            return cls({})
        drops, units = {}, {}
        for row in read_arrow(path).to_pylist():
            kept = (row["kept_input"], row["kept_file"], row["kept_position"])
            if row["unit"] is None:
                drops[row["input"], row["file"], row["position"]] = (row["digest"],
                                                                     row["reason"], kept)
            else:
                units[row["unit"]] = kept
        return cls(drops, units)

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
