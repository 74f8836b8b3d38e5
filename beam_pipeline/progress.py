"""The launcher's side of a run's progress: the thread that sums the workers' side-channel
files and the line (or bar) it prints on stderr (the counters: ``transforms/core/progress.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TextIO

from transforms.core.progress import COUNTERS, PROGRESS_DIR_ENV

LINE_SECONDS = 5.0  # how often a progress line is printed when stderr is not a terminal
BAR_SECONDS = 0.5  # how often the bar is redrawn on a terminal
BAR_WIDTH = 24


def read_totals(directory: str) -> dict[str, int]:
    """The sum of every process's latest totals in the side-channel directory."""
    totals = dict.fromkeys(COUNTERS, 0)
    for name in os.listdir(directory):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                counts = json.load(handle)
        except (OSError, ValueError):
            continue  # replaced while being opened: the next look sees it
        for key in COUNTERS:
            totals[key] += int(counts.get(key, 0))
    return totals


@dataclasses.dataclass(frozen=True)
class Planned:
    """What planning knows before any record is read."""

    shards: int
    bytes: int


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"


def progress_line(totals: dict[str, int], planned: Planned, elapsed: float) -> str:
    """One line: records read, shards and bytes of the planned total, tokens written, rate,
    elapsed time, and the time left estimated from the share of planned bytes read."""
    share = min(1.0, totals["bytes_read"] / planned.bytes) if planned.bytes else 0.0
    rate = totals["records_read"] / elapsed if elapsed > 0 else 0.0
    left = elapsed * (1 - share) / share if share > 0 else None
    return (f"progress: {totals['records_read']:,} records read "
            f"({totals['shards_done']:,}/{planned.shards:,} shards, "
            f"{_size(totals['bytes_read'])} of {_size(planned.bytes)}, {share:.0%}), "
            f"{totals['tokens_written']:,} tokens written, {rate:,.0f} records/s, "
            f"elapsed {_duration(elapsed)}, "
            f"{_left(share, left)}")


def _left(share: float, left: float | None) -> str:
    if share >= 1:
        return "all input read"
    return "time left unknown" if left is None else f"about {_duration(left)} left"


def bar_line(totals: dict[str, int], planned: Planned, elapsed: float) -> str:
    """The terminal form: a bar of the planned bytes read, then the same figures."""
    share = min(1.0, totals["bytes_read"] / planned.bytes) if planned.bytes else 0.0
    filled = round(share * BAR_WIDTH)
    text = progress_line(totals, planned, elapsed).removeprefix("progress: ")
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}"


class ProgressReporter:
    """Prints the run's progress on ``stream`` from a background thread while the run works:
    a line every ``LINE_SECONDS``, or a bar redrawn in place when the stream is a terminal.

    Used as a context manager around the run; it owns the side-channel directory, which it
    names in the environment for the workers and removes at the end.
    """

    def __init__(self, planned: Planned, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.planned = planned
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.terminal = stream.isatty()
        self.interval = BAR_SECONDS if self.terminal else LINE_SECONDS
        self._stop = threading.Event()
        self._directory = tempfile.TemporaryDirectory(prefix="beam_pipeline-progress-")
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._start = 0.0
        self._previous: str | None = None

    def __enter__(self) -> ProgressReporter:
        self._previous = os.environ.get(PROGRESS_DIR_ENV)
        os.environ[PROGRESS_DIR_ENV] = self._directory.name
        self._start = self.clock()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._previous is None:
            os.environ.pop(PROGRESS_DIR_ENV, None)
        else:
            os.environ[PROGRESS_DIR_ENV] = self._previous
        self._directory.cleanup()

    def totals(self) -> dict[str, int]:
        return read_totals(self._directory.name)

    def show(self, final: bool = False) -> None:
        elapsed = self.clock() - self._start
        if self.terminal:
            end = "\n" if final else ""
            self.stream.write(f"\r\033[K{bar_line(self.totals(), self.planned, elapsed)}{end}")
        else:
            self.stream.write(progress_line(self.totals(), self.planned, elapsed) + "\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.show()
        self.show(final=True)
