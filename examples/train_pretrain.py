"""Pretraining on ``OUTPUT/pretrain`` with a plain PyTorch loop over the loader: rows dealt
evenly over ranks, a new shuffle each epoch, and a checkpoint that resumes on the next batch.

    .venv/bin/python -m examples.train_pretrain out/demo --steps 6 --checkpoint ckpt.pt
    .venv/bin/python -m examples.train_pretrain out/demo --steps 6 --checkpoint ckpt.pt --resume

Under ``torchrun`` each process reads its own rows (``RANK`` / ``WORLD_SIZE``); wrap the model
in DDP or FSDP as usual. The checkpoint holds the model, the optimizer and the dataloader's
``state_dict`` (torchdata's ``StatefulDataLoader``: each worker's position in its rows), so a
preempted job goes on with exactly the batches it would have seen.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import AutoTokenizer

from beam_pipeline.training.loader import PackedCollator, PackedParquetDataset
from examples.tiny_model import fold_ids, tiny_qwen2


def batches(loader: StatefulDataLoader, dataset: Any, epoch: int) -> Iterator[tuple[int, dict]]:
    """(epoch, batch) from ``epoch`` on, forever: ``set_epoch`` reshuffles each new epoch."""
    while True:
        dataset.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch
        epoch += 1


def train(output: Path, steps: int, batch_size: int, num_workers: int, seed: int,
          checkpoint: Path | None, resume: bool, fold_vocab: int = 0) -> list[dict]:
    """Trains until ``steps`` steps in all; returns, per step run here, its number, epoch, loss
    and a digest of the batch's tokens (what resuming must reproduce)."""
    vocab = fold_vocab or len(AutoTokenizer.from_pretrained(output / "tokenizer"))
    dataset = PackedParquetDataset(str(output / "pretrain"), seed=seed, drop_last=True,
                                   rank=int(os.environ.get("RANK", "0")),
                                   world_size=int(os.environ.get("WORLD_SIZE", "1")))
    collate = PackedCollator()  # input_ids, labels, position_ids restarting per document

    def collate_rows(rows: list[dict]) -> dict:
        return collate([fold_ids(row, fold_vocab) for row in rows] if fold_vocab else rows)

    loader = StatefulDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                collate_fn=collate_rows)
    model = tiny_qwen2(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = first_epoch = 0
    if resume:
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step, first_epoch = saved["step"], saved["epoch"]
    log = []
    for epoch, batch in batches(loader, dataset, first_epoch):
        if step == steps:
            break
        # use_cache=False: transformers keeps attention per document from position_ids only
        # when no KV cache is built.
        loss = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                     labels=batch["labels"], use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        log.append({"step": step, "epoch": epoch, "loss": loss.item(), "batch": hashlib.sha256(
            batch["input_ids"].numpy().tobytes()).hexdigest()[:16]})
        if checkpoint is not None:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict(), "step": step, "epoch": epoch}, checkpoint)
    return log


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the pipeline's --output directory")
    parser.add_argument("--steps", type=int, default=6, help="steps in all, resumed ones included")
    parser.add_argument("--batch_size", type=int, default=2, help="rows per step")
    parser.add_argument("--num_workers", type=int, default=1, help="dataloader workers")
    parser.add_argument("--seed", type=int, default=0, help="the loader's shuffle seed")
    parser.add_argument("--checkpoint", type=Path, help="saved after every step")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint")
    parser.add_argument("--fold_vocab", type=int, default=0,
                        help="fold token ids into this many for a quick CPU run (tests use 512); "
                        "0: the tokenizer's whole vocabulary (default)")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint")
    log = train(args.output, args.steps, args.batch_size, args.num_workers, args.seed,
                args.checkpoint, args.resume, args.fold_vocab)
    for entry in log:
        print(f"step {entry['step']} (epoch {entry['epoch']}): loss {entry['loss']:.4f}")
    return log


if __name__ == "__main__":
    main()
