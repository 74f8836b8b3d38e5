"""The data model that flows through the graph: input specs, shards, records and rejections.

Everything here is a plain, picklable value so that any Beam runner can move it between workers.
A record is always carried inside a ``RecordChunk``: a bounded, ordered slice of one input shard
whose id is derived from the input alone. Chunks are the unit of batching, of block concatenation
and of packing, which is what makes the output independent of runner, worker count and bundles.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from transforms.core.chunks import Chunk
from transforms.core.vocabulary import Drop

# Fields a declared mapping may fill (``#prompt=question``): what classification and the
# instruction adapters read.
CANONICAL_FIELDS = ("text", "messages", "conversations", "tools", "prompt", "response",
                    "completion", "instruction", "input", "output", "system", "chosen",
                    "reasoning", "url")
TEXT_UNITS = ("file", "line", "paragraph")

RAW_CAP_BYTES = 4096  # how much of a rejected record's raw text is kept in rejected/


# Source names and phase names: they become counter names and directory names.
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One ``--input`` value: a path pattern plus what the user declared about it.

    Declarations follow the pattern after a ``#`` as ``key=value`` pairs separated by ``;``:
    ``data/gsm8k.jsonl#branch=instruction;prompt=question;response=answer``. ``branch``,
    ``format``, ``text_unit``, ``name``, ``weight``, ``phase`` and ``license`` are settings;
    every other key maps a canonical field (``text``, ``prompt``, ``response``, ``system``,
    ``messages``, ...) to a field of the input.
    """

    index: int
    pattern: str
    branch: str | None = None
    format: str | None = None
    text_unit: str = "file"
    name: str | None = None
    fields: tuple[tuple[str, str], ...] = ()
    weight: float | None = None  # relative share of the branch's tokens (see mixing)
    phase: str | None = None  # curriculum phase: its own output directory and manifest
    license: str | None = None  # declared licence identifier, for the dataset card

    @property
    def field_map(self) -> dict[str, str]:
        return dict(self.fields)


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """A deterministic unit of reading: a whole file, a byte range, or a range of row groups."""

    input_index: int
    path: str
    format: str
    text_unit: str = "file"
    start: int = 0  # byte offset (line formats) or first row group (Parquet)
    end: int | None = None  # exclusive; None means to the end of the file

    @property
    def source(self) -> str:
        """The path as text every output can hold: a file name that is not UTF-8 (os.listdir
        gives its bytes as surrogate escapes) shows those bytes as ``\\xNN``."""
        return printable(self.path)

    @property
    def shard_id(self) -> str:
        return f"{self.input_index:03d}:{self.source}:{self.start:015d}"


def printable(text: str) -> str:
    """``text``, with what UTF-8 cannot encode written as backslash escapes so that JSON,
    Parquet and hashes of it never raise: bytes a file name carries as surrogate escapes as
    ``\\xNN``, a lone surrogate from a JSON escape as ``\\udNNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclasses.dataclass(frozen=True)
class Record:
    """One input record with its provenance.

    ``position`` is the byte offset of the record's first byte for line-delimited files (JSONL,
    text read by line or paragraph) and the 0-based record index for everything else (JSON
    arrays, CSV rows, Parquet rows; 0 for a whole text file). ``value`` is the parsed object
    (a dict) or the text; ``error`` is set instead when the record could not be read.
    """

    source: str
    position: int
    input_index: int
    value: Any = None
    error: Drop | None = None  # why the record could not be read
    raw: str | None = None  # the raw text, kept only for records that failed to read
    format: str | None = None  # set by classification: "text" or an instruction format
    url: str | None = None  # a knowledge document's ``url`` field, set by classification
    language: str | None = None  # a knowledge document's language (ISO 639), once identified
    language_score: float | None = None  # the language model's probability for ``language``
    pii: tuple[tuple[str, int], ...] = ()  # personal data found in a document: (kind, spans)
    # copies of a knowledge document dropped in its favour by deduplication: (reason, count)
    duplicates: tuple[tuple[str, int], ...] = ()
    scores: tuple[tuple[str, float], ...] = ()  # --quality_model: (model name, score)

    @property
    def key(self) -> tuple[str, int]:
        return (self.source, self.position)

    @property
    def origin(self) -> Origin:
        return (self.source, self.position, self.input_index)


Origin = tuple[str, int, int]  # (source, position, input index): a record's provenance, compact
_RECORD_FIELDS = frozenset(field.name for field in dataclasses.fields(Record))


def replaced(record: Record, **changes: Any) -> Record:
    """``dataclasses.replace(record, **changes)`` at a quarter of the cost (0.9 us instead of
    3.6, BENCHMARKS.md): a ``Record``'s ``__init__`` only stores its fields, so copying them is
    the same. The branches make one or two per record."""
    unknown = changes.keys() - _RECORD_FIELDS
    if unknown:
        raise TypeError(f"Record has no field(s) {', '.join(sorted(unknown))}")
    copy = object.__new__(type(record))
    copy.__dict__.update(record.__dict__)
    copy.__dict__.update(changes)
    return copy


@dataclasses.dataclass(frozen=True)
class RecordChunk(Chunk):
    """A bounded, ordered slice of one shard. ``chunk_id`` sorts in input order."""

    chunk_id: str
    records: tuple[Record, ...]

    def take(self, indices: Sequence[int]) -> RecordChunk:
        return RecordChunk(self.chunk_id, tuple(self.records[i] for i in indices))


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A record that left the pipeline: why, where it came from, and what it was."""

    source: str
    position: int
    reason: str
    message: str
    raw: str
    input_index: int = -1  # which --input it came from: per-input counts in the manifest

    @classmethod
    def of(cls, record: Record, reason: str, message: str) -> Rejection:
        return cls(record.source, record.position, reason, message, raw_text(record),
                   record.input_index)


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside nested dict values, lists and tuples, in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings_in(item)


def raw_text(record: Record, cap: int = RAW_CAP_BYTES) -> str:
    """The record as text, capped so one huge bad record cannot bloat rejected/."""
    if record.raw is not None:
        text = record.raw
    elif isinstance(record.value, str):
        text = record.value
    else:
        try:
            text = json.dumps(record.value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(record.value)
    text = printable(text)
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text
    return data[:cap].decode("utf-8", "ignore") + "...[truncated]"
