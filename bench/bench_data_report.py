"""What the data report costs: ``python -m beam_pipeline.report`` on the demo's outputs, and on
the same outputs with their SFT and pretraining rows repeated ``--copies`` times, to show that
the report reads the Parquet files in bounded memory (only its time grows with the rows).

    .venv/bin/python -m bench.bench_data_report [--copies 200]

The demo's outputs are made first (the Makefile's demo recipe, into out/bench/report-demo).
Each measurement is one fresh process (imports included), wall time and peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq

from beam_pipeline.cli import main as pipeline_main
from bench.proc import run
from tests.test_readme import demo_arguments

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "out" / "bench"


def demo_output() -> Path:
    output = WORK / "report-demo"
    cwd = Path.cwd()
    os.chdir(ROOT)  # the recipe's inputs are relative to the repository
    try:
        pipeline_main([*demo_arguments(str(output)), "--overwrite=true"])
    finally:
        os.chdir(cwd)
    return output


def repeated(source: Path, copies: int) -> tuple[Path, int]:
    """A copy of ``source`` whose sft/ and pretrain/ files hold every row ``copies`` times (the
    manifest's counts are left as they were: the report's histograms come from the files)."""
    target = WORK / f"report-demo-x{copies}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    rows = 0
    for kind in ("sft", "pretrain"):
        for entry in manifest["outputs"].get(kind, []):
            path = target / kind / Path(entry["path"]).name
            table = pq.read_table(path)
            with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
                for _ in range(copies):
                    writer.write_table(table, row_group_size=1024)
            rows += entry["rows"] * copies
    return target, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=200)
    args = parser.parse_args()
    small = demo_output()
    large, rows = repeated(small, args.copies)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for label, folder in (("demo outputs", small), (f"x{args.copies}: {rows:,} rows", large)):
        measured = run([sys.executable, "-m", "beam_pipeline.report", str(folder)], env, ROOT,
                       label)
        size = sum(f.stat().st_size for f in folder.rglob("*.parquet")) / 2**20
        print(f"| {label} ({size:,.1f} MB of Parquet) | {measured.wall_s:.1f} s | "
              f"{measured.cpu_s:.1f} s | {measured.peak_rss_mb:,.0f} MB | "
              f"{measured.others_cores:.2f} |")
    print(f"report.html of the demo: {(small / 'report.html').stat().st_size / 1024:,.0f} KiB")


if __name__ == "__main__":
    main()
