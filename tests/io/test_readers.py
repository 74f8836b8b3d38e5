"""Tests for reading inputs: the --input grammar (transforms/io/input_specs.py), shard planning
(planning.py), compression (compression.py) and streaming every format (read_formats.py).

Real excerpts of the shared data live in tests/data/readers (see SOURCES.md there); broken and
compressed variants are written here, next to the test that needs them.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import itertools
import json
import lzma
import os
import pickle
import tempfile
import tracemalloc
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import TEST_DATA
from transforms.core.records import (
    RAW_CAP_BYTES,
    InputSpec,
    Record,
    ShardSpec,
)
from transforms.core.vocabulary import (
    INVALID_UTF8,
    MALFORMED_CSV,
    MALFORMED_JSON,
    NOT_AN_OBJECT,
    RECORD_TOO_LARGE,
    TOO_DEEPLY_NESTED,
    UNREADABLE_FILE,
    Drop,
)
from transforms.io import planning, read_formats
from transforms.io.compression import file_format
from transforms.io.input_specs import parse_input_spec, split_input_values
from transforms.io.json_values import MAX_JSON_DEPTH
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard

DATA = TEST_DATA / "readers"
C4 = DATA / "c4_sample.jsonl"
KO_CSV = DATA / "ko_chatbot_sample.csv"
ALPACA = DATA / "alpaca_sample.json"
SHAKESPEARE = DATA / "shakespeare_excerpt.txt"

# Checksums as the zstd command line writes them: without one, damage can go unnoticed.
ZSTD = zstandard.ZstdCompressor(write_checksum=True)
COMPRESSORS = {
    ".gz": gzip.compress,
    ".zst": ZSTD.compress,
    ".zstd": ZSTD.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
}


def read_all(value: str, target: int = 1 << 26, **kwargs) -> list[Record]:
    """Plan ``value`` (an --input string) and read every shard, in order."""
    shards = plan_shards([parse_input_spec(0, value)], target)
    return [r for shard in shards for chunk in read_shard(shard, **kwargs) for r in chunk.records]


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def errors(records: list[Record]) -> list[tuple[int, str]]:
    return [(r.position, r.error.reason) for r in records if r.error]


def line_at(path: Path | str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.readline()


# ------------------------------------------------------------------------------ input specs


def test_parse_input_spec_plain_pattern():
    assert parse_input_spec(3, " gs://bucket/c4/*.jsonl.gz ") == InputSpec(
        index=3, pattern="gs://bucket/c4/*.jsonl.gz"
    )


def test_parse_input_spec_settings_and_field_mappings():
    spec = parse_input_spec(
        1,
        "data/gsm8k.jsonl#branch=instruction; response=answer;prompt=question;"
        "name=gsm8k;format=jsonl;",
    )
    assert spec == InputSpec(
        index=1,
        pattern="data/gsm8k.jsonl",
        branch="instruction",
        format="jsonl",
        name="gsm8k",
        fields=(("prompt", "question"), ("response", "answer")),
    )
    assert spec.field_map == {"prompt": "question", "response": "answer"}
    assert parse_input_spec(0, "books/*.txt#text_unit=paragraph").text_unit == "paragraph"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a.jsonl#branch=pretrain", "branch='pretrain' is not one of knowledge, instruction"),
        ("a.jsonl#format=xml", "format='xml' is not one of"),
        ("a.txt#text_unit=sentence", "text_unit='sentence' is not one of"),
        ("a.jsonl#branch", "'branch' is not key=value"),
        ("a.jsonl#=x", "'=x' is not key=value"),
        ("a.jsonl#prompt=", "'prompt=' is not key=value"),
        ("a.jsonl#prompt=q;prompt=r", "'prompt' is declared twice"),
        ("#format=jsonl", "the path pattern is empty"),
        ("a.csv#format=csv;text_unit=line", "text_unit applies only to format=text"),
    ],
)
def test_parse_input_spec_errors(value, message):
    with pytest.raises(ValueError, match="--input") as info:
        parse_input_spec(0, value)
    assert message in str(info.value)


def test_split_input_values():
    assert split_input_values(["a.jsonl, b/*.txt#text_unit=line,, ", "c.csv", " "]) == [
        "a.jsonl",
        "b/*.txt#text_unit=line",
        "c.csv",
    ]


# ------------------------------------------------------------------------------ formats


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("a.jsonl", "jsonl"),
        ("gs://b/a.ndjson.gz", "jsonl"),
        ("A.JSON", "json"),
        ("x.parquet", "parquet"),
        ("x.txt.zst", "text"),
        ("x.text.zstd", "text"),
        ("README.md", "text"),
        ("x.csv.bz2", "csv"),
        ("x.tsv.xz", "csv"),
    ],
)
def test_detect_format(path, fmt):
    assert file_format(path) == fmt


@pytest.mark.parametrize("path", ["data/dump.xml", "data/archive.gz", "data/noext"])
def test_detect_format_unknown_names_the_file(path):
    with pytest.raises(ValueError, match="declare it on the input") as info:
        file_format(path)
    assert repr(path) in str(info.value)


# ------------------------------------------------------------------------------ planning


def test_plan_fails_fast_on_a_pattern_matching_nothing(tmp_path):
    write(tmp_path / "a.jsonl", b"{}\n")
    pattern = str(tmp_path / "missing*.jsonl")
    with pytest.raises(ValueError, match="matches no files") as info:
        plan_shards([parse_input_spec(0, str(tmp_path / "a.jsonl")), parse_input_spec(1, pattern)])
    assert pattern in str(info.value)


def test_plan_rejects_unknown_extension_unless_format_declared(tmp_path):
    path = write(tmp_path / "dump.data", b'{"a": 1}\n')
    with pytest.raises(ValueError, match=r"dump\.data"):
        plan_shards([parse_input_spec(0, path)])
    assert plan_shards([parse_input_spec(0, path + "#format=jsonl")]) == [
        ShardSpec(0, path, "jsonl")
    ]


def test_plan_is_sorted_and_deterministic(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt", "d.csv.gz"):
        write(tmp_path / name, b'{"x": 1}\n')
    specs = [
        parse_input_spec(0, str(tmp_path / "*.jsonl")),
        parse_input_spec(1, str(tmp_path / "c.txt") + "#text_unit=line"),
        parse_input_spec(2, str(tmp_path / "d.csv.gz")),
    ]
    shards = plan_shards(specs)
    assert shards == plan_shards(specs)
    assert [(s.input_index, Path(s.path).name, s.format, s.text_unit) for s in shards] == [
        (0, "a.jsonl", "jsonl", "file"),
        (0, "b.jsonl", "jsonl", "file"),
        (1, "c.txt", "text", "line"),
        (2, "d.csv.gz", "csv", "file"),
    ]


def test_plan_splits_uncompressed_line_formats_into_byte_ranges(tmp_path):
    size = C4.stat().st_size
    shards = plan_shards([parse_input_spec(0, str(C4))], target_shard_bytes=4000)
    assert len(shards) == -(-size // 4000)
    assert shards[0].start == 0 and shards[-1].end is None
    assert all(a.end == b.start for a, b in itertools.pairwise(shards))
    assert all(s.end is None or 0 < s.end - s.start <= 4000 for s in shards)
    # one shard per file: compressed, JSON, CSV, text read whole
    gz = write(tmp_path / "c4.jsonl.gz", gzip.compress(C4.read_bytes()))
    for value in (gz, str(ALPACA), str(KO_CSV), str(SHAKESPEARE)):
        assert len(plan_shards([parse_input_spec(0, value)], target_shard_bytes=100)) == 1
    for unit in ("line", "paragraph"):
        spec = parse_input_spec(0, f"{SHAKESPEARE}#text_unit={unit}")
        assert len(plan_shards([spec], target_shard_bytes=100)) == 10


def parquet_file(tmp_path: Path, rows: int = 10, group: int = 3) -> tuple[str, list[dict]]:
    table = pa.table({"id": list(range(rows)), "text": [f"row {i} " * 20 for i in range(rows)]})
    path = str(tmp_path / "rows.parquet")
    pq.write_table(table, path, row_group_size=group)
    return path, table.to_pylist()


def test_plan_splits_parquet_by_row_groups(tmp_path):
    path, _ = parquet_file(tmp_path)  # row groups of 3, 3, 3, 1 rows
    spec = parse_input_spec(0, path)
    assert plan_shards([spec]) == [ShardSpec(0, path, "parquet")]
    assert [(s.start, s.end) for s in plan_shards([spec], 1)] == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, None),
    ]
    meta = pq.ParquetFile(path).metadata
    sizes = [
        sum(meta.row_group(g).column(c).total_compressed_size for c in range(2)) for g in range(4)
    ]
    pairs = plan_shards([spec], sizes[0] + sizes[1])
    assert [(s.start, s.end) for s in pairs] == [(0, 2), (2, None)]


def test_plan_refuses_compressed_parquet(tmp_path):
    path = write(tmp_path / "x.parquet.gz", b"")
    with pytest.raises(ValueError, match="Parquet"):
        plan_shards([parse_input_spec(0, path)])


# ------------------------------------------------------------------------------ each format


def test_jsonl_values_and_byte_offsets():
    records = read_all(str(C4))
    lines = C4.read_bytes().splitlines(keepends=True)
    assert [r.value for r in records] == [json.loads(line) for line in lines]
    assert [r.position for r in records] == [sum(map(len, lines[:i])) for i in range(len(lines))]
    for r in records:
        assert json.loads(line_at(C4, r.position)) == r.value
        assert (r.source, r.input_index, r.error, r.raw) == (str(C4), 0, None, None)


def test_json_array_of_objects():
    records = read_all(str(ALPACA))
    assert [r.value for r in records] == json.loads(ALPACA.read_text())
    assert [r.position for r in records] == [0, 1, 2]
    assert records[0].value["instruction"] == "Describe a process of making crepes."


def test_json_single_object_bom_and_empty(tmp_path):
    obj = write(tmp_path / "one.json", b'\xef\xbb\xbf{"messages": []}')
    assert [(r.position, r.value) for r in read_all(obj)] == [(0, {"messages": []})]
    assert read_all(write(tmp_path / "empty.json", b" \n")) == []


def test_csv_crlf_korean_rows():
    records = read_all(str(KO_CSV))
    with open(KO_CSV, newline="", encoding="utf-8") as f:
        expected = list(csv.DictReader(f))
    assert len(expected) == 8
    assert [r.value for r in records] == expected
    assert [r.position for r in records] == list(range(8))
    assert records[0].value == {"Q": "12시 땡!", "A": "하루가 또 가네요.", "label": "0"}


def test_csv_bom_quoted_newlines_and_tsv(tmp_path):
    data = '\ufeffid,text\r\n1,"two\r\nlines, one field"\r\n\r\n2,plain\r\n'.encode()
    records = read_all(write(tmp_path / "q.csv", data))
    assert [(r.position, r.value) for r in records] == [
        (0, {"id": "1", "text": "two\r\nlines, one field"}),
        (1, {"id": "2", "text": "plain"}),
    ]
    tsv = write(tmp_path / "t.tsv", b"q\ta\nhi, there\thello\n")
    assert [r.value for r in read_all(tsv)] == [{"q": "hi, there", "a": "hello"}]
    assert read_all(write(tmp_path / "header_only.csv", b"a,b\r\n")) == []


def test_parquet_rows_with_absolute_positions(tmp_path):
    path, rows = parquet_file(tmp_path)
    for target in (1, 1 << 26):
        records = read_all(path, target)
        assert [r.value for r in records] == rows
        assert [r.position for r in records] == list(range(10))


def test_text_whole_file():
    (record,) = read_all(str(SHAKESPEARE))
    assert record.value == SHAKESPEARE.read_text()
    assert record.position == 0


def test_text_lines_with_offsets(tmp_path):
    path = write(tmp_path / "l.txt", b"\xef\xbb\xbfone\r\n\r\n  \n two \nthree")
    records = read_all(path + "#text_unit=line")
    assert [(r.position, r.value) for r in records] == [(3, "one"), (13, " two "), (19, "three")]
    for r in records:
        assert line_at(path, r.position).decode().rstrip("\r\n") == r.value


def test_text_paragraphs_real_excerpt():
    records = read_all(f"{SHAKESPEARE}#text_unit=paragraph")
    text = SHAKESPEARE.read_text()
    assert [r.value for r in records] == [p for p in text.split("\n\n") if p.strip()]
    assert records[1].value == "All:\nSpeak, speak."
    for r in records:
        assert line_at(SHAKESPEARE, r.position).decode().rstrip("\n") == r.value.split("\n")[0]


def test_text_paragraphs_crlf_and_whitespace_separators(tmp_path):
    data = b"a\r\nb\r\n\r\n \t\r\n\r\nc\r\n \nd"
    records = read_all(write(tmp_path / "p.txt", data) + "#text_unit=paragraph")
    assert [(r.position, r.value) for r in records] == [(0, "a\nb"), (14, "c"), (19, "d")]


def test_empty_files_have_no_records(tmp_path):
    for name in ("e.jsonl", "e.txt", "e.csv", "e.json", "e.txt.gz"):
        data = gzip.compress(b"") if name.endswith(".gz") else b""
        path = write(tmp_path / name, data)
        for unit in ("file", "line", "paragraph") if ".txt" in name else ("file",):
            suffix = f"#text_unit={unit}" if ".txt" in name else ""
            assert read_all(path + suffix) == []


# ------------------------------------------------------------------------------ compression


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
@pytest.mark.parametrize(
    ("source", "options"),
    [
        (C4, ""),
        (ALPACA, ""),
        (KO_CSV, ""),
        (SHAKESPEARE, ""),
        (SHAKESPEARE, "#text_unit=line"),
        (SHAKESPEARE, "#text_unit=paragraph"),
    ],
)
def test_compressed_reads_like_uncompressed(tmp_path, suffix, source, options):
    path = write(tmp_path / (source.name + suffix), COMPRESSORS[suffix](source.read_bytes()))
    got = [(r.position, r.value, r.error) for r in read_all(path + options)]
    assert got == [(r.position, r.value, r.error) for r in read_all(str(source) + options)]
    assert got


def test_concatenated_gzip_members_and_zstd_frames(tmp_path):
    lines = [b'{"i": %d}\n' % i for i in range(4)]
    gz = write(
        tmp_path / "m.jsonl.gz",
        gzip.compress(b"".join(lines[:2])) + gzip.compress(b"".join(lines[2:])),
    )
    zst = write(tmp_path / "m.jsonl.zst", b"".join(ZSTD.compress(line) for line in lines))
    for path in (gz, zst):
        assert [r.value["i"] for r in read_all(path)] == [0, 1, 2, 3]


def test_bom_split_across_tiny_zstd_frames(tmp_path):
    data = b'\xef\xbb\xbf{"a": 1}\n{"b": 2}\n'
    path = write(
        tmp_path / "b.jsonl.zst",
        b"".join(ZSTD.compress(data[i : i + 1]) for i in range(8)) + ZSTD.compress(data[8:]),
    )
    assert [(r.position, r.value) for r in read_all(path)] == [(3, {"a": 1}), (12, {"b": 2})]


def test_overlong_records_are_never_held_whole(tmp_path):
    line = b"x" * (24 << 20)
    jsonl = write(tmp_path / "m.jsonl", b'{"a": 1}\n{"t": "' + line + b'"}\n{"b": 2}\n')
    text = write(tmp_path / "m.txt.gz", gzip.compress(b"p\n\n" + line + b"\n\nq\n", 1))
    table = write(tmp_path / "m.csv", b"a,b\n1,2\n3," + line + b"\n5,6\n")
    for value in (jsonl, text + "#text_unit=paragraph", text + "#text_unit=line", table):
        tracemalloc.start()
        try:
            records = read_all(value, target=8 << 20, max_record_bytes=1 << 20)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [r.error.reason if r.error else "ok" for r in records] == [
            "ok", RECORD_TOO_LARGE, "ok"]
        assert peak < 8 << 20, (value, peak)


# ------------------------------------------------------------------------------ chunking


def test_chunks_are_bounded_and_ids_sort_in_input_order():
    shard = plan_shards([parse_input_spec(7, str(C4))])[0]
    chunks = list(read_shard(shard, chunk_records=2))
    assert [len(c.records) for c in chunks] == [2, 2, 1]
    assert [c.chunk_id for c in chunks] == [f"{shard.shard_id}:{n:06d}" for n in range(3)]
    assert shard.shard_id == f"007:{C4}:{0:015d}"
    assert sorted(c.chunk_id for c in chunks) == [c.chunk_id for c in chunks]
    sizes = [len(line) for line in C4.read_bytes().splitlines(keepends=True)]
    expected, total = [0], 0  # a chunk closes once its input reaches chunk_bytes
    for size in sizes:
        if total >= 5000:
            expected, total = [*expected, 0], 0
        expected[-1] += 1
        total += size
    by_bytes = list(read_shard(shard, chunk_bytes=5000))
    assert [len(c.records) for c in by_bytes] == expected != [5]
    assert [r for c in by_bytes for r in c.records] == [r for c in chunks for r in c.records]
    assert [len(c.records) for c in read_shard(shard, chunk_bytes=1)] == [1] * 5


def test_chunk_ids_sort_across_byte_range_shards(tmp_path):
    path = write(tmp_path / "n.jsonl", b"".join(b'{"i": %d}\n' % i for i in range(1000)))
    shards = plan_shards([parse_input_spec(0, path)], target_shard_bytes=1000)
    chunks = [c for shard in shards for c in read_shard(shard, chunk_records=7)]
    ordered = sorted(chunks, key=lambda c: c.chunk_id)
    assert [r.value["i"] for c in ordered for r in c.records] == list(range(1000))


def test_read_shard_rejects_bad_arguments():
    shard = ShardSpec(0, str(C4), "jsonl")
    with pytest.raises(ValueError, match="positive"):
        next(read_shard(shard, chunk_records=0))
    with pytest.raises(ValueError, match="unknown format"):
        next(read_shard(ShardSpec(0, str(C4), "xml")))


# ------------------------------------------------------------------------------ byte ranges

WS = st.sampled_from(["", " ", "\t", "\r", "  \r", " \t  \t "])
WORD = st.text(alphabet="ab é", min_size=1, max_size=12).filter(lambda s: s.strip())


@st.composite
def text_files(draw, json_lines: bool) -> bytes:
    lines = draw(
        st.lists(
            st.one_of(WS, WORD.map(lambda w: json.dumps({"w": w}) if json_lines else w)),
            max_size=25,
        )
    )
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    text = ending.join(lines) + draw(st.sampled_from(["", ending]))
    return draw(st.sampled_from([b"", b"\xef\xbb\xbf"])) + text.encode()


def reference(data: bytes, unit: str) -> list[tuple[int, object]]:
    """What the file holds, computed the obvious way over the whole file."""
    offset = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    lines = []
    for line in data[offset:].split(b"\n"):
        lines.append((offset, line.rstrip(b"\r").decode(), not line.strip()))
        offset += len(line) + 1
    if unit == "jsonl":
        return [(o, json.loads(t)) for o, t, blank in lines if not blank]
    if unit == "line":
        return [(o, t) for o, t, blank in lines if not blank]
    paragraphs: list[tuple[int, object]] = []
    previous_blank = True
    for o, t, blank in lines:
        if not blank and previous_blank:
            paragraphs.append((o, t))
        elif not blank:
            paragraphs[-1] = (paragraphs[-1][0], f"{paragraphs[-1][1]}\n{t}")
        previous_blank = blank
    return paragraphs


def assert_ranges_lose_nothing(data: bytes, unit: str, target: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if unit == "jsonl":
            value = write(Path(tmp) / "r.jsonl", data)
        else:
            value = write(Path(tmp) / "r.txt", data) + f"#text_unit={unit}"
        shards = plan_shards([parse_input_spec(0, value)], target)
        assert len(shards) == max(1, -(-len(data) // target))
        got = []
        for shard in shards:
            records = [r for chunk in read_shard(shard, chunk_records=3) for r in chunk.records]
            start, end = shard.start, shard.end if shard.end is not None else len(data) + 1
            assert all(start <= r.position < end for r in records)
            got += [(r.position, r.value) for r in records]
        assert got == reference(data, unit)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(text_files(json_lines=False), text_files(json_lines=True)),
    unit=st.sampled_from(["line", "paragraph"]),
    target=st.integers(1, 40),
)
# A range that starts inside a blank first line after a BOM: the look-back must skip the BOM.
@example(data=b"\xef\xbb\xbf  \r\nab\n", unit="paragraph", target=5)
def test_text_byte_ranges_lose_and_duplicate_nothing(data, unit, target):
    assert_ranges_lose_nothing(data, unit, target)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=text_files(json_lines=True), target=st.integers(1, 40))
def test_jsonl_byte_ranges_lose_and_duplicate_nothing(data, target):
    assert_ranges_lose_nothing(data, "jsonl", target)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(text_files(json_lines=False), text_files(json_lines=True)),
    unit=st.sampled_from(["line", "paragraph"]),
    target=st.integers(1, 40),
    block=st.integers(1, 9),
)
def test_runs_of_blank_lines_cut_by_small_reads_lose_nothing(data, unit, target, block):
    """A run of blank lines is read as one; reads of a few bytes cut runs and lines anywhere."""
    with mock.patch.object(read_formats, "BLOCK", block):
        assert_ranges_lose_nothing(data, unit, target)


def test_a_file_of_newlines_is_one_blank_line_per_read():
    """Why a .gz of newlines reads at disk speed: no loop turn per empty line."""
    stream = io.BufferedReader(io.BytesIO(b"\n" * (4 << 20) + b"x\n" + b" \r\n" * (1 << 20)))
    lines = list(read_formats._lines(stream, 0, read_formats._Cursor(0), 100))
    assert len(lines) < 16
    assert [(line.offset, line.data) for line in lines if not line.blank] == [(4 << 20, b"x")]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.sampled_from(["", "\n", "\r\n", "\r\n\r\n", "\n\n\n"]),
                            st.text(alphabet="ab\n\r", max_size=6)), max_size=8),
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
    block=st.integers(1, 9),
)
def test_csv_blank_lines_between_rows_are_skipped_and_kept_inside_quoted_fields(rows, ending,
                                                                                 block):
    """Blank lines between rows are skipped a block at a time; inside a quoted field they
    are the field's text. The rows are what the csv module reads from the whole text."""
    text = "text" + ending + "".join(blank + '"' + value + '"' + ending for blank, value in rows)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(read_formats, "BLOCK", block):
        records = read_all(write(Path(tmp) / "blank.csv", text.encode()))
    expected = [row[0] for row in csv.reader(io.StringIO(text, newline="")) if row][1:]
    assert [(r.position, r.value) for r in records] == [
        (i, {"text": value}) for i, value in enumerate(expected)]


def test_paragraph_boundaries_behind_long_whitespace_runs():
    """Range starts inside long blank and long non-blank lines: the look-back must reach back."""
    data = (
        b"one\n"
        + b" " * 10_000
        + b"\ntwo\n"
        + b"x" * 5_000
        + b"  " * 6_000
        + b"\nstill two\n\n\n"
        + b"\t" * 9_000
        + b"\nthree\n"
    )
    for target in (997, 4096, 7000):
        assert_ranges_lose_nothing(data, "paragraph", target)


# ------------------------------------------------------------------------------ bad data


def test_jsonl_bad_lines_become_error_records(tmp_path):
    lines = [
        b'{"ok": 1}',
        b"{not json",
        b"[1, 2]",
        b"42",
        b'"a string"',
        b'{"text": "caf\xe9"}',
        b"",
        b'{"ok": 2}\r',
    ]
    path = write(tmp_path / "bad.jsonl", b"\n".join(lines) + b"\n")
    records = read_all(path)
    offsets = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    assert errors(records) == [
        (offsets[1], MALFORMED_JSON),
        (offsets[2], NOT_AN_OBJECT),
        (offsets[3], NOT_AN_OBJECT),
        (offsets[4], NOT_AN_OBJECT),
        (offsets[5], INVALID_UTF8),
    ]
    assert [r.value for r in records if not r.error] == [{"ok": 1}, {"ok": 2}]
    assert records[1].raw == "{not json" and "Expecting property name" in records[1].error.message
    assert records[5].raw == '{"text": "caf\ufffd"}' and "0xe9" in records[5].error.message
    assert records[2].error.message == "a JSON list, not an object"


def test_jsonl_overlong_line_is_rejected_with_a_capped_prefix(tmp_path):
    huge = b'{"text": "' + b"x" * (3 << 20) + b'"}'
    path = write(tmp_path / "big.jsonl", b'{"a": 1}\n' + huge + b'\n{"b": 2}\n')
    records = read_all(path, max_record_bytes=1 << 20)
    assert errors(records) == [(9, RECORD_TOO_LARGE)]
    assert records[1].raw == '{"text": "' + "x" * (RAW_CAP_BYTES - 10) + "...[truncated]"
    assert str(len(huge)) in records[1].error.message
    assert [r.value for r in records if not r.error] == [{"a": 1}, {"b": 2}]
    assert records[2].position == 9 + len(huge) + 1


def test_json_errors(tmp_path):
    broken = write(tmp_path / "cut.json", ALPACA.read_bytes()[:2000])
    (record,) = read_all(broken)
    assert (record.position, record.error.reason, record.raw) == (
        0,
        MALFORMED_JSON,
        ALPACA.read_text()[:2000],
    )
    mixed = write(tmp_path / "mixed.json", b'[1, "x", {"a": 1}, [2], null]')
    records = read_all(mixed)
    assert errors(records) == [
        (0, NOT_AN_OBJECT),
        (1, NOT_AN_OBJECT),
        (3, NOT_AN_OBJECT),
        (4, NOT_AN_OBJECT),
    ]
    assert (records[2].position, records[2].value) == (2, {"a": 1})
    assert [r.raw for r in records if r.error] == ["1", '"x"', "[2]", "null"]
    (bad,) = read_all(write(tmp_path / "latin1.json", b'[{"a": "\xe9"}]'))
    assert (bad.position, bad.error.reason) == (0, INVALID_UTF8)


def test_csv_bad_rows_become_error_records(tmp_path):
    data = (
        b"q,a,label\r\n"
        b"hi,hello,0\r\n"
        b"only,two\r\n"
        b"caf\xe9,x,1\r\n"
        b'long,"' + b"y" * 500 + b'",2\r\n'
        b"bye,see you,0\r\n"
    )
    records = read_all(write(tmp_path / "bad.csv", data), max_record_bytes=200)
    assert errors(records) == [(1, MALFORMED_CSV), (2, INVALID_UTF8), (3, RECORD_TOO_LARGE)]
    assert records[1].raw == "only,two"
    assert records[2].raw == "caf\ufffd,x,1"
    assert records[3].raw.endswith("...[truncated]")
    assert [(r.position, r.value) for r in records if not r.error] == [
        (0, {"q": "hi", "a": "hello", "label": "0"}),
        (4, {"q": "bye", "a": "see you", "label": "0"}),
    ]


def test_text_bad_lines_and_paragraphs(tmp_path):
    path = write(tmp_path / "t.txt", b"good\nbad \xff\n\nfine\n\n" + b"z" * 300 + b"\nlast")
    lines = read_all(path + "#text_unit=line", max_record_bytes=100)
    assert errors(lines) == [(5, INVALID_UTF8), (18, RECORD_TOO_LARGE)]
    assert [r.value for r in lines if not r.error] == ["good", "fine", "last"]
    assert lines[1].raw == "bad \ufffd"
    assert lines[3].raw == "z" * 300 + "...[truncated]"
    paragraphs = read_all(path + "#text_unit=paragraph", max_record_bytes=100)
    assert errors(paragraphs) == [(0, INVALID_UTF8), (18, RECORD_TOO_LARGE)]
    assert [r.value for r in paragraphs if not r.error] == ["fine"]
    assert paragraphs[0].raw == "good\nbad \ufffd"
    assert paragraphs[2].raw == "z" * 300 + "...[truncated]"
    (whole,) = read_all(path)
    assert (whole.error.reason, whole.raw[:4]) == (INVALID_UTF8, "good")
    (big,) = read_all(path, max_record_bytes=100)
    assert big.error.reason == RECORD_TOO_LARGE


def test_a_record_too_large_names_the_option_that_sets_the_limit(tmp_path):
    """The message names --max_record_mb, the option a user can change, not an internal name."""
    path = write(tmp_path / "t.jsonl", b'{"text": "' + b"z" * 3_000_000 + b'"}\n{"text": "ok"}\n')
    limit = 2 << 20
    big, ok = read_all(path, max_record_bytes=limit)
    assert big.error == Drop(RECORD_TOO_LARGE, "line of 3000012 bytes exceeds --max_record_mb=2 "
                                           "(2,097,152 bytes)")
    assert ok.value == {"text": "ok"}
    (whole,) = read_all(str(tmp_path / "t.jsonl") + "#format=text", max_record_bytes=limit)
    assert whole.error == Drop(RECORD_TOO_LARGE, "file exceeds --max_record_mb=2 (2,097,152 bytes)")


def test_planning_opens_no_file_and_flags_large_compressed_files(tmp_path, monkeypatch):
    """plan_inputs works from glob expansion alone (Parquet stays whole: its footer is read in
    the job) and lists the compressed files over LARGE_COMPRESSED_BYTES for the warning."""
    parquet, _ = parquet_file(tmp_path)
    big = write(tmp_path / "big.jsonl.zst", b"x" * 100)
    small = write(tmp_path / "small.jsonl.gz", b"x" * 10)
    monkeypatch.setattr(planning, "LARGE_COMPRESSED_BYTES", 50)
    monkeypatch.setattr(read_formats, "open_input", None)  # any read would fail
    monkeypatch.setattr(planning.FileSystems, "open", None)
    plan = planning.plan_inputs([parse_input_spec(0, f"{tmp_path}/*")])
    assert plan.shards == [ShardSpec(0, big, "jsonl"), ShardSpec(0, parquet, "parquet"),
                           ShardSpec(0, small, "jsonl")]
    assert plan.shard_bytes == [100, os.path.getsize(parquet), 10]
    assert plan.large_compressed == [(big, 100)]
    advice = planning.large_compressed_advice(plan.large_compressed)
    assert advice.startswith(f"1 compressed input file(s) over 0 GiB (largest {big}, 0.0 GiB)")
    assert advice.endswith("see docs/inputs-at-scale.md")


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_compressed_file_keeps_what_was_read(tmp_path, suffix):
    lines = [b'{"i": %d, "pad": "%s"}\n' % (i, b"%x" % (i * 7919)) for i in range(20_000)]
    data = b"".join(lines)
    compressed = COMPRESSORS[suffix](data)
    path = write(tmp_path / ("cut.jsonl" + suffix), compressed[: len(compressed) * 2 // 3])
    records = read_all(path)
    *good, last = records
    assert good and all(r.error is None for r in good)
    assert [r.value["i"] for r in good] == list(range(len(good)))
    assert len(good) < len(lines)
    assert (last.error.reason, last.raw) == (UNREADABLE_FILE, "")
    assert last.position == sum(map(len, lines[: len(good)]))


@pytest.mark.parametrize("name", ["corrupt.jsonl.gz", "corrupt.csv.gz", "corrupt.txt.zst"])
def test_corrupt_compressed_file_is_unreadable(tmp_path, name):
    # Hash digests barely compress, so the damage lands well after the first decompressed blocks.
    rows = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(40_000)]
    if ".csv" in name:
        data, options = ("h\r\n" + "\r\n".join(rows) + "\r\n").encode(), ""
    else:
        data, options = "".join(f'{{"h": "{h}"}}\n' for h in rows).encode(), "#text_unit=line"
    compressed = bytearray(COMPRESSORS[Path(name).suffix](data))
    compressed[len(compressed) // 2 : len(compressed) // 2 + 64] = b"\xff" * 64
    records = read_all(write(tmp_path / name, bytes(compressed)) + options)
    # Damage may decode to garbage before a checksum catches it, so only the ends are certain:
    # the records before it come through, and the file ends in one unreadable_file record.
    assert records[0].error is None
    assert [r.error.reason for r in records if r.error][-1:] == [UNREADABLE_FILE]
    assert [r.error.reason for r in records if r.error].count(UNREADABLE_FILE) == 1
    assert records[-1].error.reason == UNREADABLE_FILE


def test_not_actually_gzip_is_unreadable(tmp_path):
    (record,) = read_all(write(tmp_path / "plain.jsonl.gz", C4.read_bytes()))
    assert (record.position, record.error.reason) == (0, UNREADABLE_FILE)
    assert "Not a gzipped file" in record.error.message


def test_file_gone_after_planning_is_unreadable(tmp_path):
    path = write(tmp_path / "gone.jsonl", C4.read_bytes())
    shards = plan_shards([parse_input_spec(0, path)], target_shard_bytes=8000)
    Path(path).unlink()
    records = [r for s in shards for c in read_shard(s) for r in c.records]
    assert [(r.position, r.error.reason) for r in records] == [
        (s.start, UNREADABLE_FILE) for s in shards
    ]


def test_corrupt_parquet_is_unreadable(tmp_path):
    path = write(tmp_path / "bad.parquet", b"PAR1 this is not parquet at all")
    shards = plan_shards([parse_input_spec(0, path)])
    assert shards == [ShardSpec(0, path, "parquet")]
    (record,) = read_all(path)
    assert (record.position, record.error.reason) == (0, UNREADABLE_FILE)


def test_csv_decoding_survives_a_multibyte_character_split_across_reads(tmp_path):
    row = "가" * 30_000  # 90,000 bytes: crosses the text wrapper's read size mid-character
    data = ("t\r\n" + row + "\r\n" + "끝\r\n").encode()
    records = read_all(write(tmp_path / "wide.csv.gz", gzip.compress(data)))
    assert [r.value["t"] for r in records] == [row, "끝"]


def test_chunks_pickle_for_any_runner():
    chunks = list(read_shard(plan_shards([parse_input_spec(0, str(KO_CSV))])[0]))
    assert pickle.loads(pickle.dumps(chunks)) == chunks


def test_a_mistyped_field_mapping_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="'promt' is neither a setting"):
        parse_input_spec(0, "gsm8k.jsonl#promt=question;response=answer")


def test_json_nested_too_deeply_is_a_malformed_record_not_a_crash(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    jsonl = write(tmp_path / "deep.jsonl", f'{{"text": {deep}}}\n{{"text": "fine"}}\n'.encode())
    array = write(tmp_path / "deep.json", f"[{deep}]".encode())
    records = [r for s in plan_shards([parse_input_spec(0, jsonl), parse_input_spec(1, array)])
               for c in read_shard(s) for r in c.records]
    assert [(r.error and r.error.reason, r.value) for r in records] == [
        (MALFORMED_JSON, None), (None, {"text": "fine"}), (MALFORMED_JSON, None)]
    assert records[0].error.message == "JSON nested too deeply to parse"


def test_json_nested_deeper_than_the_limit_is_rejected_before_it_reaches_beam(tmp_path):
    deep = "[" * 500 + "]" * 500  # parses, but could not be pickled between stages
    lines = f'{{"text": {deep}}}\n[{deep}]\n{{"a": {{"b": [1]}}}}\n'
    path = write(tmp_path / "d.jsonl", lines.encode())
    array = write(tmp_path / "d.json", f'[{deep}, {{"text": "ok"}}]'.encode())
    records = [r for s in plan_shards([parse_input_spec(0, path), parse_input_spec(1, array)])
               for c in read_shard(s) for r in c.records]
    assert [r.error and r.error.reason for r in records] == [
        TOO_DEEPLY_NESTED, TOO_DEEPLY_NESTED, None, TOO_DEEPLY_NESTED, None]


def test_json_depth_limit_is_exact_and_many_shallow_brackets_pass(tmp_path):
    def nested(levels):  # an object holding levels - 1 nested lists: depth `levels`
        return '{"text": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"

    shallow = '{"text": [' + ",".join(["[1]"] * 100) + "]}"  # 101 brackets, depth 3
    lines = [nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH + 1), shallow]
    path = write(tmp_path / "d.jsonl", ("\n".join(lines) + "\n").encode())
    records = [r for s in plan_shards([parse_input_spec(0, path)])
               for c in read_shard(s) for r in c.records]
    assert [r.error and r.error.reason for r in records] == [None, TOO_DEEPLY_NESTED, None]
