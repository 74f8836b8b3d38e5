"""Supervised fine-tuning on ``OUTPUT/sft`` with TRL's ``SFTTrainer``, padding-free, as a real
job sets it up: the tokenizer the pipeline saved, the packed rows as they are (no
re-tokenization, no re-packing), a few steps of a tiny random-weight Qwen2 model on the CPU.

    .venv/bin/python -m examples.train_sft out/demo --steps 4

For a real run, replace ``tiny_qwen2`` with ``AutoModelForCausalLM.from_pretrained(...)`` and
``use_cpu`` with your accelerator; the dataset and ``SFTConfig`` stay as they are.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

from beam_pipeline.training.loader import hf_streaming_dataset
from examples.tiny_model import fold_ids, tiny_qwen2


def train(output: Path, steps: int, batch_size: int, work_dir: str, fold_vocab: int = 0
          ) -> list[float]:
    """Trains ``steps`` steps; returns the loss of each."""
    tokenizer = AutoTokenizer.from_pretrained(output / "tokenizer")
    # Packed rows carry input_ids, labels (-100 where no loss), position_ids and seq_lengths:
    # TRL's padding-free collator flattens a batch of them and keeps attention per segment.
    dataset = hf_streaming_dataset(str(output / "sft"))
    if fold_vocab:
        dataset = dataset.map(lambda row: fold_ids(row, fold_vocab))
    args = SFTConfig(output_dir=work_dir, padding_free=True, max_length=None,
                     dataset_kwargs={"skip_prepare_dataset": True},
                     per_device_train_batch_size=batch_size, max_steps=steps, logging_steps=1,
                     learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
                     disable_tqdm=True, bf16=False)
    trainer = SFTTrainer(model=tiny_qwen2(fold_vocab or len(tokenizer)), args=args,
                         train_dataset=dataset,
                         processing_class=tokenizer)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the pipeline's --output directory")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=2, help="packed rows per step")
    parser.add_argument("--fold_vocab", type=int, default=0,
                        help="fold token ids into this many for a quick CPU run (tests use 512); "
                        "0: the tokenizer's whole vocabulary (default)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work_dir:
        losses = train(args.output, args.steps, args.batch_size, work_dir, args.fold_vocab)
    for step, loss in enumerate(losses, 1):
        print(f"step {step}: loss {loss:.4f}")
    return losses


if __name__ == "__main__":
    main()
