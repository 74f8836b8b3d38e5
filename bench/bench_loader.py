"""Rows and tokens per second read by ``beam_pipeline.training.loader``, and the resident memory
it adds.

    .venv/bin/python -m bench.bench_loader                    # a synthetic 512 MB pretrain file
    .venv/bin/python -m bench.bench_loader out/demo/sft out/demo/pretrain --synthetic-mb 0

Each (data, reader) pair runs in a fresh process, so one reader's imports and allocator state do
not count against another: the "RSS added" column is the peak resident memory while reading
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the resident memory once
the reader is set up, imports and footers included in neither. Readers:

- ``rows``: ``PackedRows``, each row as int32 numpy views (what a training loop iterates);
- ``torch``: a ``DataLoader`` over ``PackedParquetDataset`` with ``PackedCollator``, batches of 8
  rows flattened into one padding-free sequence, in the main process;
- ``datasets``: ``hf_streaming_dataset`` with the numpy format, for comparison.

The synthetic file has the pipeline's pretrain layout at its defaults (2048-token blocks, 1024
rows per row group, zstd), with random token ids.

``--epoch-packing`` measures instead what one dataloader worker of ``EpochPacks`` does: the
benchmark's instruction examples (``bench/corpus.py``, 1x) go through the pipeline with
``--write_examples=true --seq_len=2048``, and a fresh process reads ``sft_examples/`` and packs two
epochs, timing the whole (read, shuffle, pack, build the rows) and the packing alone. The target
beside it: a GPU must never wait, and a 7B model trains at about 3,000 tokens/s per A100 (Llama 2
7B: 2 T tokens in 184 k GPU-hours) and two to three times that on an H100, so one worker must
pack well over 10,000 tokens/s.

    .venv/bin/python -m bench.bench_loader --epoch-packing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

READERS = ("rows", "torch", "datasets")
VOCAB_SIZE = 151646  # Qwen2's, the default tokenizer's
_INT32_LIST = pa.list_(pa.int32())


def write_synthetic_blocks(path: Path, target_mb: float, block_size: int = 2048,
                           group_rows: int = 1024, seed: int = 0) -> int:
    """Writes a pretrain-layout Parquet file of about ``target_mb`` MB; returns its row count.

    One random row group is written over and over: each is compressed on its own, so the file
    reads like real output while costing one draw of random numbers.
    """
    ids = np.random.default_rng(seed).integers(0, VOCAB_SIZE, group_rows * block_size,
                                               dtype=np.int32)
    rows = np.arange(group_rows + 1, dtype=np.int32)
    one_piece = np.full(group_rows, block_size, np.int32)
    group = pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(rows * block_size), pa.array(ids)),
        "seq_lengths": pa.ListArray.from_arrays(pa.array(rows), pa.array(one_piece)),
    })
    # The pipeline also writes zstd; dictionary encoding is off because it only slows the writing.
    with pq.ParquetWriter(path, group.schema, compression="zstd", use_dictionary=False) as writer:
        writer.write_table(group, row_group_size=group_rows)
        groups = max(1, round(target_mb * 2**20 / path.stat().st_size))
        for _ in range(groups - 1):
            writer.write_table(group, row_group_size=group_rows)
    return groups * group_rows


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    """Sets VmHWM to the current RSS (Linux >= 4.0), so the peak covers only what follows."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _batches(reader: str, path: str, max_row_groups: int | None) -> Iterator[tuple[int, int]]:
    """(rows, tokens) of each item that ``reader`` yields; setup runs before the first item."""
    from beam_pipeline.training import loader

    if reader == "datasets":
        dataset = loader.hf_streaming_dataset(path).with_format("numpy")
        yield 0, 0
        for row in dataset:
            yield 1, len(row["input_ids"])
        return
    rows = (loader.PackedRows if reader == "rows" else loader.PackedParquetDataset)(path)
    rows.row_groups = rows.row_groups[:max_row_groups]
    if reader == "rows":
        yield 0, 0
        for row in rows:
            yield 1, len(row["input_ids"])
        return
    import torch.utils.data

    collator = loader.PackedCollator()

    def collate(batch: list[dict[str, np.ndarray]]) -> tuple[int, dict]:
        return len(batch), collator(batch)

    batches = torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=collate)
    yield 0, 0
    for n_rows, batch in batches:
        yield n_rows, batch["input_ids"].shape[1]


def measure(reader: str, path: str, max_row_groups: int | None = None) -> dict[str, float]:
    """Reads ``path`` with ``reader`` in this process; call it in a fresh one."""
    items = _batches(reader, path, max_row_groups)
    next(items)  # imports, footers, dataset set up
    base = _rss_mb("VmRSS")
    _reset_peak_rss()
    rows = tokens = 0
    start = time.perf_counter()
    for n_rows, n_tokens in items:
        rows += n_rows
        tokens += n_tokens
    seconds = time.perf_counter() - start
    return {"rows": rows, "tokens": tokens, "seconds": seconds,
            "rss_added_mb": _rss_mb("VmHWM") - base, "rss_base_mb": base}


def measure_in_subprocess(reader: str, path: str, max_row_groups: int | None = None
                          ) -> dict[str, float]:
    """``measure`` in a fresh interpreter, so earlier reads leave nothing resident."""
    command = [sys.executable, "-m", "bench.bench_loader", "--child", reader, path]
    if max_row_groups is not None:
        command += ["--max-row-groups", str(max_row_groups)]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


PACKING_TARGET = 10_000  # tokens/s one dataloader worker must pack (see the module docstring)
PACKING_SEQ_LEN = 2048


def measure_epoch_packing(path: str, seq_len: int, epochs: int = 2) -> list[dict[str, float]]:
    """Packs ``epochs`` epochs of ``path`` (``OUT/sft_examples``) in this process, one worker."""
    from beam_pipeline.training.epoch_packing import EpochPacks

    class Timed(EpochPacks):
        packing_s = 0.0

        def pack_group(self, examples, group):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return super().pack_group(examples, group)
            finally:
                Timed.packing_s += time.perf_counter() - start

    packs = Timed(path, seq_len=seq_len, seed=0)
    results = []
    for epoch in range(epochs):
        packs.set_epoch(epoch)
        Timed.packing_s = 0.0
        start = time.perf_counter()
        rows = tokens = 0
        for row in packs:
            rows += 1
            tokens += len(row["input_ids"])
        seconds = time.perf_counter() - start
        results.append({"epoch": epoch, "packs": rows, "tokens": tokens, "seconds": seconds,
                        "packing_s": Timed.packing_s, "efficiency": tokens / (rows * seq_len)})
    return results


def epoch_packing_report(workdir: Path) -> str:
    """Runs the pipeline on the benchmark's instruction examples, then measures one worker."""
    from bench import corpus
    from bench.run import CHAT_TEMPLATE

    inputs = corpus.instruction(workdir / "data", 1, PACKING_SEQ_LEN, CHAT_TEMPLATE)
    output = workdir / "epoch_packing"
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "beam_pipeline", "--output", str(output),
               "--overwrite=true", "--write_examples=true", f"--seq_len={PACKING_SEQ_LEN}",
               f"--chat_template={CHAT_TEMPLATE}",
               *(f"--input={path}#branch=instruction" for path in inputs.files)]
    subprocess.run(command, cwd=root, check=True, capture_output=True)
    manifest = json.loads((output / "manifest.json").read_text())["instruction"]
    child = subprocess.run([sys.executable, "-m", "bench.bench_loader", "--child", "epoch_packing",
                            str(output / "sft_examples")], cwd=root, capture_output=True,
                           text=True, check=True)
    epochs = json.loads(child.stdout.splitlines()[-1])
    lines = [f"{manifest['examples']:,} examples, {manifest['tokens']:,} tokens, seq_len "
             f"{PACKING_SEQ_LEN}; the pipeline packed them into {manifest['packs']:,} rows, "
             f"efficiency {manifest['packing_efficiency']:.2%}.", "",
             "| epoch | packs | efficiency | read + pack, tokens/s | packing alone, tokens/s "
             "| target, tokens/s |", "|---:|---:|---:|---:|---:|---:|"]
    for e in epochs:
        lines.append(f"| {e['epoch']} | {e['packs']:,} | {e['efficiency']:.2%} | "
                     f"{e['tokens'] / e['seconds']:,.0f} | {e['tokens'] / e['packing_s']:,.0f} | "
                     f"> {PACKING_TARGET:,} |")
    return "\n".join(lines)


def data_mb(path: str) -> float:
    from beam_pipeline.training.loader import list_parquet_files

    return sum(os.path.getsize(f) for f in list_parquet_files(path)) / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="output directories (OUT/sft), globs or files")
    parser.add_argument("--synthetic-mb", type=float, default=512,
                        help="also read a synthetic pretrain file of this size (0: none)")
    parser.add_argument("--readers", nargs="+", choices=READERS, default=list(READERS))
    parser.add_argument("--child", nargs=2, metavar=("READER", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--max-row-groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--epoch-packing", action="store_true",
                        help="measure EpochPacks in one worker instead (see above)")
    parser.add_argument("--workdir", type=Path, default=Path("out") / "bench",
                        help="inputs and outputs of --epoch-packing (default out/bench)")
    args = parser.parse_args(argv)
    if args.child and args.child[0] == "epoch_packing":
        print(json.dumps(measure_epoch_packing(args.child[1], PACKING_SEQ_LEN)))
        return
    if args.child:
        print(json.dumps(measure(*args.child, args.max_row_groups)))
        return
    if args.epoch_packing:
        print(epoch_packing_report(args.workdir))
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = list(args.paths)
        if args.synthetic_mb > 0:
            synthetic = Path(tmp) / "synthetic.parquet"
            write_synthetic_blocks(synthetic, args.synthetic_mb)
            paths.append(str(synthetic))
        if not paths:
            parser.error("give output paths or a --synthetic-mb above 0")
        print(f"{'data':<34} {'reader':<9} {'MB':>7} {'rows':>8} {'tokens':>11} {'rows/s':>9} "
              f"{'Mtok/s':>7} {'RSS added MB':>12}")
        for path in paths:
            size = data_mb(path)
            for reader in args.readers:
                m = measure_in_subprocess(reader, path)
                print(f"{Path(path).name[-34:]:<34} {reader:<9} {size:>7.1f} {m['rows']:>8,} "
                      f"{m['tokens']:>11,} {m['rows'] / m['seconds']:>9,.0f} "
                      f"{m['tokens'] / m['seconds'] / 1e6:>7.1f} {m['rss_added_mb']:>12.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
