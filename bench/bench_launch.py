"""Launch cost for many input files: planning and graph construction, nothing run.

A Dataflow launcher must finish planning, building and serialising the graph within its time
limit, so that work may grow with the number of input files only through glob expansion. This
makes N small local JSONL files (hard links: N directory entries, the data of 100 files),
then times, in this process, each step the launcher takes:

- ``prepare``: options parsed, the tokenizer checked, the pattern expanded, shards planned, the
  first records of the first file checked against the declared field mapping, the output
  directory checked;
- ``build``: the whole Beam graph built (``build_pipeline``);
- ``to_runner_api``: the graph serialised to its portable proto, as submission does.

    .venv/bin/python -m bench.bench_launch [--files 100000] [--dir /tmp/launch-bench]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from beam_pipeline.planning import prepare
from beam_pipeline.running import build_pipeline

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "data" / "c4_sample.jsonl"


def make_files(folder: Path, count: int) -> None:
    """``count`` JSONL files under ``folder`` in 100 subfolders, as hard links to one copy of
    the sample per subfolder (a file system allows some 65,000 links to one file)."""
    for i in range(count):
        sub = folder / "files" / f"{i % 100:02d}"
        if i < 100:
            sub.mkdir(parents=True)
            shutil.copy(SAMPLE, folder / f"source-{i:02d}.jsonl")
        os.link(folder / f"source-{i % 100:02d}.jsonl", sub / f"part-{i:06d}.jsonl")


def measure(folder: Path, count: int) -> dict:
    """Wall and CPU seconds of each launch step (CPU time too: this machine is shared)."""
    argv = [f"--input={folder}/files/*/*.jsonl#branch=knowledge;text=text",
            f"--output={folder}/out", "--quiet"]
    clocks = [(time.perf_counter(), time.process_time())]
    plan = prepare(argv)
    clocks.append((time.perf_counter(), time.process_time()))
    pipeline = build_pipeline(plan)
    clocks.append((time.perf_counter(), time.process_time()))
    proto = pipeline.to_runner_api()
    clocks.append((time.perf_counter(), time.process_time()))
    steps = {}
    spans = [*itertools.pairwise(clocks), (clocks[0], clocks[-1])]
    for name, (before, after) in zip(("prepare", "build", "to_runner_api", "total"), spans,
                                     strict=True):
        steps[f"{name}_wall_s"] = round(after[0] - before[0], 2)
        steps[f"{name}_cpu_s"] = round(after[1] - before[1], 2)
    return {
        "files": count,
        "shards": len(plan.shards),
        **steps,
        "graph_proto_mb": round(proto.ByteSize() / 1e6, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", help="where to make the files (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="launch-bench-"))
    try:
        made = time.perf_counter()
        make_files(folder, args.files)
        print(f"made {args.files:,} files in {time.perf_counter() - made:.1f} s", flush=True)
        print(json.dumps(measure(folder, args.files), indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
