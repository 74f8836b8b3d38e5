"""The workers' side of a run's progress: the counters reading and writing steps keep, here so
that those steps need nothing from the launcher (``beam_pipeline/progress.py`` shows the sums).

Workers count records read, bytes read, shards done and tokens written twice: as Beam metrics
(namespace ``progress``: Dataflow shows them on the job page while it runs) and, on a local run,
through a side channel. The local side channel exists because Beam's local runners give no
live counters: the FnApiRunner (both ``--direct_running_mode`` values) returns its
``PipelineResult`` only when the run has finished, and in ``multi_processing`` mode the counting
happens in worker processes. So each process writes its running totals, now and then, to its
own small JSON file in a directory that the launcher names in the environment variable
``PROGRESS_DIR_ENV`` (worker processes inherit it); a launcher thread sums the files.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

from apache_beam.metrics import Metrics

PROGRESS_DIR_ENV = "BEAM_PIPELINE_PROGRESS_DIR"
NAMESPACE = "progress"
COUNTERS = ("records_read", "bytes_read", "shards_done", "tokens_written")


class _ProcessTotals:
    """This process's running totals, rewritten to its own file in the side-channel directory
    on every change: a worker process may be stopped as soon as the run ends, so nothing is
    held back (the file is a few dozen bytes, written once per chunk or part)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals = dict.fromkeys(COUNTERS, 0)
        self.name = f"{os.getpid()}-{uuid.uuid4().hex}.json"

    def add(self, directory: str, counts: dict[str, int]) -> None:
        with self.lock:
            for key, value in counts.items():
                self.totals[key] += value
            text = json.dumps(self.totals)
            path = os.path.join(directory, self.name)
            with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(f"{path}.tmp", path)  # readers never see half a file


# By process id (a forked child starts its own) and side-channel directory (one per run).
_TOTALS: dict[tuple[int, str], _ProcessTotals] = {}
_TOTALS_LOCK = threading.Lock()


def _process_totals(directory: str) -> _ProcessTotals:
    key = (os.getpid(), directory)
    with _TOTALS_LOCK:
        if key not in _TOTALS:
            _TOTALS[key] = _ProcessTotals()
        return _TOTALS[key]


def count(**counts: int) -> None:
    """Adds to the run's progress counters (the names in ``COUNTERS``), from any worker."""
    for name, value in counts.items():
        if value:
            Metrics.counter(NAMESPACE, name).inc(value)
    directory = os.environ.get(PROGRESS_DIR_ENV)
    if directory and os.path.isdir(directory):
        _process_totals(directory).add(directory, counts)
