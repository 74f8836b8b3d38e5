"""Hostile input at reading (issue #29), run through the whole pipeline at once.

Each of these killed a run on main or lost records without a word: a JSON integer of more than
4,300 digits, lone surrogates escaped in JSON (in a chat, in a record rejected anyway, in text
that is not normalised, in a key), a file name that is not UTF-8, one corrupt page in a Parquet
file, a CSV header that names a column twice, a small ``.json.gz`` that inflates past
``--max_record_mb`` and a ``.gz`` of newlines. Here each ends as rejected records with a precise
reason, the run goes on, and the manifest's counts are the ones this test counts itself.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_hostile import doc, jsonl
from transforms.core.records import Record, Rejection

BIG_INT = "9" * 5000  # over Python's 4,300-digit limit on int-string conversion
PARQUET_GROUPS, PARQUET_GROUP_ROWS, CORRUPT_GROUP = 10, 300, 4
NON_UTF8_NAME = b"caf\xe9.jsonl"  # Latin-1, not UTF-8
NEWLINES = 8 << 20


def big_int_line(topic: str) -> bytes:
    return b'{"text": "' + doc(topic).encode() + b'", "id": ' + BIG_INT.encode() + b"}\n"


def lone_surrogates() -> bytes:
    """json.dumps escapes a lone surrogate as \\udNNN, just as a hostile file would hold it."""
    return jsonl(
        {"messages": [{"role": "user", "content": "say hi \ud800"},
                      {"role": "assistant", "content": "hi"}]},
        {"text": 5, "note": "\udc00"},  # would be wrong_type; on main, writing it out crashed
        {"text": doc("unnormalised text") + " \udfff"},
        {"\ud800": "a key", "text": doc("keys")},
        {"text": doc("a valid pair") + " \U0001f600"},  # escaped as a pair: kept
    )


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 9)


# name -> (bytes, records in it, reasons of its rejected records)
FOLDER = {
    "big_int.jsonl": (jsonl({"text": doc("before")}) + big_int_line("big")
                      + jsonl({"text": doc("after")}), 3, ["malformed_json"]),
    "big_int.json": (b"[" + big_int_line("document").rstrip() + b"]", 1, ["malformed_json"]),
    "surrogates.jsonl": (lone_surrogates(), 5, ["lone_surrogate"] * 4),
    "surrogates.json": (b'[{"text": "' + doc("arrays").encode() + b'"}, {"text": "x \\uDBFF y"}]',
                        2, ["lone_surrogate"]),
    "duplicate_header.csv": (b"text,text\nfirst,second\nthird,fourth\n", 2,
                             ["malformed_csv"] * 2),
    # 2 MiB of JSON in a few kB of gzip, over --max_record_mb=1: refused before it is parsed.
    "zeros.json.gz": (gz(b"[" + b"0," * (1 << 20) + b"0]"), 1, ["record_too_large"]),
    "newlines.jsonl.gz": (gz(b"\n" * NEWLINES + jsonl({"text": doc("the newlines")})), 1, []),
    "newlines.csv.gz": (gz(b"text\n" + b"\r\n" * NEWLINES + b'"' + doc("csv").encode() + b'"\n'),
                        1, []),
}
NON_UTF8 = (jsonl({"text": doc("a Latin-1 file name")}) + b"{not json\n", 2, ["malformed_json"])


def corrupt_parquet(path) -> None:
    """Ten row groups; the pages of one are garbled, so only that group cannot be read."""
    rows = PARQUET_GROUPS * PARQUET_GROUP_ROWS
    table = pa.table({"text": [doc(f"row {i}") for i in range(rows)], "id": list(range(rows))})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=PARQUET_GROUP_ROWS)
    data = bytearray(buffer.getvalue())
    column = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(CORRUPT_GROUP).column(0)
    first = column.dictionary_page_offset or column.data_page_offset
    for i in range(first, first + column.total_compressed_size):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from beam_pipeline.running import run

    root = tmp_path_factory.mktemp("reading")
    folder = root / "folder"
    folder.mkdir()
    for name, (data, _, _) in FOLDER.items():
        (folder / name).write_bytes(data)
    with open(os.path.join(os.fsencode(folder), NON_UTF8_NAME), "wb") as f:
        f.write(NON_UTF8[0])
    parquet = root / "corrupt.parquet"
    corrupt_parquet(parquet)
    output = root / "out"
    run([f"--input={folder}", f"--input={parquet}", f"--output={output}",
         "--max_reject_fraction=1", "--max_record_mb=1", "--normalize=false"])
    manifest = json.loads((output / "manifest.json").read_text())
    rejected = [json.loads(line) for f in sorted((output / "rejected").glob("*.jsonl"))
                for line in f.open(encoding="utf-8")]
    return manifest, rejected


def rejected_of(rejected, name: str) -> list[dict]:
    return sorted((r for r in rejected if r["source"].endswith("/" + name)),
                  key=lambda r: r["position"])


@pytest.mark.parametrize("name", sorted(FOLDER))
def test_each_bad_record_is_rejected_with_its_reason(run, name):
    _, rejected = run
    assert sorted(r["reason"] for r in rejected_of(rejected, name)) == FOLDER[name][2]


def test_the_reasons_say_what_is_wrong(run):
    _, rejected = run
    (big,) = rejected_of(rejected, "big_int.jsonl")
    assert "4300 digits" in big["message"]
    assert big["position"] == len(jsonl({"text": doc("before")}))
    assert all("'text'" in r["message"] for r in rejected_of(rejected, "duplicate_header.csv"))
    assert [r["position"] for r in rejected_of(rejected, "duplicate_header.csv")] == [0, 1]
    (zeros,) = rejected_of(rejected, "zeros.json.gz")
    assert "--max_record_mb=1" in zeros["message"]
    # The raw record keeps each surrogate as the escape it was, as text any reader can load.
    raws = [r["raw"] for r in rejected_of(rejected, "surrogates.jsonl")]
    escapes = ["\\ud800", "\\udc00", "\\udfff", "\\ud800"]
    assert all(escape in raw for escape, raw in zip(escapes, raws, strict=True))


def test_a_rejection_of_a_value_holding_a_lone_surrogate_can_be_written():
    """Whatever rejects such a value, its raw text keeps the surrogate as an escape."""
    record = Record("in.jsonl", 0, 0, value={"text": 5, "note": "\ud800 caf\u00e9"})
    raw = Rejection.of(record, "wrong_type", "field 'text' is int").raw
    assert raw == '{"text": 5, "note": "\\ud800 caf\u00e9"}'
    raw.encode("utf-8")


def test_a_file_name_that_is_not_utf8_is_read(run):
    """Its records are read; outputs name it with the bad byte escaped."""
    _, rejected = run
    (bad,) = rejected_of(rejected, "caf\\xe9.jsonl")
    assert bad["reason"] == "malformed_json"
    assert bad["position"] == len(jsonl({"text": doc("a Latin-1 file name")}))


def test_a_corrupt_row_group_loses_only_its_own_rows(run):
    manifest, rejected = run
    lost = rejected_of(rejected, "corrupt.parquet")
    first = CORRUPT_GROUP * PARQUET_GROUP_ROWS
    assert [r["position"] for r in lost] == list(range(first, first + PARQUET_GROUP_ROWS))
    assert {r["reason"] for r in lost} == {"unreadable_file"}
    assert all(f"row group {CORRUPT_GROUP}" in r["message"] for r in lost)
    parquet_input = manifest["inputs"][1]
    assert parquet_input["read"] == PARQUET_GROUPS * PARQUET_GROUP_ROWS
    assert parquet_input["rejected"] == {"unreadable_file": PARQUET_GROUP_ROWS}


def test_the_manifest_counts_what_this_test_counted(run):
    manifest, rejected = run
    records = manifest["records"]
    assert records["balanced"] is True
    expected = collections.Counter(r for _, _, reasons in [*FOLDER.values(), NON_UTF8]
                                   for r in reasons)
    expected["unreadable_file"] += PARQUET_GROUP_ROWS
    assert records["rejected"] == expected
    assert collections.Counter(r["reason"] for r in rejected) == expected
    folder_input = manifest["inputs"][0]
    assert folder_input["read"] == sum(n for _, n, _ in [*FOLDER.values(), NON_UTF8])
    assert records["read"] == folder_input["read"] + PARQUET_GROUPS * PARQUET_GROUP_ROWS
