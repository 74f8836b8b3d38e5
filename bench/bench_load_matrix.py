"""The load-comparison matrix: the same tokenized rows stored four ways, read as a training job
reads them, each in a fresh process.

    .venv/bin/python -m bench.bench_load_matrix                  # 256 MB of synthetic blocks
    .venv/bin/python -m bench.bench_load_matrix --mb 64 --chart docs/load_matrix.png

Formats (rows of ``input_ids``, the pipeline's pretrain layout: 2048-token blocks of random
Qwen2 ids, 1024 rows per row group):

- ``jsonl``: one JSON object of token lists per line, read with ``json.loads``;
- ``parquet``: this project's output, read with ``PackedRows`` (int32 views, zstd);
- ``arrow_mmap``: Arrow IPC files as ``datasets.save_to_disk`` writes them, opened with
  ``load_from_disk`` (memory-mapped) and iterated with the numpy format;
- ``hf_streaming``: the Parquet files through ``datasets.load_dataset(..., streaming=True)``.

Per format: bytes on disk, time to first batch (opening the data and collecting the first 8 rows,
imports excluded), tokens per second over the whole read (first batch included), and the resident
memory the read adds over the resident memory after imports: the peak (``VmHWM``), and the peaks
of its two parts, sampled every ``SAMPLE_ROWS`` rows: anonymous memory (the process's own heap)
and file-backed pages (a memory map's pages count as resident while mapped, though the kernel
can drop them when memory runs short).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.bench_loader import write_synthetic_blocks

FORMATS = ("jsonl", "parquet", "arrow_mmap", "hf_streaming")
BATCH_ROWS = 8
SAMPLE_ROWS = 64  # rows between two looks at the anonymous and file-backed resident memory
ROOT = Path(__file__).resolve().parents[1]


def write_formats(parquet: Path, workdir: Path) -> dict[str, Path]:
    """The rows of ``parquet`` in every format under ``workdir``; the paths to read."""
    from datasets import Dataset

    paths = {"parquet": parquet.parent, "jsonl": workdir / "jsonl",
             "arrow_mmap": workdir / "arrow", "hf_streaming": parquet.parent}
    paths["jsonl"].mkdir()
    source = pq.ParquetFile(parquet)
    with open(paths["jsonl"] / "rows.jsonl", "w") as out:
        for batch in source.iter_batches(batch_size=256, columns=["input_ids"]):
            for ids in batch.column(0).to_pylist():
                out.write(json.dumps({"input_ids": ids}, separators=(",", ":")) + "\n")
    Dataset.from_parquet(str(parquet), columns=["input_ids"],
                         cache_dir=str(workdir / "hf_cache")).save_to_disk(
        str(paths["arrow_mmap"]))
    return paths


def _rows(fmt: str, path: str) -> Iterator[np.ndarray]:
    """Each row's ``input_ids`` as a numpy array, the data opened on the first ``next``."""
    if fmt == "jsonl":
        with open(os.path.join(path, "rows.jsonl"), "rb") as lines:
            for line in lines:
                yield np.asarray(json.loads(line)["input_ids"], dtype=np.int32)
    elif fmt == "parquet":
        from beam_pipeline.training.loader import PackedRows

        for row in PackedRows(path, columns=["input_ids"]):
            yield row["input_ids"]
    elif fmt == "arrow_mmap":
        from datasets import load_from_disk

        for row in load_from_disk(path).with_format("numpy"):
            yield row["input_ids"]
    else:
        from beam_pipeline.training.loader import hf_streaming_dataset

        for row in hf_streaming_dataset(path).with_format("numpy"):
            yield row["input_ids"]


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(fmt: str, path: str) -> dict[str, float]:
    """Reads ``path`` in ``fmt`` in this process; call it in a fresh one (``--child``)."""
    import datasets  # noqa: F401  (every reader's imports count in none of them)

    import beam_pipeline.training.loader  # noqa: F401

    base = {field: _status_mb(field) for field in ("VmRSS", "RssAnon", "RssFile")}
    with open("/proc/self/clear_refs", "w") as clear_refs:  # VmHWM := VmRSS (Linux >= 4.0)
        clear_refs.write("5")
    start = time.perf_counter()
    rows = tokens = 0
    first_batch = None
    peak = {"RssAnon": 0.0, "RssFile": 0.0}
    for ids in _rows(fmt, path):
        rows += 1
        tokens += len(ids)
        if rows == BATCH_ROWS:
            first_batch = time.perf_counter() - start
        if rows % SAMPLE_ROWS == 0:
            peak = {field: max(value, _status_mb(field) - base[field])
                    for field, value in peak.items()}
    seconds = time.perf_counter() - start
    return {"rows": rows, "tokens": tokens, "seconds": seconds,
            "first_batch_s": first_batch if first_batch is not None else seconds,
            "rss_peak_added_mb": _status_mb("VmHWM") - base["VmRSS"],
            "anon_peak_added_mb": peak["RssAnon"], "file_peak_added_mb": peak["RssFile"]}


def measure_in_subprocess(fmt: str, path: str) -> dict[str, float]:
    command = [sys.executable, "-m", "bench.bench_load_matrix", "--child", fmt, path]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false",
                               "HF_DATASETS_OFFLINE": "1"})
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def disk_mb(path: Path, fmt: str) -> float:
    pattern = {"jsonl": "*.jsonl", "arrow_mmap": "*.arrow"}.get(fmt, "*.parquet")
    return sum(f.stat().st_size for f in path.glob(pattern)) / 2**20


def table(results: dict[str, dict]) -> str:
    lines = ["| format | on disk MB | first batch s | Mtokens/s | RSS added, peak MB | "
             "anonymous, peak MB | file-backed, peak MB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for fmt, r in results.items():
        lines.append(f"| {fmt} | {r['disk_mb']:.0f} | {r['first_batch_s']:.3f} | "
                     f"{r['tokens'] / r['seconds'] / 1e6:.1f} | {r['rss_peak_added_mb']:.0f} | "
                     f"{r['anon_peak_added_mb']:.0f} | {r['file_peak_added_mb']:.0f} |")
    return "\n".join(lines)


def chart(results: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Callable[[dict], float]]] = [
        ("Mtokens/s read (higher is better)", lambda r: r["tokens"] / r["seconds"] / 1e6),
        ("time to first batch, s", lambda r: r["first_batch_s"]),
        ("resident memory added (peak), MB", lambda r: r["rss_peak_added_mb"]),
        ("bytes on disk, MB", lambda r: r["disk_mb"]),
    ]
    names = list(results)
    figure, axes = plt.subplots(1, len(panels), figsize=(16, 3.8))
    for axis, (label, value) in zip(axes, panels, strict=True):
        values = [value(results[n]) for n in names]
        bars = axis.bar(names, values, color=["#888888", "#1f77b4", "#ff7f0e", "#2ca02c"])
        axis.bar_label(bars, fmt="%.3g", fontsize=8)
        axis.set_title(label, fontsize=10)
        axis.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=256,
                        help="size of the synthetic Parquet data, MB (default 256)")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "load_matrix.png",
                        help="where the bar chart goes (default docs/load_matrix.png)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", nargs=2, metavar=("FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    report, results = load_matrix(args.mb, args.chart)
    print(report)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def load_matrix(mb: float, chart_path: Path) -> tuple[str, dict[str, dict]]:
    """Writes ``mb`` MB of synthetic blocks in every format, reads each in a fresh process;
    returns the table (markdown) and the figures, and draws the chart."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "parquet").mkdir()
        parquet = workdir / "parquet" / "part-00000-of-00001.parquet"
        rows = write_synthetic_blocks(parquet, mb)
        paths = write_formats(parquet, workdir)
        os.sync()  # written back before any read: no reader waits on the others' writeback
        results = {}
        for fmt in FORMATS:
            measured = measure_in_subprocess(fmt, str(paths[fmt]))
            if measured["rows"] != rows:
                raise RuntimeError(f"{fmt} read {measured['rows']} rows of {rows}")
            results[fmt] = {**measured, "disk_mb": disk_mb(paths[fmt], fmt)}
            print(f"[load matrix] {fmt}: {measured}", file=sys.stderr, flush=True)
    chart(results, chart_path, f"{rows:,} rows of 2048 tokens ({rows * 2048 / 1e6:.0f} M tokens), "
          "one reader process each")
    shown = chart_path.relative_to(ROOT) if chart_path.is_relative_to(ROOT) else chart_path
    return f"{table(results)}\n\nChart: `{shown}`", results


if __name__ == "__main__":
    main()
