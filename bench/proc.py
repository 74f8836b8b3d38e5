"""Runs one measured command: wall time and the peak resident memory of its whole process tree.

Memory is read from ``/proc`` (no psutil in the pipeline's environment): every ``POLL_S`` the
resident set sizes of the process and all its descendants are summed, which counts the
DirectRunner's worker processes with the driver. Shared pages are counted once per process, so
the figure is an upper bound, which is what a machine's memory budget needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

POLL_S = 0.2  # one poll costs about 1 ms of CPU: 0.5% of a core
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Measured:
    wall_s: float
    peak_rss_mb: float
    cpu_s: float  # CPU time of the process tree (user + system)
    others_cpu_s: float  # CPU time every other process on the machine used meanwhile
    log: str  # stdout and stderr together, for error messages and the pipeline's summary

    @property
    def others_cores(self) -> float:
        """How many cores other processes kept busy on average: noise in this measurement."""
        return self.others_cpu_s / self.wall_s


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children, their own children included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Clock:
    """Wall and CPU seconds spent inside ``timing()`` blocks.

    CPU counts every thread of this process and its finished children (pool workers), so it
    stays meaningful when other processes crowd the machine and stretch the wall time.
    """

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = 0.0

    @staticmethod
    def _cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime + children_cpu_s()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), self._cpu()
        yield
        self.wall_s += time.perf_counter() - wall
        self.cpu_s += self._cpu() - cpu


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids for every process visible now."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # exited while we looked
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all of its descendants."""
    tree, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        total += _resident_bytes(pid)
        todo.extend(tree.get(pid, ()))
    return total


def run(command: Sequence[str], env: Mapping[str, str], cwd: Path, what: str) -> Measured:
    """Runs ``command`` to completion; raises with its log if it fails."""
    peak = 0
    busy, ours = machine_busy_s(), children_cpu_s()
    start = time.perf_counter()
    with subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as process:
        output: list[bytes] = []
        reader = threading.Thread(target=lambda: output.append(process.stdout.read()))
        reader.start()
        while True:
            peak = max(peak, tree_rss_bytes(process.pid))
            try:
                process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - start
        reader.join()
    busy, ours = machine_busy_s() - busy, children_cpu_s() - ours
    log = b"".join(output).decode("utf-8", "replace")
    if process.returncode:
        raise RuntimeError(f"{what} failed with exit code {process.returncode}:\n"
                           f"$ {' '.join(command)}\n{log[-4000:]}")
    return Measured(wall, peak / MB, ours, max(0.0, busy - ours), log)
