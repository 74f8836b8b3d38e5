"""Hostile input folders and paths: what a directory input reads and skips, literal paths with
glob characters, and accounting per file (issue #29).

Planning is tested on its own where its result is the whole story (which files, which skipped);
one directory read end to end shows that the skips and the per-file counts reach the manifest,
that a FIFO in it does not hang the run, and that --max_reject_fraction judges each file.
"""

import contextlib
import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.running import run
from tests.support.gcs import cloud_env, metadata_server, storage_emulator, use_in_process
from transforms.core.records import InputSpec
from transforms.io.manifest import MIN_RECORDS_JUDGED_PER_FILE, RejectRateError
from transforms.io.planning import plan_inputs

RUN_SECONDS = 300  # a run of a few hundred records takes seconds; a hang fails the test


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fails the block with TimeoutError after ``seconds``: a read that blocks (a FIFO) must
    fail the test, not hang the suite."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def jsonl(values) -> str:
    return "".join(json.dumps(v) + "\n" for v in values)


def good(i: int) -> dict:
    return {"prompt": f"What is {i} plus {i}?", "response": f"{i} plus {i} is {2 * i}."}


def bad(i: int) -> dict:
    return {"label": i}  # no field any branch takes: rejected as unclassifiable


def paths(plan) -> list[str]:
    return [shard.path for shard in plan.shards]


def test_a_path_that_exists_is_read_before_a_glob_of_the_same_text(tmp_path):
    (tmp_path / "data1.jsonl").write_text(jsonl([good(1)]))
    (tmp_path / "data2.jsonl").write_text(jsonl([good(2)]))
    (tmp_path / "data[1].jsonl").write_text(jsonl([good(3)]))
    literal, glob = str(tmp_path / "data[1].jsonl"), str(tmp_path / "data[12].jsonl")
    plan = plan_inputs([InputSpec(0, literal), InputSpec(1, glob)])
    assert [(s.input_index, s.path) for s in plan.shards] == [
        (0, literal), (1, str(tmp_path / "data1.jsonl")), (1, str(tmp_path / "data2.jsonl"))]


def hostile_folder(root: Path) -> dict[str, list[str]]:
    """A folder holding three data files and one of each thing a directory input must skip;
    returns the paths planning must skip, by reason, as the test expects them."""
    root.mkdir()
    (root / "sub").mkdir()
    (root / "a.jsonl").write_text(jsonl([good(1)]))
    (root / "sub" / "b.txt").write_text("a document\n")
    (root / ".hidden.jsonl").write_text(jsonl([good(2)]))
    (root / ".cache").mkdir()
    (root / ".cache" / "c.jsonl").write_text(jsonl([good(3)]))
    (root / "README.md").write_text("# about this data\n")
    (root / "LICENSE").write_text("MIT\n")
    (root / "notes.xyz").write_text("x\n")
    os.mkfifo(root / "pipe.jsonl")
    (root / "null.jsonl").symlink_to(os.devnull)
    (root / "dangling.jsonl").symlink_to(root / "nowhere.jsonl")
    (root / "sub" / "again.jsonl").symlink_to(root / "a.jsonl")
    (root / "sub" / "loop").symlink_to(root)
    (root / os.fsdecode(b"caf\xe9.jsonl")).write_text(jsonl([good(4)]))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "socket.jsonl"))
    listener.close()
    return {
        "hidden": [f"{root}/.cache/", f"{root}/.hidden.jsonl"],
        "readme_or_license": [f"{root}/LICENSE", f"{root}/README.md"],
        "unknown_extension": [f"{root}/notes.xyz"],
        "not_a_regular_file": [f"{root}/null.jsonl", f"{root}/pipe.jsonl",
                               f"{root}/socket.jsonl"],
        "broken_link": [f"{root}/dangling.jsonl"],
        "same_file": [f"{root}/sub/again.jsonl", f"{root}/sub/loop/"],
    }


def test_a_directory_reads_its_data_files_once_and_counts_what_it_skips(tmp_path):
    expected = hostile_folder(tmp_path / "in")
    plan = plan_inputs([InputSpec(0, str(tmp_path / "in"))])
    # A name that is not UTF-8 is data too: outputs name it with the odd byte escaped.
    assert paths(plan) == [str(tmp_path / "in" / "a.jsonl"),
                           str(tmp_path / "in" / os.fsdecode(b"caf\xe9.jsonl")),
                           str(tmp_path / "in/sub/b.txt")]
    facts = plan.input_facts()[0]
    assert facts["file_count"] == 3
    assert facts["skipped"] == {reason: len(found) for reason, found in expected.items()}
    assert {reason: sorted(found) for reason, found in facts["skipped_examples"].items()} \
        == expected


def test_a_glob_skips_non_regular_files_and_reads_a_linked_file_once(tmp_path):
    (tmp_path / "a.jsonl").write_text(jsonl([good(1)]))
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")  # its target is read, once
    os.mkfifo(tmp_path / "pipe.jsonl")
    plan = plan_inputs([InputSpec(0, f"{tmp_path}/*.jsonl")])
    assert paths(plan) == [str(tmp_path / "a.jsonl")]
    assert plan.input_facts()[0]["skipped"] == {"not_a_regular_file": 1, "same_file": 1}


def test_a_fifo_named_alone_is_refused_before_any_work(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(ValueError, match=re.escape("matches no files to read (skipped: "
                                                   "not_a_regular_file 1)")):
        plan_inputs([InputSpec(0, str(tmp_path / "pipe.jsonl"))])


def test_on_gcs_a_directory_skips_by_name_and_a_literal_path_wins(monkeypatch):
    root = "gs://hostile-inputs/in"
    names = ["a.jsonl", "data1.jsonl", "data[1].jsonl", "sub/b.txt", ".hidden.jsonl",
             ".cache/c.jsonl", "README.md", "sub/LICENSE.txt", "notes.xyz"]
    with storage_emulator("hostile-inputs") as url, metadata_server() as metadata:
        use_in_process(monkeypatch, cloud_env(url, metadata))
        for name in names:
            with FileSystems.create(f"{root}/{name}") as handle:
                handle.write(jsonl([good(1)]).encode())
        plan = plan_inputs([InputSpec(0, f"{root}/"), InputSpec(1, f"{root}/data[1].jsonl")])
    assert [(s.input_index, s.path) for s in plan.shards] == [
        (0, f"{root}/a.jsonl"), (0, f"{root}/data1.jsonl"), (0, f"{root}/data[1].jsonl"),
        (0, f"{root}/sub/b.txt"), (1, f"{root}/data[1].jsonl")]
    assert plan.input_facts()[0]["skipped"] == {
        "hidden": 2, "readme_or_license": 2, "unknown_extension": 1}


BAD_FILE_RECORDS = MIN_RECORDS_JUDGED_PER_FILE + 75  # all rejected: a file wrongly read
GOOD_RECORDS = 400
MIXED = (50, 10)  # good, bad: a file below the size judged alone
TINY_BAD = 1  # a file of one bad record: not judged alone either


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory):
    """One hostile folder with files of every kind of accounting, run with the default
    --max_reject_fraction (stopped by its one wholly rejected file) and with 1 (completes)."""
    root = tmp_path_factory.mktemp("folder")
    data = root / "in"
    skipped = hostile_folder(data)
    (data / "a.jsonl").write_text(jsonl(good(i) for i in range(GOOD_RECORDS)))
    (data / "sub" / "b.txt").unlink()
    (data / "wrong.jsonl").write_text(jsonl(bad(i) for i in range(BAD_FILE_RECORDS)))
    (data / "sub" / "mixed.jsonl").write_text(
        jsonl([*(good(i) for i in range(MIXED[0])), *(bad(i) for i in range(MIXED[1]))]))
    (data / "tiny.jsonl").write_text(jsonl([bad(0)]))
    common = [f"--input={data}", "--quiet", "--seq_len=256"]
    with deadline(RUN_SECONDS), pytest.raises(Exception) as stopped:
        run([*common, f"--output={root}/stopped"])
    with deadline(RUN_SECONDS):
        run([*common, f"--output={root}/out", "--max_reject_fraction=1"])
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    return {"data": data, "skipped": skipped, "stopped": stopped.value,
            "stopped_output": root / "stopped", "manifest": manifest, "output": root / "out"}


def test_one_wholly_rejected_file_stops_the_run_though_its_input_passes(folder_runs):
    data = folder_runs["data"]
    read = GOOD_RECORDS + BAD_FILE_RECORDS + sum(MIXED) + TINY_BAD
    assert (BAD_FILE_RECORDS + MIXED[1] + TINY_BAD) / read < 0.5  # the input alone passes
    error = folder_runs["stopped"]
    assert isinstance(error, RejectRateError) or "RejectRateError" in repr(error), repr(error)
    assert (f"{BAD_FILE_RECORDS} of {BAD_FILE_RECORDS} records of {data}/wrong.jsonl "
            f"(--input {data}) were rejected") in str(error)
    assert not (folder_runs["stopped_output"] / "manifest.json").exists()


def test_the_manifest_counts_every_file_and_every_skip(folder_runs):
    manifest, data = folder_runs["manifest"], folder_runs["data"]
    assert manifest["records"]["balanced"]
    (entry,) = manifest["inputs"]
    assert entry["file_count"] == 5
    assert entry["skipped"] == {reason: len(found)
                                for reason, found in folder_runs["skipped"].items()}
    rejected = {"unclassifiable": BAD_FILE_RECORDS + MIXED[1] + TINY_BAD}
    assert entry["read"] == GOOD_RECORDS + BAD_FILE_RECORDS + sum(MIXED) + TINY_BAD + 1
    assert entry["rejected"] == rejected
    expected = [  # most rejected first
        (f"{data}/wrong.jsonl", BAD_FILE_RECORDS, 0, BAD_FILE_RECORDS),
        (f"{data}/sub/mixed.jsonl", sum(MIXED), MIXED[0], MIXED[1]),
        (f"{data}/tiny.jsonl", TINY_BAD, 0, TINY_BAD),
        (f"{data}/a.jsonl", GOOD_RECORDS, GOOD_RECORDS, 0),
        (f"{data}/caf\\xe9.jsonl", 1, 1, 0),  # a name that is not UTF-8, shown escaped
    ]
    assert [(f["path"], f["read"], f["kept"], sum(f["rejected"].values()))
            for f in entry["files"]] == expected
    assert sum(f["read"] for f in entry["files"]) == entry["read"]
    assert all(not f["filtered"] for f in entry["files"])
    assert manifest["instruction"]["examples"] == GOOD_RECORDS + MIXED[0] + 1


def test_the_report_shows_the_skipped_files_and_the_rejected_files(folder_runs):
    page = (folder_runs["output"] / "report.html").read_text()
    skipped = ", ".join(f"{reason} {len(found)}"
                        for reason, found in sorted(folder_runs["skipped"].items()))
    assert f"<td>5</td><td>{skipped}</td></tr>" in page
    assert (f"<td>{folder_runs['data']}/wrong.jsonl</td><td>{BAD_FILE_RECORDS}</td><td>0</td>"
            f"<td>0</td><td>{BAD_FILE_RECORDS}</td><td>unclassifiable {BAD_FILE_RECORDS}</td>"
            ) in page
