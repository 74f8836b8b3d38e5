"""A run owns its output folder: two runs started into one folder never both publish, and the
manifest of the one that does lists only files that hold its rows; an overwrite deletes what an
earlier run wrote and nothing of the user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import EXAMPLES
from transforms.io.output_lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
INPUTS = [f"--input={EXAMPLES}/c4_sample.jsonl", f"--input={EXAMPLES}/sharegpt_sample.json"]
LOCK_MESSAGE = "is being written by another run"
TRIALS = 3


def start(output: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", *INPUTS, f"--output={output}", "--quiet",
         *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def check_published(output: Path) -> dict:
    """The manifest lists files that all exist and hold the rows it states, and balances."""
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["records"]["balanced"]
    for kind, entries in manifest["outputs"].items():
        for entry in entries:
            path = Path(entry["path"])
            assert path.is_file() and path.stat().st_size > 0, path
            if path.suffix == ".parquet":
                assert pq.ParquetFile(path).metadata.num_rows == entry["rows"], (kind, path)
            else:
                assert len(path.read_bytes().splitlines()) == entry["rows"], (kind, path)
    assert not (output / LOCK_NAME).exists()
    return manifest


def test_a_second_run_while_the_first_holds_the_folder_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "out"
    first = start(output)
    deadline = time.monotonic() + 120
    while not (output / LOCK_NAME).exists():
        assert first.poll() is None and time.monotonic() < deadline, finish(first)
        time.sleep(0.05)
    code, stderr = finish(start(output, "--overwrite=true"))
    assert code == 2, stderr
    assert LOCK_MESSAGE in stderr and "process" in stderr
    assert finish(first)[0] == 0
    check_published(output)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_two_runs_started_together_publish_once(tmp_path: Path, trial: int) -> None:
    """Both ask to overwrite, so the loser can only be stopped by the lock, or come after the
    winner has finished and replace its outputs whole."""
    output = tmp_path / f"out{trial}"
    runs = [start(output, "--overwrite=true") for _ in range(2)]
    outcomes = [finish(run) for run in runs]
    codes = sorted(code for code, _ in outcomes)
    assert codes in ([0, 2], [0, 0]), outcomes
    for code, stderr in outcomes:
        if code == 2:
            assert LOCK_MESSAGE in stderr, stderr
    check_published(output)
    assert not (output / ".staging").exists()


USER_FILES = ["pretrain/notes.txt", "sft/mine.parquet", "rejected/keep.jsonl",
              "tokenizer/my_tokenizer.json", "validation/notes.txt", "elsewhere/data.jsonl",
              "notes.md"]


def test_an_overwrite_keeps_every_file_of_the_users(tmp_path: Path) -> None:
    output = tmp_path / "out"
    assert finish(start(output))[0] == 0
    first = check_published(output)
    for name in USER_FILES:
        (output / name).parent.mkdir(parents=True, exist_ok=True)
        (output / name).write_text(f"the user's {name}")
    code, stderr = finish(start(output, "--overwrite=true", "--seq_len=512"))
    assert code == 0, stderr
    second = check_published(output)
    for name in USER_FILES:
        assert (output / name).read_text() == f"the user's {name}"
    written = {Path(e["path"]).relative_to(output).as_posix()
               for entries in second["outputs"].values() for e in entries}
    written |= {f"tokenizer/{name}" for name in second["tokenizer_files"]}
    on_disk = {p.relative_to(output).as_posix() for p in output.rglob("*") if p.is_file()}
    assert on_disk == written | set(USER_FILES) | {"manifest.json", "README.md", "report.html"}
    assert first["instruction"]["packs"] != second["instruction"]["packs"]  # really rewritten


def test_a_run_refuses_its_own_output_as_tokenizer_or_input(tmp_path: Path) -> None:
    output = tmp_path / "out"
    assert finish(start(output))[0] == 0
    code, stderr = finish(start(output, "--overwrite=true", f"--tokenizer={output}/tokenizer"))
    assert code == 2 and "--tokenizer" in stderr and "inside --output" in stderr, stderr
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "one document of plain words here"}\n')
    process = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", f"--input={data}", f"--output={data}/out",
         "--quiet"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 2 and "inside --input" in process.stderr, process.stderr
    assert os.listdir(data) == ["a.jsonl"]


@pytest.mark.parametrize(("place", "message"), [
    ("a-file", "is a file; a run writes a folder there"),
    ("a-file/out", "cannot be written: Not a directory"),  # root ignores a read-only mode
])
def test_an_output_that_cannot_hold_a_run_fails_before_any_work(
        tmp_path: Path, place: str, message: str) -> None:
    (tmp_path / "a-file").write_text("a user's file\n")
    code, stderr = finish(start(tmp_path / place))
    assert code == 2 and f"--output {tmp_path / place} {message}" in stderr, stderr
    assert stderr.count("\n") == 1  # one line, no traceback
    assert (tmp_path / "a-file").read_text() == "a user's file\n"
    assert os.listdir(tmp_path) == ["a-file"]  # refused before anything was written
