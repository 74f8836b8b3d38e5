"""Helper processes for per-document Python work that a second core could do.

The DirectRunner's ``in_memory`` mode runs a stage on one thread, and threads cannot share pure
Python work: the interpreter lock passes between them at its switch interval (5 ms), so a
thread beside the busy main thread waits after every small call. A batch split between helper
processes (one per core, at most 8, each with its own interpreter) runs while the main thread
goes on, and gives the same answer as in the calling process: the same code on the same data.

``start_split(function, items, chars)`` sends a large batch (``chars``, the characters its items
hold, measures its work) to the helpers in one part per helper and returns a function that
waits for the results, in order; a small batch, a single core, or helpers that broke twice in
this process (an unguarded main script fails every start) make it run here and now. A helper
that dies (killed for memory?) makes its batch run here; the next batch starts new helpers.
``function`` and the items are pickled: a top-level function or a bound method of a picklable
object.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from transforms.core import worker_exit

T = TypeVar("T")
R = TypeVar("R")

# Characters from which a batch goes to the helpers: starting them costs about a second of CPU
# per helper, once per process, which the bundled examples' files (300 KB at most) would not
# repay. A chunk of the bench corpus (``make bench``) holds 0.8 to 1.2 MB of language-id samples.
MIN_CHARS = 500_000

_POOLS: dict[int, ProcessPoolExecutor] = {}  # by the pid that made it: a fork starts afresh
_POOL_LOCK = threading.Lock()
_BROKEN: collections.Counter[int] = collections.Counter()  # helper pools that broke, by pid
_MAX_BROKEN = 2


def start_split(function: Callable[[Sequence[T]], list[R]], items: Sequence[T], chars: int
                ) -> Callable[[], list[R]]:
    """Starts ``function(items)``, split between the helpers for ``MIN_CHARS`` characters or
    more; the returned function waits for its result (the parts' results joined, in order)."""
    pool = _pool() if chars >= MIN_CHARS and len(items) > 1 else None
    if pool is None:
        here = function(items)
        return lambda: here
    cuts = [len(items) * k // processes() for k in range(processes() + 1)]
    try:
        parts = [pool.submit(function, items[a:b]) for a, b in itertools.pairwise(cuts)]
    except BrokenProcessPool:
        parts = None

    def results() -> list[R]:
        try:
            if parts is not None:
                return [result for part in parts for result in part.result()]
        except BrokenProcessPool:
            pass
        _forget(pool)
        return function(items)

    return results


def processes() -> int:
    """Helpers per pool: one per core, at most 8."""
    return min(os.cpu_count() or 1, 8)


def _pool() -> ProcessPoolExecutor | None:
    """This process's helpers (started on first use), or None on a single core, in a Beam SDK
    worker, or once helpers broke twice here.

    An SDK worker (``multi_processing``, Dataflow) is already one process per core, and a
    helper started there imports the worker's main module, all of Beam: 220 MB of memory
    each, per worker, for no core left to use. Helpers of ``python -m beam_pipeline`` skip
    its ``__main__`` (multiprocessing does not re-import a package's ``__main__``)."""
    if processes() < 2 or worker_exit.in_sdk_worker() or _BROKEN[os.getpid()] >= _MAX_BROKEN:
        return None
    with _POOL_LOCK:
        pool = _POOLS.get(os.getpid())
        if pool is None:
            pool = ProcessPoolExecutor(processes(), mp_context=_start_method(),
                                       initializer=_start_helper)
            worker_exit.before_leaving(close_helpers)
            _POOLS[os.getpid()] = pool
        return pool


def close_helpers() -> None:
    """Stops this process's helpers (``worker_exit.leave`` does, before it skips teardown)."""
    with _POOL_LOCK:
        pool = _POOLS.pop(os.getpid(), None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _forget(pool: ProcessPoolExecutor) -> None:
    with _POOL_LOCK:
        if _POOLS.get(os.getpid()) is pool:
            del _POOLS[os.getpid()]
            _BROKEN[os.getpid()] += 1
    pool.shutdown(wait=False)


def _start_method() -> multiprocessing.context.BaseContext:
    """Helpers fork from a small server process where the platform has one, else start afresh:
    forking this process, which runs Beam's and the tokenizer's threads, is unsafe. Either way
    a helper imports the main script, as Python's child processes do (docs/curation.md)."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def _start_helper() -> None:
    """In a helper: leave when the process that started it ends (a launcher that leaves with
    ``os._exit`` never stops its helpers)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
