"""Where a run's time goes, step by step: one ``python -m beam_pipeline`` run sampled by py-spy.

Issue #35 asks for a per-step profile of each branch with every default step on before any
speed work. This runs the branch on the bench corpus (``bench.corpus``, the inputs ``make
bench`` uses) under ``py-spy record`` (a sampling profiler: the run is not instrumented, only
slowed by a few percent at the default rate) and charges every sample to the innermost frame
of this project's code on its stack, by module: the project keeps one module per concern, so
``transforms/knowledge/quality.py`` is the quality rules and ``transforms/core/fast_encoder.py``
the tokenizer's fast path, whatever numpy, tiktoken or fastText call they make underneath.
Samples with none of our frames are the interpreter's imports or Beam's runner, thread pools
between tasks and other libraries; py-spy leaves out threads that sleep. Child processes are
sampled too (Beam's workers, the language model's helpers), so work moved out of the main
process still counts.

    .venv/bin/python -m bench.bench_profile --branch knowledge [--scale 10] [--rate 50]
    .venv/bin/python -m bench.bench_profile --branch instruction [--scale 20]

Shares are of the samples of running threads; seconds are those shares of the run's wall time
(with a thread pool at work beside the main thread they are shares, not CPU seconds).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import corpus
from bench.run import CHAT_TEMPLATE, ROOT, SEQ_LEN

OURS = tuple(f"{ROOT}/{package}/" for package in ("transforms", "beam_pipeline"))
# The launcher's frames that only call into Beam's runner: what runs under them alone is Beam's.
LAUNCHER = tuple(f"{ROOT}/beam_pipeline/{name}.py" for name in ("__main__", "cli", "running"))


def charge(stack: str) -> str:
    """The module (or outside bucket) one sampled stack is charged to."""
    frames = stack.split(";")
    if any("<frozen importlib._bootstrap" in frame for frame in frames):
        return "(imports)"
    for frame in reversed(frames):
        path = frame.rpartition("(")[2].split(":")[0]
        if path.startswith(OURS) and path not in LAUNCHER:
            return path.removeprefix(f"{ROOT}/")
    return "(none of ours: Beam's runner, thread pools between tasks, other libraries)"


def profile(folded: Path) -> collections.Counter:
    samples: collections.Counter = collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples[charge(stack)] += int(count)
    return samples


def table(samples: collections.Counter, wall_s: float, smallest: float = 0.005) -> str:
    """Rows of at least ``smallest`` of the samples; our smaller modules summed in one row."""
    total = sum(samples.values())
    lines = ["| charged to | share of samples | seconds of the run |", "|---|---:|---:|"]
    rest = collections.Counter()
    for name, count in samples.most_common():
        if count / total < smallest and not name.startswith("("):
            rest[name] = count
            continue
        shown = name if name.startswith("(") else f"`{name}`"
        lines.append(f"| {shown} | {count / total:.1%} | {count / total * wall_s:.1f} |")
    if rest:
        count = rest.total()
        lines.append(f"| ({len(rest)} more of our modules, each < {smallest:.1%}) | "
                     f"{count / total:.1%} | {count / total * wall_s:.1f} |")
    lines.append(f"\n{total:,} samples of running threads; wall time {wall_s:.1f} s.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--branch", choices=("knowledge", "instruction"), required=True)
    parser.add_argument("--scale", type=float, help="copies of the bench corpus "
                        "(default 10 for knowledge, 20 for instruction: make bench's 1x)")
    parser.add_argument("--mode", default="in_memory",
                        choices=("in_memory", "multi_processing"))
    parser.add_argument("--rate", type=int, default=50, help="samples per second")
    parser.add_argument("--workdir", type=Path, default=ROOT / "out" / "bench")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    data = args.workdir / "data"
    if args.branch == "knowledge":
        inputs = corpus.knowledge(data, args.scale or 10)
        pattern, extra = "knowledge-*.parquet#branch=knowledge", []
    else:
        inputs = corpus.instruction(data, args.scale or 20, SEQ_LEN, CHAT_TEMPLATE)
        pattern, extra = "instruction-*.jsonl#branch=instruction", [
            f"--chat_template={CHAT_TEMPLATE}"]
    folder = Path(inputs.files[0]).resolve().parent
    folded = args.workdir / f"profile-{args.branch}-{args.mode}.folded"
    command = [spy, "record", "--rate", str(args.rate), "--format", "raw", "--full-filenames",
               "--output",
               str(folded), "--subprocesses",
               "--", sys.executable, "-m", "beam_pipeline", f"--input={folder}/{pattern}",
               f"--output={args.workdir / 'runs' / f'profile-{args.branch}'}",
               "--overwrite=true", "--quiet", f"--direct_running_mode={args.mode}", *extra]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall_s = time.perf_counter() - started
    print(f"{args.branch}, {args.mode}, {inputs.records:,} records:\n")
    print(table(profile(folded), wall_s))


if __name__ == "__main__":
    main()
