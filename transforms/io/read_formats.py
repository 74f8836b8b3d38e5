"""Stream one planned shard as ``RecordChunk``s: the line-delimited, JSON, CSV, Parquet and text
readers behind ``read_shard``.

``read_shard`` streams one shard (see ``planning``) into bounded chunks whose ids come from the
input alone (seqio's ``Create(shards) | FlatMap(read)`` pattern). Bad data never raises out of
``read_shard``: it comes out as a ``Record`` with an ``error``, so the manifest can account for it.

Files are opened through ``compression.open_input``, which reports a truncated or corrupt stream
instead of ending quietly; the readers below report it as ``unreadable_file``.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import (
    RAW_CAP_BYTES,
    Record,
    RecordChunk,
    ShardSpec,
)
from transforms.core.vocabulary import (
    INVALID_UTF8,
    MALFORMED_CSV,
    MALFORMED_JSON,
    RECORD_TOO_LARGE,
    TOO_DEEPLY_NESTED,
    UNREADABLE_FILE,
    Drop,
)
from transforms.io.compression import (
    BLOCK,
    READ_ERRORS,
    open_input,
    uncompressed_name,
)
from transforms.io.json_values import (
    JSON_ERRORS,
    is_utf8,
    may_hold_lone_surrogate,
    may_nest_too_deeply,
    parse_error_message,
    unfit_record,
)

MiB = 1 << 20
DEFAULT_CHUNK_RECORDS = 1000
DEFAULT_CHUNK_BYTES = 8 * MiB
DEFAULT_MAX_RECORD_BYTES = 16 * MiB

_BOM = b"\xef\xbb\xbf"
_LOOKBACK_BLOCK = 1 << 12  # bytes read per step when looking back for a line start
_TRUNCATED = "...[truncated]"  # the marker records.raw_text uses
_BLANK_RUN = re.compile(rb"[ \t\r\x0b\x0c\n]*\n")  # blank lines, as bytes.isspace() sees them


# --------------------------------------------------------------------------- reading


def read_shard(
    shard: ShardSpec,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[RecordChunk]:
    """Stream one shard as chunks of at most ``chunk_records`` records or about ``chunk_bytes``.

    Chunk ids are ``{shard_id}:{n:06d}`` so they sort in input order. Memory is bounded by the
    chunk and ``max_record_bytes``, except for JSON files, which are parsed whole. Data problems
    (bad JSON, bad UTF-8, oversized or ragged records, corrupt or truncated files) come out as
    records with an ``error``; a file that breaks mid-way yields one ``unreadable_file`` record at
    the position reached and ends the shard.
    """
    if min(chunk_records, chunk_bytes, max_record_bytes) < 1:
        raise ValueError("chunk_records, chunk_bytes and max_record_bytes must be positive")
    if shard.format not in _READERS:
        raise ValueError(f"{shard.path!r}: unknown format {shard.format!r}")
    batch: list[Record] = []
    size = 0
    number = 0
    for record, nbytes in _read_records(shard, max_record_bytes):
        batch.append(record)
        size += nbytes
        if len(batch) >= chunk_records or size >= chunk_bytes:
            yield RecordChunk(f"{shard.shard_id}:{number:06d}", tuple(batch))
            batch, size, number = [], 0, number + 1
    if batch:
        yield RecordChunk(f"{shard.shard_id}:{number:06d}", tuple(batch))


@dataclasses.dataclass
class _Cursor:
    """How far a reader has got, so that a failure is reported where it happened."""

    position: int


# A reader yields (record, bytes of input it stands for) and keeps the cursor up to date.
_Reader = Callable[[ShardSpec, _Cursor, int], Iterator[tuple[Record, int]]]


def _read_records(shard: ShardSpec, limit: int) -> Iterator[tuple[Record, int]]:
    line_based = shard.format == "jsonl" or (shard.format == "text" and shard.text_unit != "file")
    cursor = _Cursor(shard.start if line_based else 0)
    try:
        yield from _READERS[shard.format](shard, cursor, limit)
    except READ_ERRORS as error:
        message = f"{type(error).__name__}: {error}"
        yield _failed(shard, cursor.position, UNREADABLE_FILE, message, ""), 0


def limit_option(limit: int) -> str:
    """The record size limit as the option that sets it, so a message says what to change."""
    return f"--max_record_mb={limit / MiB:g} ({limit:,} bytes)"


def _failed(shard: ShardSpec, position: int, reason: str, message: str, raw: str) -> Record:
    return Record(shard.source, position, shard.input_index, error=Drop(reason, message), raw=raw)


def _raw(data: bytes, truncated: bool = False) -> str:
    """Capped text of a bad record, marked the way records.raw_text marks truncation."""
    text = data[:RAW_CAP_BYTES].decode("utf-8", "replace")
    return text + _TRUNCATED if truncated or len(data) > RAW_CAP_BYTES else text


def _raw_text(text: str) -> str:
    """Capped text of a bad record: bytes carried as surrogate escapes (CSV) come out replaced,
    a lone surrogate from a JSON escape as that escape."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "backslashreplace")
    return _raw(data)


# ----------------------------------------------------------------- line-delimited input


@dataclasses.dataclass(frozen=True)
class _Line:
    offset: int  # of the line's first byte
    data: bytes  # without the newline; when too_long, a prefix of at most RAW_CAP_BYTES
    size: int  # full length without the newline
    blank: bool  # empty or ASCII whitespace only
    too_long: bool


def _lines(stream: BinaryIO, offset: int, cursor: _Cursor, limit: int) -> Iterator[_Line]:
    """Split a byte stream at ``\\n`` without ever holding much more than ``limit`` bytes.

    A line longer than ``limit`` keeps only a capped prefix while the rest streams past. A UTF-8
    BOM at offset 0 is skipped, so the first record's offset is that of its first real byte.
    """
    parts: list[bytes] = []
    size = 0
    blank = True
    start = cursor.position = offset
    while block := stream.read1(BLOCK):  # read1: a later failure keeps what came before
        if start == 0 and size == 0:  # the first block: look for a BOM, however it was cut
            block += stream.read(max(0, len(_BOM) - len(block)))
            if block.startswith(_BOM):
                block = block[len(_BOM) :]
                start = cursor.position = len(_BOM)
        pos = 0
        while True:
            if size == 0 and start != offset and (run := _BLANK_RUN.match(block, pos)):
                # At a line start, a run of blank lines is one blank line: a file of newlines
                # reads at the speed of the regex, not a loop turn per line. Not the first
                # line: ``offset`` may be inside a line, whose rest is a line of its own.
                yield _Line(start, b"", 0, True, False)
                start += run.end() - pos
                cursor.position = start
                parts, blank = [], True
                pos = run.end()
                continue
            newline = block.find(b"\n", pos)
            piece = block[pos:] if newline < 0 else block[pos:newline]
            blank = blank and (not piece or piece.isspace())
            if size + len(piece) <= limit:
                parts.append(piece)
            elif size <= limit:  # this piece makes the line too long: keep a prefix only
                parts = [b"".join([*parts, piece])[:RAW_CAP_BYTES]]
            size += len(piece)
            if newline < 0:
                break
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            yield _Line(start, data, size, blank, size > limit)
            start += size + 1
            cursor.position = start
            parts, size, blank = [], 0, True
            pos = newline + 1
    if size:
        yield _Line(start, b"".join(parts), size, blank, size > limit)


def _first_lines(
    shard: ShardSpec, stream: BinaryIO, cursor: _Cursor, limit: int
) -> tuple[Iterator[_Line], bool]:
    """The lines that start at or after ``shard.start``, and whether the line before is blank.

    The rest of a line that began before ``start`` is skipped: the previous range's reader owns
    it. Paragraph readers need to know if that line was blank (the start of the file counts as
    blank), which may take a look back past ``start``. Ranges that start within the first bytes
    read from 0, so that a BOM is seen the same way by every range.
    """
    if shard.start <= len(_BOM):
        lines = _lines(stream, 0, cursor, limit)
        previous_blank = True
        for line in lines:
            if line.offset >= shard.start:
                return itertools.chain([line], lines), previous_blank
            previous_blank = line.blank
        return lines, previous_blank
    stream.seek(shard.start - 1)
    lines = _lines(stream, shard.start - 1, cursor, limit)
    tail = next(lines, None)
    if tail is None or not tail.blank:
        return lines, tail is None
    resume = stream.tell()
    head_blank = _line_head_blank(stream, shard.start - 1)
    stream.seek(resume)  # the generator goes on reading from where it was
    return lines, head_blank


def _line_head_blank(stream: BinaryIO, pos: int) -> bool:
    """Whether the bytes from the start of the line holding ``pos`` up to ``pos`` are blank.

    Reads backwards in small steps and stops at the first newline or non-blank byte.
    """
    while pos > 0:
        low = max(0, pos - _LOOKBACK_BLOCK)
        stream.seek(low)
        data = stream.read(pos - low)
        if low == 0:
            data = data.removeprefix(_BOM)
        newline = data.rfind(b"\n")
        rest = data[newline + 1 :]
        if rest and not rest.isspace():
            return False
        if newline >= 0:
            return True
        pos = low
    return True


def _text_value(shard: ShardSpec, line: _Line, limit: int) -> Record | str:
    """The line decoded, or an error record when it is too long or not UTF-8."""
    if line.too_long:
        message = f"line of {line.size} bytes exceeds {limit_option(limit)}"
        return _failed(shard, line.offset, RECORD_TOO_LARGE, message, _raw(line.data, True))
    try:
        return line.data.decode("utf-8")
    except UnicodeDecodeError as error:
        return _failed(shard, line.offset, INVALID_UTF8, str(error), _raw(line.data))


def _read_jsonl(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    with open_input(shard.path) as stream:
        lines, _ = _first_lines(shard, stream, cursor, limit)
        for line in lines:
            if shard.end is not None and line.offset >= shard.end:
                return
            if not line.blank:
                yield _json_line(shard, line, limit), line.size + 1


def _json_line(shard: ShardSpec, line: _Line, limit: int) -> Record:
    text = _text_value(shard, line, limit)
    if isinstance(text, Record):
        return text
    try:
        value = json.loads(text)
    except JSON_ERRORS as error:
        return _failed(shard, line.offset, MALFORMED_JSON, parse_error_message(error),
                       _raw_text(text.rstrip("\r")))
    drop = unfit_record(value, may_nest_too_deeply(text), may_hold_lone_surrogate(text))
    if drop is not None:
        return _failed(shard, line.offset, drop.reason, drop.message,
                       _raw_text(text.rstrip("\r")))
    return Record(shard.source, line.offset, shard.input_index, value=value)


def _read_text_lines(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    with open_input(shard.path) as stream:
        lines, _ = _first_lines(shard, stream, cursor, limit)
        for line in lines:
            if shard.end is not None and line.offset >= shard.end:
                return
            if line.blank:
                continue
            value = _text_value(shard, line, limit)
            if isinstance(value, str):
                value = Record(shard.source, line.offset, shard.input_index,
                               value=value.rstrip("\r"))
            yield value, line.size + 1


class _Paragraph:
    """Consecutive non-blank lines; once past ``limit`` bytes, later lines are not kept."""

    def __init__(self, first: _Line, limit: int) -> None:
        self.offset = first.offset
        self.size = 0
        self.too_long = False
        self._limit = limit
        self._lines: list[bytes] = []
        self.add(first)

    def add(self, line: _Line) -> None:
        self.size = line.offset + line.size - self.offset
        if not self.too_long:
            self._lines.append(line.data.removesuffix(b"\r"))
            self.too_long = line.too_long or self.size > self._limit

    def record(self, shard: ShardSpec) -> Record:
        data = b"\n".join(self._lines)
        if self.too_long:
            message = f"paragraph of {self.size} bytes exceeds {limit_option(self._limit)}"
            return _failed(shard, self.offset, RECORD_TOO_LARGE, message, _raw(data, True))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            return _failed(shard, self.offset, INVALID_UTF8, str(error), _raw(data))
        return Record(shard.source, self.offset, shard.input_index, value=text)


def _read_paragraphs(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    """Blocks of non-blank lines; a block belongs to the range where its first byte lies.

    A line starts a paragraph when it follows a blank line or the start of the file. For a
    range that starts mid-file that means looking at the whole line before the first full line,
    which may begin before ``start``; otherwise two readers could disagree about a boundary.
    """
    with open_input(shard.path) as stream:
        lines, after_blank = _first_lines(shard, stream, cursor, limit)
        paragraph: _Paragraph | None = None
        for line in lines:
            if line.blank:
                if paragraph is not None:
                    yield paragraph.record(shard), paragraph.size
                    paragraph = None
                after_blank = True
                continue
            if paragraph is not None:
                paragraph.add(line)
            elif after_blank:
                if shard.end is not None and line.offset >= shard.end:
                    return
                paragraph = _Paragraph(line, limit)
            after_blank = False
        if paragraph is not None:
            yield paragraph.record(shard), paragraph.size


def _read_text_file(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    with open_input(shard.path) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        message = f"file exceeds {limit_option(limit)}"
        yield _failed(shard, 0, RECORD_TOO_LARGE, message, _raw(data)), len(data)
        return
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        yield _failed(shard, 0, INVALID_UTF8, str(error), _raw(data)), len(data)
        return
    if text:
        yield Record(shard.source, 0, shard.input_index, value=text), len(data)


_TEXT_READERS: dict[str, _Reader] = {
    "file": _read_text_file,
    "line": _read_text_lines,
    "paragraph": _read_paragraphs,
}


def _read_text(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    return _TEXT_READERS[shard.text_unit](shard, cursor, limit)


# ----------------------------------------------------------------- whole-file formats


def _read_json(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    """A top-level array (one record per element) or a single object, parsed whole.

    The whole file is in memory while it is parsed: JSON arrays cannot be split safely. So the
    document is one record for ``--max_record_mb``: a larger one (say a small ``.gz`` that
    inflates to gigabytes) is refused after reading ``limit`` bytes, never held. A file that
    does not parse is one ``malformed_json`` record: a partial prefix would be misleading. An
    empty or all-whitespace file holds no records.
    """
    with open_input(shard.path) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        message = (f"JSON document exceeds {limit_option(limit)}; a .json file is parsed whole: "
                   "write it as JSON Lines (.jsonl) or raise the limit")
        yield _failed(shard, 0, RECORD_TOO_LARGE, message, _raw(data, True)), len(data)
        return
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        yield _failed(shard, 0, INVALID_UTF8, str(error), _raw(data)), len(data)
        return
    if not text.strip():
        return
    try:
        value = json.loads(text)
    except JSON_ERRORS as error:
        yield _failed(shard, 0, MALFORMED_JSON, parse_error_message(error), _raw(data)), len(data)
        return
    items = value if isinstance(value, list) else [value]
    share = max(1, len(data) // max(1, len(items)))  # chunk_bytes needs a size per record
    surrogates = may_hold_lone_surrogate(text)
    del data, text
    for index, item in enumerate(items):
        cursor.position = index
        drop = unfit_record(item, True, surrogates)
        if drop is None:
            yield Record(shard.source, index, shard.input_index, value=item), share
        else:  # a value too deep to pickle is not written back either
            raw = ("" if drop.reason == TOO_DEEPLY_NESTED
                   else _raw_text(json.dumps(item, ensure_ascii=False)))
            yield _failed(shard, index, drop.reason, drop.message, raw), share


class _CsvLines:
    """Feeds ``csv.reader`` physical lines and remembers the text of the row being parsed.

    Refuses (with ``_RowTooLarge``) a row longer than the limit, skipping the rest of its line
    in bounded pieces; ``csv.reader`` resets its state on the next call, so reading goes on.
    Blank lines between rows are no rows: a run of them is skipped a block at a time, so a
    file of newlines reads at disk speed rather than a row at a time.
    """

    def __init__(self, text: io.TextIOBase, limit: int) -> None:
        self._text = text
        self._limit = limit
        self._row: list[str] = []
        self._size = 0
        self._pending: io.StringIO | None = None  # text read ahead past blank lines

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = self._readline(self._limit + 1 - self._size)
        if not self._row and line in _BLANK_LINES:  # between rows
            self._skip_blank_lines()
            line = self._readline(self._limit + 1)
        if not line:
            raise StopIteration
        self._size += len(line)
        if self._size > self._limit:
            self._row = [("".join(self._row) + line)[:RAW_CAP_BYTES]]
            while line and not line.endswith(("\n", "\r")):
                line = self._readline(BLOCK)
                self._size += len(line)
            raise _RowTooLarge(f"row of {self._size}+ characters exceeds "
                               f"{limit_option(self._limit)}")
        self._row.append(line)
        return line

    def _readline(self, size: int) -> str:
        if self._pending is None:
            return self._text.readline(size)
        line = self._pending.readline(size)
        if len(line) == size or line.endswith(("\n", "\r")):
            return line
        self._pending = None  # read out: the line goes on in the stream
        return line + self._text.readline(size - len(line))

    def _skip_blank_lines(self) -> None:
        """Reads past line ends up to the next other character, keeping the text from there."""
        rest = ""
        while not rest:
            block = self._pending.read() if self._pending is not None else ""
            self._pending = None
            block = block or self._text.read(BLOCK)
            if not block:
                break
            rest = block.lstrip("\r\n")
        self._pending = io.StringIO(rest, newline="") if rest else None

    def take(self) -> tuple[str, int]:
        """The text of the row just read and its full size; starts the next row."""
        row, size = "".join(self._row), self._size
        self._row, self._size = [], 0
        return row, size


_BLANK_LINES = ("\n", "\r\n", "\r")


class _RowTooLarge(Exception):
    pass


def _read_csv(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    """Header row, then one dict of strings per row; ``.tsv`` files are tab-separated.

    Bytes that are not UTF-8 are carried through the csv module as surrogate escapes so that a
    bad byte rejects its row (``invalid_utf8``) rather than the rest of the file.
    """
    # The csv module caps fields at 128 KiB process-wide; documents in CSV can be longer.
    csv.field_size_limit(max(csv.field_size_limit(), limit))
    tsv = uncompressed_name(shard.path).endswith(".tsv")
    with open_input(shard.path) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
        lines = _CsvLines(text, limit)
        reader = csv.reader(lines, csv.excel_tab if tsv else csv.excel)
        header: list[str] | None = None
        header_error: Drop | None = None  # a fault of the header, which rejects every row
        index = 0
        while True:
            cursor.position = index
            row: list[str] | None = None
            error: Drop | None = None
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                error = Drop(MALFORMED_CSV, f"csv: {exc}")
            except _RowTooLarge as exc:
                error = Drop(RECORD_TOO_LARGE, str(exc))
            raw, size = lines.take()
            raw = raw.rstrip("\r\n")
            if row == []:
                continue  # a blank line
            if error is None and not is_utf8(raw):
                error = Drop(INVALID_UTF8, "row contains bytes that are not UTF-8")
            if header is None:
                if error is not None:
                    message = f"header: {error.message}"
                    yield _failed(shard, 0, error.reason, message, _raw_text(raw)), size
                    return
                header = row
                header_error = _header_error(header)
                continue
            error = error or header_error
            if error is None and len(row) != len(header):
                error = Drop(MALFORMED_CSV, f"row has {len(row)} fields, header has {len(header)}")
            if error is None:
                yield (
                    Record(
                        shard.source, index, shard.input_index, dict(zip(header, row, strict=True))
                    ),
                    size,
                )
            else:
                data = raw.encode("utf-8", "surrogateescape")
                raw = _raw(data, truncated=error.reason == RECORD_TOO_LARGE)
                yield _failed(shard, index, error.reason, error.message, raw), size
            index += 1


def _header_error(header: list[str]) -> Drop | None:
    """A header that names a column twice: a row as a dict would keep only the last value, so
    every row of the file is refused rather than read wrong."""
    repeated = sorted(name for name, count in collections.Counter(header).items() if count > 1)
    if not repeated:
        return None
    names = ", ".join(repr(name) for name in repeated)
    return Drop(MALFORMED_CSV, f"the header names column {names} more than once; "
                               "rename the copies so that each column has its own name")


def _read_parquet(shard: ShardSpec, cursor: _Cursor, limit: int) -> Iterator[tuple[Record, int]]:
    """Rows of the planned row groups; positions count rows from the start of the file.

    Row groups are read one at a time: one that cannot be read (a corrupt page) costs only its
    own rows, each one ``unreadable_file`` record (the footer says how many), and reading goes
    on with the next. A footer that cannot be read is one record for the whole file.
    """
    with FileSystems.open(shard.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        parquet = pq.ParquetFile(f)
        meta = parquet.metadata
        end = meta.num_row_groups if shard.end is None else shard.end
        first = sum(meta.row_group(i).num_rows for i in range(shard.start))
        for group in range(shard.start, end):
            cursor.position = first
            first += meta.row_group(group).num_rows  # now the first row of the next group
            try:
                for batch in parquet.iter_batches(row_groups=[group], use_threads=False):
                    share = max(1, batch.nbytes // max(1, batch.num_rows))
                    for row in batch.to_pylist():
                        yield Record(shard.source, cursor.position, shard.input_index,
                                     value=row), share
                        cursor.position += 1
            except READ_ERRORS as error:
                message = f"row group {group} cannot be read: {type(error).__name__}: {error}"
                for position in range(cursor.position, first):
                    yield _failed(shard, position, UNREADABLE_FILE, message, ""), 1


_READERS: dict[str, _Reader] = {
    "jsonl": _read_jsonl,
    "json": _read_json,
    "csv": _read_csv,
    "parquet": _read_parquet,
    "text": _read_text,
}
