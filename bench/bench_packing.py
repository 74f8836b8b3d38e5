"""Packing efficiency on the same examples: the pipeline vs TRL's ``bfd`` vs the lower bound.

Runs the pipeline's instruction branch on the shared Alpaca + GSM8K + chat mix, then encodes the
same records in input order with the branch's own functions (the sorted example lengths must
equal those of the packed rows) and gives those token ids to TRL's
``pack_dataset(..., strategy="bfd")`` with its default batches of 1,000 examples. Efficiency is
real tokens / (rows x seq_len); no packing can use fewer rows than ceil(tokens / seq_len).

    .venv/bin/python -m bench.bench_packing [--seq_len 2048]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.running import run
from transforms.classify import classify
from transforms.core.records import Rejection
from transforms.core.tokenizer import load_tokenizer
from transforms.core.vocabulary import (
    Drop,
)
from transforms.instruction.adapters import to_conversation
from transforms.instruction.chat_template import encode_conversations
from transforms.instruction.options import InstructionConfig
from transforms.instruction.rendering.values import EncodedExample
from transforms.instruction.schema import check_conversation
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MIX = (
    f"{SHARED}/instruction/alpaca_en_demo.json",
    f"{SHARED}/math/gsm8k_test.jsonl#branch=instruction;prompt=question;response=answer",
    f"{SHARED}/chat/kto_en_demo_messages.json",
    f"{SHARED}/chat/fastchat_dummy_conversation.json",
    f"{SHARED}/chat/glaive_toolcall_en_demo.json",
    f"{SHARED}/chat/glaive_toolcall_zh_demo.json",
)


def pipeline_run(output: Path, seq_len: int) -> tuple[dict, list[int]]:
    """The manifest and the sorted lengths of the packed examples (read back from sft/)."""
    run([*(f"--input={value}" for value in MIX), f"--output={output}", f"--seq_len={seq_len}"])
    manifest = json.loads((output / "manifest.json").read_text())
    lengths = [n for path in sorted((output / "sft").glob("*.parquet"))
               for row in pq.read_table(path, columns=["seq_lengths"])["seq_lengths"].to_pylist()
               for n in row]
    return manifest, sorted(lengths)


def examples_in_input_order(seq_len: int) -> list[list[int]]:
    """Each record read, classified, validated, adapted and encoded as the branch does."""
    config = InstructionConfig.from_options(PipelineOptions([f"--seq_len={seq_len}"]))
    schemas, tok = config.load_schemas(), load_tokenizer()
    specs = [parse_input_spec(i, value) for i, value in enumerate(MIX)]
    conversations = []
    for shard in plan_shards(specs):
        for raw in (r for chunk in read_shard(shard) for r in chunk.records):
            routed = classify(raw, specs[raw.input_index])
            if isinstance(routed, Rejection):
                continue
            record = routed[1]
            try:
                schemas[record.format].check(record.value)
                conversation = to_conversation(record.value, record.format)
                check_conversation(conversation, config.limits)
            except Drop:
                continue
            conversations.append(conversation)
    results = encode_conversations(tok, conversations, config.mask_options, config.system_prompt,
                                   seq_len, config.overflow)
    return [r.input_ids.tolist() for r in results if isinstance(r, EncodedExample)]


def trl_bfd_rows(examples: list[list[int]], seq_len: int) -> int:
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    packed = pack_dataset(Dataset.from_dict({"input_ids": examples}), seq_len, strategy="bfd")
    if sum(len(ids) for ids in packed["input_ids"]) != sum(map(len, examples)):
        raise SystemExit("TRL's packs do not hold every token (an example longer than seq_len?)")
    return len(packed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq_len", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        manifest, lengths = pipeline_run(Path(tmp) / "out", args.seq_len)
    examples = examples_in_input_order(args.seq_len)
    if sorted(map(len, examples)) != lengths:
        raise SystemExit("the examples encoded here differ from the pipeline's packed examples")
    tokens = manifest["instruction"]["tokens"]
    rows = {
        "pipeline (BFD per chunk, tails re-packed)": manifest["instruction"]["packs"],
        "TRL pack_dataset bfd (batches of 1,000)": trl_bfd_rows(examples, args.seq_len),
        "lower bound ceil(tokens / seq_len)": math.ceil(tokens / args.seq_len),
    }
    print(f"{len(examples):,} examples, {tokens:,} tokens, seq_len {args.seq_len}")
    for name, count in rows.items():
        print(f"  {name:<45} {count:>6,} rows  {tokens / (count * args.seq_len):.4%}")


if __name__ == "__main__":
    main()
