"""Runs one measured command: wall time and the peak resident memory of its whole process tree.

Memory is read from ``/proc`` (no psutil in the pipeline's environment): every ``POLL_S`` the
resident set sizes of the process and all its descendants are summed, which counts the
DirectRunner's worker processes with the driver. Shared pages are counted once per process, so
the figure is an upper bound, which is what a machine's memory budget needs. CPU time is the
kernel's count of the processes the command waited for, or, where more, the sum over every
process the polls saw in the tree (helpers under a fork server are never waited for).
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
TICK = os.sysconf("SC_CLK_TCK")
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
    return (sum(fields[:8]) - idle) / TICK


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


def _processes() -> dict[int, tuple[int, float, int]]:
    """pid -> (parent pid, CPU seconds the process itself used, its start time) for every
    process visible now."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # exited while we looked
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK,
                                  int(fields[19]))
    return found


def _tree(root: int, processes: Mapping[int, tuple[int, float, int]]) -> list[int]:
    """``root`` and all of its descendants among ``processes``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError):
        return 0


class TreePoll:
    """What every poll of a process tree saw: its peak resident bytes, and the CPU seconds of
    each process in it, by (pid, start time). The CPU seen counts descendants that nobody
    waits for, such as the helpers a multiprocessing fork server starts, whose time never
    reaches ``RUSAGE_CHILDREN``; it misses at most a poll's worth of each process's last
    moments."""

    def __init__(self, root: int):
        self.root = root
        self.peak_bytes = 0
        self.cpu: dict[tuple[int, int], float] = {}

    def poll(self) -> None:
        processes = _processes()
        tree = _tree(self.root, processes)
        self.peak_bytes = max(self.peak_bytes, sum(map(_resident_bytes, tree)))
        for pid in tree:
            if pid in processes:
                _, cpu, started = processes[pid]
                self.cpu[pid, started] = cpu

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())


def run(command: Sequence[str], env: Mapping[str, str], cwd: Path, what: str) -> Measured:
    """Runs ``command`` to completion; raises with its log if it fails."""
    busy, ours = machine_busy_s(), children_cpu_s()
    start = time.perf_counter()
    with subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as process:
        output: list[bytes] = []
        reader = threading.Thread(target=lambda: output.append(process.stdout.read()))
        reader.start()
        polled = TreePoll(process.pid)
        while True:
            polled.poll()
            try:
                process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - start
        reader.join()
    # Waited-for processes are counted exactly by the kernel; the polls add those nobody waits
    # for (each count alone is low, never high).
    busy, ours = machine_busy_s() - busy, max(children_cpu_s() - ours, polled.cpu_s)
    log = b"".join(output).decode("utf-8", "replace")
    if process.returncode:
        raise RuntimeError(f"{what} failed with exit code {process.returncode}:\n"
                           f"$ {' '.join(command)}\n{log[-4000:]}")
    return Measured(wall, polled.peak_bytes / MB, ours, max(0.0, busy - ours), log)
