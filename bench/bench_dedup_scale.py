"""Deduplication's memory at scale, by simulation: peak resident memory against the share of
duplicates, and the rounds label propagation takes (issue 20; docs/dedup.md).

Each cell is N synthetic documents: one giant cluster (a template and 99,999 copies, half exact
and half near) and, among the other N - 10^5, a fraction F of copies of earlier documents
(alternately exact and near; an original may get several). A document is what deduplication's
first pass makes of one (``DocumentKeys``: node, 16 LSH band keys, a 128-value MinHash
signature). A near copy is its template's signature with 1 to 8 values replaced, so it is
verified (estimated similarity >= 0.93) and shares at least half its bands. They are made
inside the pipeline, a chunk of 4,096 at a time, and go through the real ``FindDuplicates``
(bands, candidate pairs, verification, ``ConnectedComponents``) with the production bucket
count (one per 256 MiB of input at about 4 KB a document), on the DirectRunner in
``multi_processing`` mode with one worker process.

Each cell runs in its own process. Memory is read from ``/proc`` (``VmHWM``, the kernel's
high-water mark of resident memory) for the worker process, which runs every step, one bundle
after another (its peak is the peak of the largest single step), and for the runner process,
which here plays Dataflow's shuffle service: the FnApiRunner keeps every shuffle's data in its
own memory, so that figure grows with what is shuffled, by design of the local runner.

    .venv/bin/python -m bench.bench_dedup_scale [--docs 1000000] [--dups 0.05 0.3 0.6]
        [--giant 100000] [--workers 1]

Prints one JSON line per cell and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from transforms.core.steps import METRICS_NAMESPACE
from transforms.knowledge.dedup import (
    MAX_ROUNDS,
    DedupConfig,
    DocumentKeys,
    FindDuplicates,
    band_keys,
)

CHUNK = 4096
GIANT = 100_000  # members of the giant cluster: a template and its copies
DOCS_PER_BUCKET = 65_536  # 256 MiB of input at about 4 KB a document (SHARDS_PER_KEY_BUCKET)
CONFIG = DedupConfig()
POLL_S = 0.1


class Corpus:
    """Which document copies which: position arithmetic, so every chunk is made on its own."""

    def __init__(self, docs: int, dups: float, giant: int = GIANT):
        self.docs = docs
        self.giant = giant
        self.others = docs - giant
        self.copies = round(dups * self.others)
        self.originals = self.others - self.copies

    def template(self, position: int) -> tuple[int, bool] | None:
        """(the position copied, exact) for a copy; None for an original."""
        if position < self.giant:
            return (0, position % 2 == 0) if position else None
        index = position - self.giant
        if index < self.originals:
            return None
        k = index - self.originals
        return self.giant + (k * 7919) % self.originals, k % 2 == 0

    @property
    def expected_drops(self) -> int:
        return self.giant - 1 + self.copies


def _signature(template: int) -> np.ndarray:
    return np.random.default_rng(template).integers(0, 2**32 - 1, CONFIG.num_perm,
                                                    dtype=np.uint32)


def _content(tag: str, number: int) -> bytes:
    return hashlib.blake2b(f"{tag}:{number}".encode(), digest_size=16).digest()


def make_chunk(chunk: int, corpus: Corpus) -> Iterator[tuple[DocumentKeys, ...]]:
    docs = []
    for position in range(chunk * CHUNK, min((chunk + 1) * CHUNK, corpus.docs)):
        copied = corpus.template(position)
        if copied is None:
            content, signature = _content("doc", position), _signature(position)
        elif copied[1]:  # exact
            content, signature = _content("doc", copied[0]), _signature(copied[0])
        else:
            rng = np.random.default_rng([position, 1])
            signature = _signature(copied[0])
            changed = rng.choice(CONFIG.num_perm, rng.integers(1, 9), replace=False)
            signature[changed] = rng.integers(0, 2**32 - 1, len(changed), dtype=np.uint32)
            content = _content("near", position)
        docs.append(DocumentKeys((0, 0, position, chunk, content),
                                 band_keys(signature, CONFIG.bands), signature.tobytes()))
    yield tuple(docs)


class _Peaks:
    """Polls ``VmHWM`` of this process and of every descendant."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.done.wait(POLL_S):
            for pid in [os.getpid(), *_descendants(os.getpid())]:
                hwm = _hwm_kb(pid)
                if hwm:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), hwm)

    def __enter__(self) -> _Peaks:
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.done.set()
        self.thread.join()


def _hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _count(decision) -> None:
    beam.metrics.Metrics.counter("bench", "decisions").inc()


def run_cell(docs: int, dups: float, giant: int, workers: int) -> dict:
    corpus = Corpus(docs, dups, giant)
    buckets = max(1, -(-docs // DOCS_PER_BUCKET))
    options = PipelineOptions(["--direct_running_mode=multi_processing",
                               f"--direct_num_workers={workers}"])
    started = time.perf_counter()
    with _Peaks() as peaks:
        pipeline = beam.Pipeline(runner="DirectRunner", options=options)
        _ = (pipeline
             | beam.Create(range(-(-docs // CHUNK)))
             | beam.FlatMap(make_chunk, corpus)
             | FindDuplicates(CONFIG.threshold, buckets)
             | beam.Map(_count))
        result = pipeline.run()
        result.wait_until_finish()
    wall = time.perf_counter() - started
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        MetricsFilter())["counters"] if c.key.metric.namespace in ("bench", METRICS_NAMESPACE)}
    changed = [counters.get(f"dedup.round_{r:02d}.changed", 0) for r in range(1, MAX_ROUNDS + 1)]
    me = os.getpid()
    children = [kb for pid, kb in peaks.peaks.items() if pid != me]
    return {
        "docs": docs, "dup_fraction": dups, "giant": giant, "workers": workers,
        "duplicates": corpus.expected_drops,
        "decided": counters.get("decisions", 0),
        "rounds_with_changes": sum(1 for n in changed if n),
        "changed_per_round": changed,
        "worker_peak_mb": round(max(children, default=0) / 1024),
        "runner_peak_mb": round(peaks.peaks.get(me, 0) / 1024),
        "wall_s": round(wall),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--dups", type=float, nargs="+", default=[0.05, 0.3, 0.6])
    parser.add_argument("--giant", type=int, default=GIANT, help="members of the giant cluster")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--cell", action="store_true", help="run one cell in this process")
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(run_cell(args.docs[0], args.dups[0], args.giant, args.workers)),
              flush=True)
        return
    rows = []
    for docs in args.docs:
        for dups in args.dups:
            out = subprocess.run([sys.executable, "-m", "bench.bench_dedup_scale", "--cell",
                                  "--docs", str(docs), "--dups", str(dups),
                                  "--giant", str(args.giant), "--workers", str(args.workers)],
                                 capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            if row["decided"] != row["duplicates"]:
                raise SystemExit(f"wrong decisions: {row}")
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("| documents | duplicates | worker peak (MB) | runner peak (MB) | rounds with changes"
          " | labels changed per round | wall (s) |")
    print("|---:|---:|---:|---:|---:|---|---:|")
    for row in rows:
        print(f"| {row['docs']:,} | {row['duplicates']:,} ({row['duplicates'] / row['docs']:.0%})"
              f" | {row['worker_peak_mb']:,} | {row['runner_peak_mb']:,} | "
              f"{row['rounds_with_changes']} | {row['changed_per_round']} | {row['wall_s']:,} |")


if __name__ == "__main__":
    main()
