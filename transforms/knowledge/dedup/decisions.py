"""Deduplication's decisions, one small file per chunk in staging: pass one writes them and the
main pass reads back its own chunk's file alone. A file holds the chunk's documents to drop
(copies) and its boilerplate units to remove, each with the document that keeps it, and for each
of its documents that copies were dropped in favour of, how many of each kind."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import Record, replaced
from transforms.core.vocabulary import DUPLICATE_EARLIER_RUN, Drop
from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.dedup.components import Decision
from transforms.knowledge.dedup.index import earlier_message
from transforms.knowledge.dedup.minhash import CHUNK, CONTENT, Node, RecordKey, record_key
from transforms.knowledge.dedup.paragraphs import Keeper
from transforms.knowledge.quality import text_hash

DECISIONS = "dedup-decisions"  # under the staging directory: one file per chunk with decisions
DROPS, UNITS = "drops", "units"  # the two kinds of decision, as WriteDecisions takes them
SURVIVORS = "survivors"  # the copies counted per survivor, grouped with them by chunk
# A drop names the document (input, file, position) and its text hash; a unit to remove names
# its hash (``unit``) and leaves those null. Both name the document that is kept (kept_*). A
# survivor's row names the survivor like a drop, the reason of the copies dropped in favour of
# it and how many (``copies``), with kept_* and ``unit`` null.
_DECISION_SCHEMA = pa.schema([
    ("input", pa.int64()), ("file", pa.int64()), ("position", pa.int64()),
    ("digest", pa.binary(16)), ("reason", pa.string()),
    ("kept_input", pa.int64()), ("kept_file", pa.int64()), ("kept_position", pa.int64()),
    ("unit", pa.uint64()), ("copies", pa.int64()),
])
# (surviving document, reason, copies dropped in favour of it for that reason)
Survivor = tuple[Node, str, int]
# A document's copies by reason, as the kept record carries them (``Record.duplicates``).
Copies = tuple[tuple[str, int], ...]


def decisions_path(directory: str, chunk: int) -> str:
    return FileSystems.join(directory, f"{chunk & 0xFFFFFFFFFFFFFFFF:016x}.arrow")


def write_decisions(chunk: int, drops: Iterable[Decision], units: Iterable[Keeper],
                    directory: str, survivors: Iterable[Survivor] = ()) -> str:
    """One chunk's decisions, sorted, to its file (a retried bundle writes the same bytes);
    the path out."""
    rows = [(*node[:CHUNK], node[CONTENT], reason, *kept[:CHUNK], None, None)
            for node, reason, kept in sorted(drops)]
    rows += [(None, None, None, None, None, *kept, unit, None) for unit, kept in sorted(units)]
    rows += [(*node[:CHUNK], node[CONTENT], reason, None, None, None, None, copies)
             for node, reason, copies in sorted(survivors)]
    columns = list(zip(*rows, strict=True))
    path = decisions_path(directory, chunk)
    write_arrow(path, pa.table(dict(zip(_DECISION_SCHEMA.names, columns, strict=True)),
                               schema=_DECISION_SCHEMA))
    return path


def _write_chunk(group: tuple[int, Mapping[str, Iterable]], directory: str) -> str:
    chunk, found = group
    return write_decisions(chunk, found.get(DROPS, ()),
                           (keeper for batch in found.get(UNITS, ()) for keeper in batch),
                           directory, found.get(SURVIVORS, ()))


def copy_of(decision: Decision) -> tuple[tuple[Node, str], int]:
    """One copy, keyed by the document it was dropped in favour of and its reason."""
    _, reason, kept = decision
    return (kept, reason), 1


def to_survivor_chunk(counted: tuple[tuple[Node, str], int]) -> tuple[int, Survivor]:
    """A survivor's count of copies of one reason, keyed by the survivor's own chunk: the
    file that the main pass reads when it meets the survivor."""
    (kept, reason), copies = counted
    return kept[CHUNK], (kept, reason, copies)


class CountCopies(beam.PTransform):
    """Decisions in; (survivor's chunk, ``Survivor``) out, per survivor and reason. Summed
    per key through the shuffle with a combiner, so a survivor of 10^5 copies costs one int
    on the worker that sums them, not a list."""

    def expand(self, drops: beam.PCollection) -> beam.PCollection:
        return (drops
                # an earlier run's survivor (input -1, --dedup_against) has no file here
                | "ThisRunsSurvivors" >> beam.Filter(lambda decision: decision[2][0] >= 0)
                | "BySurvivor" >> beam.Map(copy_of)
                | "Sum" >> beam.CombinePerKey(sum)
                | "BySurvivorChunk" >> beam.Map(to_survivor_chunk))


class WriteDecisions(beam.PTransform):
    """``{DROPS: decisions, UNITS: (chunk, [Keeper, ...]) batches}`` in (either may be absent),
    grouped by chunk and written to one file per chunk; the paths out. Each drop also counts
    for its survivor (``CountCopies``), in the survivor's chunk's file."""

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory

    def expand(self, decisions: Mapping[str, beam.PCollection]) -> beam.PCollection:
        keyed = dict(decisions)
        if DROPS in keyed:
            keyed[SURVIVORS] = keyed[DROPS] | "CountCopies" >> CountCopies()
            keyed[DROPS] = keyed[DROPS] | "ByChunk" >> beam.Map(
                lambda decision: (decision[0][CHUNK], decision))
        return (keyed
                | "GroupByChunk" >> beam.CoGroupByKey()
                | "Write" >> beam.Map(_write_chunk, self.directory))


@dataclasses.dataclass(frozen=True)
class ChunkDecisions:
    """The decisions of one chunk, as the main pass reads them back: the drops by record key,
    each with the hash of the text it was made for, its reason and the surviving record's key;
    the boilerplate units by hash, each with the key of the one document that keeps it; the
    survivors by record key, each with the hash of its text and its copies by reason."""

    drops: Mapping[RecordKey, tuple[bytes, str, RecordKey]]
    units: Mapping[int, RecordKey] = dataclasses.field(default_factory=dict)
    survivors: Mapping[RecordKey, tuple[bytes, Copies]] = dataclasses.field(
        default_factory=dict)

    @classmethod
    def read(cls, path: str) -> ChunkDecisions:
        """The file's decisions; none without a file (a chunk with nothing to drop)."""
        if not FileSystems.exists(path):
            return cls({})
        drops, units, survivors = {}, {}, {}
        for row in read_arrow(path).to_pylist():
            key = (row["input"], row["file"], row["position"])
            kept = (row["kept_input"], row["kept_file"], row["kept_position"])
            if row["copies"] is not None:  # sorted: a survivor's reasons come in order
                digest, copies = survivors.get(key, (row["digest"], ()))
                survivors[key] = digest, (*copies, (row["reason"], row["copies"]))
            elif row["unit"] is None:
                drops[key] = (row["digest"], row["reason"], kept)
            else:
                units[row["unit"]] = kept
        return cls(drops, units, survivors)

    def verdict(self, record: Record, files: Sequence[str],
                file_numbers: Mapping[str, int], earlier: Sequence[str] = (),
                text: str | None = None) -> Drop | None:
        """The ``Drop`` of a record to drop (its message names the surviving copy, in this run
        or in one of the ``earlier`` runs' indexes), else None. A decision counts only for the
        text it was made for (the record's own, or ``text``: a conversation's), so a stale file
        drops nothing."""
        found = self.drops.get(record_key(record, file_numbers))
        if found is None or found[0] != text_hash(record.value if text is None else text):
            return None
        _, reason, kept = found
        if reason == DUPLICATE_EARLIER_RUN:
            return Drop(reason, earlier_message(kept, earlier))
        index, number, position = kept
        return Drop(reason, f"copy of the document at position {position} of {files[number]} "
                            f"(input {index})")

    def credited(self, record: Record, file_numbers: Mapping[str, int]) -> Record:
        """The record with the copies dropped in favour of it (``Record.duplicates``); as it
        is for a record that has none, or whose text is not the one they were found for."""
        found = self.survivors.get(record_key(record, file_numbers))
        if found is None or found[0] != text_hash(record.value):
            return record
        return replaced(record, duplicates=found[1])
