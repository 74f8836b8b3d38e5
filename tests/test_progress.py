"""The progress line and bar: exact text from given counts, the side channel the workers write
(transforms/core/progress.py) summed across processes, and the reporter's life cycle (the
whole-run counts are checked in tests/test_pipeline.py, in both DirectRunner modes)."""

import io
import multiprocessing
import os

from beam_pipeline import progress
from beam_pipeline.progress import Planned, ProgressReporter, bar_line, progress_line
from transforms.core.progress import COUNTERS, PROGRESS_DIR_ENV, count

TOTALS = {"records_read": 12_345, "bytes_read": 250_000_000, "shards_done": 3,
          "tokens_written": 4_567_890}
PLANNED = Planned(shards=8, bytes=1_000_000_000)


def test_the_line_shows_counts_of_the_planned_total_rate_and_time_left():
    assert progress_line(TOTALS, PLANNED, elapsed=30.0) == (
        "progress: 12,345 records read (3/8 shards, 250.0 MB of 1.0 GB, 25%), "
        "4,567,890 tokens written, 412 records/s, elapsed 0:00:30, about 0:01:30 left")


def test_the_time_left_is_unknown_before_any_byte_and_the_end_says_all_read():
    start = dict.fromkeys(COUNTERS, 0)
    assert progress_line(start, PLANNED, 5.0).endswith("elapsed 0:00:05, time left unknown")
    end = {**TOTALS, "bytes_read": PLANNED.bytes, "shards_done": 8}
    assert progress_line(end, PLANNED, 3725.0).endswith(
        "(8/8 shards, 1.0 GB of 1.0 GB, 100%), 4,567,890 tokens written, 3 records/s, "
        "elapsed 1:02:05, all input read")


def test_the_bar_fills_with_the_share_of_planned_bytes():
    assert bar_line(TOTALS, PLANNED, 30.0) == (
        "[######..................] 12,345 records read (3/8 shards, 250.0 MB of 1.0 GB, 25%), "
        "4,567,890 tokens written, 412 records/s, elapsed 0:00:30, about 0:01:30 left")


def _count_in_child(directory: str) -> None:
    os.environ[PROGRESS_DIR_ENV] = directory
    count(records_read=7, bytes_read=70)
    count(records_read=3, shards_done=1)


def test_counts_from_several_processes_add_up(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_DIR_ENV, str(tmp_path))
    count(records_read=5, tokens_written=11)
    context = multiprocessing.get_context("fork")  # another process, as Beam's workers are
    child = context.Process(target=_count_in_child, args=(str(tmp_path),))
    child.start()
    child.join()
    assert child.exitcode == 0
    assert progress.read_totals(str(tmp_path)) == {
        "records_read": 15, "bytes_read": 70, "shards_done": 1, "tokens_written": 11}
    assert len(list(tmp_path.iterdir())) == 2  # one file per process, no temporaries left


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_reporter_names_its_channel_for_the_workers_and_prints_a_last_line(monkeypatch):
    monkeypatch.delenv(PROGRESS_DIR_ENV, raising=False)
    stream = io.StringIO()
    ticks = iter([100.0, 160.0])  # the start, then the last line
    with ProgressReporter(PLANNED, stream, clock=lambda: next(ticks)) as reporter:
        directory = os.environ[PROGRESS_DIR_ENV]
        count(records_read=600, bytes_read=PLANNED.bytes, shards_done=8)
    assert stream.getvalue() == (
        "progress: 600 records read (8/8 shards, 1.0 GB of 1.0 GB, 100%), 0 tokens written, "
        "10 records/s, elapsed 0:01:00, all input read\n")
    assert reporter.interval == progress.LINE_SECONDS
    assert PROGRESS_DIR_ENV not in os.environ
    assert not os.path.exists(directory)


def test_on_a_terminal_the_bar_is_redrawn_in_place():
    stream = _Terminal()
    clock = iter([0.0, 30.0, 60.0])
    reporter = ProgressReporter(PLANNED, stream, clock=lambda: next(clock))
    assert reporter.interval == progress.BAR_SECONDS
    with reporter:
        count(**TOTALS)
        reporter.show()
    first, last = stream.getvalue().split("\r\033[K")[1:]
    assert first == bar_line(TOTALS, PLANNED, 30.0)
    assert last == bar_line(TOTALS, PLANNED, 60.0) + "\n"
