"""Beam SDK worker processes leave without the interpreter's teardown.

With ``--direct_running_mode=multi_processing`` the runner waits for every worker process to
exit after the last stage. Each spent 1 to 2 s in teardown: freeing the tokenizers' tables and
collecting the last garbage, memory the operating system takes back anyway. By the time the
harness returns, every bundle has finished and reported, so nothing is lost by leaving at once.
``python -m beam_pipeline`` does the same for the launching process.

Only a process whose ``__main__`` is Beam's SDK worker is affected (on Dataflow too, where the
harness is the same module); importing this package anywhere else changes nothing.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"
# What must still happen before leaving: stopping helper processes, whose queues' semaphores
# the multiprocessing resource tracker would otherwise report as leaked.
_BEFORE_LEAVING: list[Callable[[], None]] = []


def in_sdk_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == SDK_WORKER_MAIN


@functools.cache  # once per process
def install() -> None:
    """In an SDK worker process, leave as soon as the interpreter starts to shut down."""
    if in_sdk_worker():
        atexit.register(_leave)


def before_leaving(function: Callable[[], None]) -> None:
    """Runs ``function`` in ``leave``, before the process goes (once, however often given)."""
    if function not in _BEFORE_LEAVING:
        _BEFORE_LEAVING.append(function)


def leave(status: int) -> NoReturn:
    """Ends the process now with ``status``, without the interpreter's teardown."""
    for function in _BEFORE_LEAVING:
        function()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _leave() -> None:
    # atexit runs once non-daemon threads have ended. An uncaught exception was printed and
    # left in sys.last_value: keep the failed exit status the runner checks.
    leave(1 if hasattr(sys, "last_value") else 0)
