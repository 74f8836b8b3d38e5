"""What the pipeline is measured against, each run in its own process by ``bench.run``.

* ``ceiling``: the Hugging Face fast tokenizer's own batch encoding of the knowledge documents,
  in large batches, the way the pipeline calls it (``split_special_tokens=True``), plus two
  faster encoders of the same ranks for reference: the backend's ``encode_batch_fast`` (no
  offsets) and tiktoken. All three must give the same ids.
* ``datasets``: the seed design's route for pretraining data: Parquet read by
  ``datasets.load_dataset("parquet", streaming=True)``, ``.map(tokenize, batched=True)`` and
  ``run_clm``-style grouping into 2048-token blocks, consumed row by row as a trainer would.
* ``trl``: TRL's SFT preparation of the instruction examples (its own ``_prepare_dataset``:
  chat template, tokenization, assistant-only labels) and then ``pack_dataset(..., "bfd")``.

Each writes a JSON result and, for the checks, per-document token counts and a histogram of
token ids (``.npy``). Only the work itself is timed (wall and CPU seconds): imports, the
tokenizer and the inputs are loaded first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.proc import Clock
from transforms.core.tokenizer import (
    QWEN2_PATTERN,
    QWEN2_SPECIAL_TOKENS,
    _read_qwen_ranks,
    end_of_text_id,
    load_tokenizer,
)

CEILING_BATCH = 1024  # documents per encode call: about a million tokens
WARM_UP_DOCS = 64
DATASETS_BATCH = 1000  # datasets' default map batch, as run_clm uses it
TRL_DATASET_NUM_PROC = 2  # both cores, as the pipeline gets


def read_texts(files: Sequence[str]) -> list[str]:
    return [text for f in files for text in pq.read_table(f, columns=["text"])["text"].to_pylist()]


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Histogram:
    """Counts of each token id, so two approaches can be compared token for token."""

    def __init__(self, vocab_size: int):
        self.counts = np.zeros(vocab_size, dtype=np.int64)

    def add(self, ids: np.ndarray) -> None:
        self.counts += np.bincount(ids, minlength=len(self.counts))


def _timed_encoding(texts: Sequence[str], encode: Callable[[Sequence[str]], list[list[int]]],
                    vocab_size: int) -> tuple[Clock, np.ndarray, np.ndarray]:
    """Time spent in ``encode`` alone, per-document lengths, and the id histogram.

    One untimed call first, so thread pools and regex caches are warm for every encoder.
    """
    encode(texts[:WARM_UP_DOCS])
    clock, lengths, histogram = Clock(), [], Histogram(vocab_size)
    for batch in _batches(texts, CEILING_BATCH):
        with clock.timing():
            ids = encode(batch)
        lengths.extend(map(len, ids))
        histogram.add(np.fromiter(chain.from_iterable(ids), dtype=np.int64))
    return clock, np.asarray(lengths, dtype=np.int64), histogram.counts


def ceiling(files: Sequence[str], out: Path) -> dict:
    import tiktoken

    tok = load_tokenizer()
    texts = read_texts(files)
    vocab = len(tok)
    backend = tok.backend_tokenizer
    backend.encode_special_tokens = True  # what split_special_tokens=True sets for a call
    ranks = _read_qwen_ranks()
    tiktok = tiktoken.Encoding("qwen2-bench", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks,
                               special_tokens=QWEN2_SPECIAL_TOKENS)
    encoders: dict[str, Callable[[Sequence[str]], list[list[int]]]] = {
        "hf_batch": lambda batch: tok(list(batch), add_special_tokens=True,
                                      split_special_tokens=True,
                                      return_attention_mask=False)["input_ids"],
        "hf_encode_batch_fast": lambda batch: [
            e.ids for e in backend.encode_batch_fast(list(batch), add_special_tokens=True)],
        "tiktoken": lambda batch: tiktok.encode_ordinary_batch(list(batch)),
    }
    result: dict = {"documents": len(texts), "characters": sum(map(len, texts)),
                    "separator_id": end_of_text_id(tok), "encoders": {}}
    reference = None
    for name, encode in encoders.items():
        clock, lengths, counts = _timed_encoding(texts, encode, vocab)
        if reference is None:
            reference = (lengths, counts)
            np.save(out / "ceiling_lengths.npy", lengths)
            np.save(out / "ceiling_histogram.npy", counts)
        identical = bool(np.array_equal(lengths, reference[0])
                         and np.array_equal(counts, reference[1]))
        result["encoders"][name] = {"seconds": clock.wall_s, "cpu_seconds": clock.cpu_s,
                                    "tokens": int(lengths.sum()),
                                    "identical_to_hf_batch": identical}
    return result


def datasets_clm(files: Sequence[str], block_size: int) -> dict:
    """``load_dataset`` streaming, batched tokenize map, ``run_clm``-style grouping."""
    from datasets import load_dataset

    tok = load_tokenizer()
    seen = {"tokens": 0, "kept": 0}

    def tokenize(batch: dict) -> dict:
        return tok(batch["text"])

    def group_texts(batch: dict) -> dict:
        # run_clm's grouping: concatenate the batch, cut whole blocks, drop the batch's remainder,
        # labels a copy of input_ids. No separator between documents.
        joined = {key: list(chain.from_iterable(batch[key])) for key in batch}
        total = len(joined["input_ids"])
        usable = total - total % block_size
        seen["tokens"] += total
        seen["kept"] += usable
        blocks = {key: [values[i:i + block_size] for i in range(0, usable, block_size)]
                  for key, values in joined.items()}
        blocks["labels"] = [list(ids) for ids in blocks["input_ids"]]
        return blocks

    clock = Clock()
    with clock.timing():
        stream = load_dataset("parquet", data_files=list(files), split="train", streaming=True)
        tokenized = stream.map(tokenize, batched=True, batch_size=DATASETS_BATCH,
                               remove_columns=["text"])
        grouped = tokenized.map(group_texts, batched=True, batch_size=DATASETS_BATCH)
        blocks = sum(1 for _ in grouped)
    return {"seconds": clock.wall_s, "cpu_seconds": clock.cpu_s, "tokens": seen["tokens"],
            "tokens_in_blocks": seen["kept"],
            "blocks": blocks, "dropped_tokens": seen["tokens"] - seen["kept"]}


def _tiny_model(vocab_size: int):
    """A one-layer model: SFTTrainer needs one to exist, the preparation never runs it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1))


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    return np.concatenate([chunk.flatten().to_numpy() for chunk in column.chunks])


def trl_sft(files: Sequence[str], seq_len: int, marked_template: Path, out: Path) -> dict:
    """TRL's own preparation path with assistant-only loss, then ``pack_dataset(..., "bfd")``.

    The template is the pipeline's ChatML with ``{% generation %}`` markers, so TRL computes
    the same assistant-only labels that the pipeline does.
    """
    from datasets import Dataset, load_dataset
    from trl import SFTConfig, SFTTrainer
    from trl.data_utils import pack_dataset

    tok = load_tokenizer()
    tok.chat_template = marked_template.read_text()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as cache:
        args = SFTConfig(output_dir=cache, report_to="none", use_cpu=True, bf16=False,
                         max_length=None, packing=False,
                         assistant_only_loss=True, dataset_num_proc=TRL_DATASET_NUM_PROC)
        with open(files[0], encoding="utf-8") as f:  # the trainer insists on a train set
            sample = Dataset.from_list([json.loads(f.readline())])
        trainer = SFTTrainer(model=_tiny_model(len(tok)), args=args, processing_class=tok,
                             train_dataset=sample)
        prepare, pack = Clock(), Clock()
        with prepare.timing():
            raw = load_dataset("json", data_files=list(files), split="train", cache_dir=cache)
            prepared = trainer._prepare_dataset(raw, tok, args, False, None, "train")
        with pack.timing():
            packed = pack_dataset(prepared.select_columns(["input_ids", "labels"]), seq_len,
                                  "bfd", {"num_proc": TRL_DATASET_NUM_PROC})

        table = prepared.data.table
        ids = _flat_values(table["input_ids"]).astype(np.int64)
        labels = _flat_values(table["labels"])
        histogram = Histogram(len(tok))
        histogram.add(ids)
        np.save(out / "trl_histogram.npy", histogram.counts)
        packed_lengths = pc.list_value_length(packed.data.table["input_ids"]).to_numpy()
        return {
            "examples": len(prepared),
            "tokens": len(ids),
            "trained_tokens": int(np.count_nonzero(labels != -100)),
            "prepare_seconds": prepare.wall_s,
            "pack_seconds": pack.wall_s,
            "seconds": prepare.wall_s + pack.wall_s,
            "cpu_seconds": prepare.cpu_s + pack.cpu_s,
            "packs": len(packed),
            "packed_tokens": int(packed_lengths.sum()),
            "longest_pack": int(packed_lengths.max()),
            "dataset_num_proc": TRL_DATASET_NUM_PROC,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=("ceiling", "datasets", "trl"))
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--block_size", type=int, default=2048)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--template", type=Path, help="marked chat template (trl)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.peer == "ceiling":
        result = ceiling(args.files, args.out)
    elif args.peer == "datasets":
        result = datasets_clm(args.files, args.block_size)
    else:
        result = trl_sft(args.files, args.seq_len, args.template, args.out)
    (args.out / f"{args.peer}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
