"""The benchmark's report: machine, versions, throughput, and the targets as same-run ratios.

``BENCHMARKS.md`` keeps hand-written notes (method, profiles, plans) around a generated section
between two markers; a run replaces only that section.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path

BEGIN = "<!-- bench:begin (written by `make bench`; edit outside these markers) -->"
END = "<!-- bench:end -->"
PACKAGES = ("apache-beam", "pyarrow", "numpy", "tokenizers", "transformers", "tiktoken",
            "datasets", "trl", "torch")


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured approach: what it did and how long it took."""

    name: str
    records: str  # "18,456 documents"
    tokens: int
    seconds: float
    cpu_s: float | None  # CPU seconds of the same work; None where not measured on its own
    peak_mb: float | None  # whole process tree; None where not measured on its own
    others_cores: float | None  # cores other processes kept busy meanwhile (noise)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from the issue, checked as a ratio measured in this run."""

    name: str
    measured: str
    goal: str
    met: bool | None  # None: reported, no goal


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        memory_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return (f"{len(os.sched_getaffinity(0))} cores usable ({os.cpu_count()} online), {model}, "
            f"{memory_kb / 1024 ** 2:.1f} GiB memory, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _status(met: bool | None) -> str:
    return {True: "met", False: "**NOT MET**", None: ""}[met]


def render(command: str, scale_note: str, rows: Sequence[Row], targets: Sequence[Target],
           notes: Sequence[str]) -> str:
    """The generated section, as Markdown (printed to the terminal as it is)."""
    lines = [
        f"Run {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} with `{command}`.",
        "",
        f"- Machine: {machine()}.",
        f"- Versions: {versions()}.",
        f"- Inputs: {scale_note}",
        "",
        "| approach | input | tokens | wall s | tokens/s | CPU s | peak RSS (MB) | others' "
        "load (cores) | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        cpu = "" if row.cpu_s is None else f"{row.cpu_s:.1f}"
        peak = "" if row.peak_mb is None else f"{row.peak_mb:,.0f}"
        others = "" if row.others_cores is None else f"{row.others_cores:.2f}"
        lines.append(f"| {row.name} | {row.records} | {row.tokens:,} | {row.seconds:.1f} | "
                     f"{row.rate / 1e6:.3f} M | {cpu} | {peak} | {others} | {row.note} |")
    lines += ["", "| target (same-run ratio) | measured | goal | status |", "|---|---|---|---|"]
    lines += [f"| {t.name} | {t.measured} | {t.goal} | {_status(t.met)} |" for t in targets]
    lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replaces the generated section of ``path`` (appends one if there is none)."""
    block = f"{BEGIN}\n{section}{END}\n"
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
