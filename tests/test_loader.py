"""The training side of the outputs: streaming, sharding, collation and what a model sees.

One pipeline run over real shared data (pretraining text, multi-turn chats and tool calls, in
small row groups so there are many to deal) feeds every test. The proofs:

- a tiny randomly initialised Llama gives the same loss and gradients for a batch of packed rows
  (block-diagonal mask, or position_ids alone) as for their segments run one by one, and plain
  causal attention over the same rows does not;
- reading a large output file adds far less resident memory than the file's size, and no more
  for the whole file than for its first few row groups;
- readers sharded over ranks and dataloader workers see every row exactly once (with drop_last,
  less the rows that would make ranks unequal);
- TRL's padding-free collator, transformers' DataCollatorWithFlattening, TRL's SFTTrainer and
  the plain Trainer, set up as the README says, produce our labels, positions and loss.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.training import loader
from beam_pipeline.training.loader import (
    PackedCollator,
    PackedRows,
    collate_packed,
    hf_streaming_dataset,
    unpack_segments,
)
from bench.bench_loader import measure_in_subprocess, write_synthetic_blocks
from tests.conftest import ROOT, require_shared_data
from tests.support.gcs import cloud_env, metadata_server, storage_emulator, use_in_process
from tests.support.loader_run import ROW_GROUP_ROWS, loader_output

require_shared_data()

KINDS = ("sft", "pretrain")
VOCAB = 512  # the tiny model's; token ids are folded into it (see fold_ids)
LARGE_FILE_MB = 512


@pytest.fixture(scope="module")
def output() -> Path:
    return loader_output()


def row_key(row: Mapping[str, Sequence[int]]) -> tuple:
    """A hashable identity of a row's content, for counting rows across readers."""
    return tuple(np.asarray(row[name], dtype=np.int32).tobytes() for name in sorted(row))


def read_all(path: Path) -> list[dict]:
    return pq.read_table(sorted(path.glob("*.parquet"))).to_pylist()


def fold_ids(rows: Iterable[Mapping]) -> list[dict]:
    """Token ids folded into the tiny model's vocabulary; -100 labels stay -100.

    What is being proved (which tokens attend to which, which carry loss) does not depend on the
    ids, and a 151,646-token output layer would make every forward pass slow.
    """
    def fold(name: str, values) -> np.ndarray:
        values = np.asarray(values, dtype=np.int64)
        return np.where(values >= 0, values % VOCAB, values) if name in ("input_ids", "labels") \
            else values
    return [{name: fold(name, values) for name, values in row.items()} for row in rows]


def tiny_llama(attn_implementation: str):
    """Two layers, random weights, the same every call. Weights drawn 10x wider than usual make
    attention far from uniform, so a token that sees another segment changes the loss clearly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=0.2)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation)


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


# --- reading -----------------------------------------------------------------------------------


def test_doctests() -> None:
    assert doctest.testmod(loader).failed == 0


def test_importing_the_loader_and_epoch_packing_needs_no_torch() -> None:
    code = ("import sys, beam_pipeline.training.loader, beam_pipeline.training.epoch_packing; "
            "print(sorted({'torch', 'datasets', 'pandas'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_importing_the_loader_and_epoch_packing_needs_no_beam() -> None:
    """A training job installs requirements-train.txt, not Beam."""
    code = ("import sys, beam_pipeline.training.loader, beam_pipeline.training.epoch_packing; "
            "assert 'apache_beam' not in sys.modules, sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("kind", KINDS)
def test_rows_are_the_files_rows_as_int32_views(output, kind) -> None:
    expected = read_all(output / kind)
    rows = list(PackedRows(str(output / kind)))
    assert [row_key(r) for r in rows] == [row_key(r) for r in expected]
    assert len(loader.list_row_groups(loader.list_parquet_files(str(output / kind)))) > 10
    first, second = rows[0]["input_ids"], rows[1]["input_ids"]
    assert first.dtype == np.int32 and not first.flags.owndata  # a view of an Arrow buffer
    assert first.base is not None and first.base is second.base  # rows share one decoded buffer


def test_gs_output_reads_like_the_local_one(output) -> None:
    with storage_emulator("loader-test") as url, metadata_server() as metadata, \
            pytest.MonkeyPatch.context() as patch:
        use_in_process(patch, cloud_env(url, metadata))
        for path in sorted((output / "sft").glob("*.parquet")):
            with FileSystems.create(f"gs://loader-test/run/sft/{path.name}") as handle:
                handle.write(path.read_bytes())
        remote = list(PackedRows("gs://loader-test/run/sft", rank=1, world_size=2))
    local = list(PackedRows(str(output / "sft"), rank=1, world_size=2))
    assert remote and [row_key(r) for r in remote] == [row_key(r) for r in local]


@pytest.mark.parametrize("kind", [*KINDS, "sft_examples"])
def test_row_groups_hold_exactly_row_group_rows(output, kind) -> None:
    """Every row group holds --row_group_rows rows but the last of each file, whatever the
    sizes of the staged parts the files were cut from."""
    files = sorted((output / kind).glob("*.parquet"))
    assert len(files) == 3
    for path in files:
        meta = pq.read_metadata(path)
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert len(sizes) > 1 and set(sizes[:-1]) == {ROW_GROUP_ROWS}
        assert 1 <= sizes[-1] <= ROW_GROUP_ROWS and sum(sizes) == meta.num_rows


class WorkerRows(PackedRows):
    """PackedRows as dataloader worker ``worker_id`` of ``num_workers`` would see them."""

    def __init__(self, *args, worker_id: int, num_workers: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker_id, self.num_workers = worker_id, num_workers

    def worker(self) -> tuple[int, int]:
        return self.worker_id, self.num_workers


@pytest.mark.parametrize(("world_size", "num_workers", "seed"),
                         [(1, 1, None), (2, 1, None), (3, 2, None), (4, 3, 5), (7, 2, 5)])
def test_ranks_and_workers_see_every_row_once(output, world_size, num_workers, seed) -> None:
    """With drop_last, no row twice and only the rows that would make ranks unequal left out."""
    path = str(output / "sft")
    expected = Counter(row_key(r) for r in read_all(output / "sft"))
    seen: Counter = Counter()
    for rank in range(world_size):
        for worker in range(num_workers):
            rows = WorkerRows(path, rank=rank, world_size=world_size, seed=seed,
                              drop_last=True, worker_id=worker, num_workers=num_workers)
            rows.set_epoch(1)
            seen.update(row_key(r) for r in rows)
    assert seen <= expected  # no row read more often than the files hold it
    assert expected.total() - seen.total() == expected.total() % world_size


def test_torch_dataloader_workers_see_every_row_once(output) -> None:
    """Real worker processes: each finds its worker id through torch and reads its own rows."""
    path = str(output / "pretrain")
    seen: Counter = Counter()
    for rank in range(2):
        dataset = loader.PackedParquetDataset(path, rank=rank, world_size=2, seed=3,
                                              drop_last=True)
        assert isinstance(dataset, torch.utils.data.IterableDataset)
        batches = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        seen.update(row_key({k: v.numpy() for k, v in row.items()}) for row in batches)
    expected = Counter(row_key(r) for r in read_all(output / "pretrain"))
    assert seen <= expected
    assert expected.total() - seen.total() == expected.total() % 2


def test_shuffling_changes_the_order_per_epoch_not_the_rows(output) -> None:
    rows = PackedRows(str(output / "sft"), seed=1)
    orders = []
    for epoch in (0, 1, 0):
        rows.set_epoch(epoch)
        orders.append([row_key(r) for r in rows])
    assert orders[0] == orders[2] != orders[1]
    assert Counter(orders[0]) == Counter(orders[1])
    assert orders[1] != [row_key(r) for r in read_all(output / "sft")]


def test_hf_streaming_ranks_see_every_row_once(output) -> None:
    path = str(output / "sft")
    assert hf_streaming_dataset(path).num_shards > 3  # resharded by row group, not by file
    seen = Counter(row_key(r) for rank in range(3)
                   for r in hf_streaming_dataset(path, rank=rank, world_size=3))
    assert seen == Counter(row_key(r) for r in read_all(output / "sft"))


def test_reading_a_large_file_adds_far_less_memory_than_its_size(tmp_path) -> None:
    """A file in the pipeline's pretrain layout at its defaults (2048-token rows, 1024 rows per
    row group, zstd), read whole in a fresh process: the peak resident memory it adds is a few
    row groups' worth and stays flat, where reading the file into memory would add its size."""
    path = tmp_path / "large.parquet"
    rows = write_synthetic_blocks(path, LARGE_FILE_MB)
    size_mb = path.stat().st_size / 2**20
    whole = measure_in_subprocess("rows", str(path))
    first_groups = measure_in_subprocess("rows", str(path), max_row_groups=4)
    print(f"\nread {whole['rows']:,} rows, {size_mb:.0f} MB of Parquet: resident memory "
          f"+{whole['rss_added_mb']:.0f} MB ({whole['rss_added_mb'] / size_mb:.0%} of the file); "
          f"+{first_groups['rss_added_mb']:.0f} MB for its first 4 row groups")
    assert whole["rows"] == rows and whole["tokens"] == rows * 2048
    assert whole["rss_added_mb"] < 0.25 * size_mb
    assert whole["rss_added_mb"] < first_groups["rss_added_mb"] + 32


# --- collating ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_collated_batch_marks_every_segment(output, kind) -> None:
    rows = list(PackedRows(str(output / kind)))[:5]
    batch = collate_packed(rows, mask="bool")
    lengths = np.concatenate([r["seq_lengths"] for r in rows])
    ids = np.concatenate([r["input_ids"] for r in rows])
    starts = np.cumsum(lengths) - lengths
    assert batch["input_ids"].tolist() == [ids.tolist()]
    assert batch["cu_seqlens"].dtype == np.int32
    assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert batch["max_seqlen"] == lengths.max()
    assert batch["position_ids"][0].tolist() == [p for n in lengths for p in range(n)]
    if kind == "sft":  # the pipeline's own labels and positions, unchanged
        assert batch["labels"][0].tolist() == np.concatenate([r["labels"] for r in rows]).tolist()
        assert batch["position_ids"][0].tolist() == \
            np.concatenate([r["position_ids"] for r in rows]).tolist()
    else:  # every token is a target except the first of each segment
        expected = ids.astype(np.int64)
        expected[starts] = -100
        assert batch["labels"][0].tolist() == expected.tolist()
    mask = batch["attention_mask"][0, 0]
    segment = np.repeat(np.arange(len(lengths)), lengths)
    for q in range(0, len(ids), 97):
        allowed = np.flatnonzero(mask[q])
        assert allowed.tolist() == list(range(starts[segment[q]], q + 1))
    float_mask = collate_packed(rows, mask="float")["attention_mask"]
    assert float_mask.dtype == np.float32
    assert ((float_mask == 0) == batch["attention_mask"]).all()


def test_segment_lengths_fall_back_to_position_ids_then_one_segment(output) -> None:
    row = next(iter(PackedRows(str(output / "sft"))))
    without = {k: v for k, v in row.items() if k != "seq_lengths"}
    assert loader.segment_lengths(without).tolist() == row["seq_lengths"].tolist()
    assert loader.segment_lengths({"input_ids": row["input_ids"]}).tolist() == \
        [len(row["input_ids"])]
    with pytest.raises(ValueError, match="do not split"):
        loader.segment_lengths({"input_ids": [1, 2, 3], "seq_lengths": [2, 2]})


@pytest.mark.parametrize("kind", KINDS)
def test_trl_and_transformers_collators_agree_with_ours(output, kind) -> None:
    from transformers import DataCollatorWithFlattening
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = list(PackedRows(str(output / kind)))[:6]
    ours = PackedCollator()(rows)
    hf_rows = list(hf_streaming_dataset(str(output / kind)).take(6))  # lists, as Trainer sees
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(hf_rows)
    flattening = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(unpack_segments(rows))
    for theirs in (trl, flattening):
        for name in ("input_ids", "labels", "position_ids"):
            assert torch.equal(theirs[name], ours[name]), name
        assert torch.equal(theirs["cu_seq_lens_q"], ours["cu_seqlens"])
        assert theirs["max_length_q"] == ours["max_seqlen"]
    # Given packed rows whole, DataCollatorWithFlattening takes each row for one sequence.
    whole_rows = DataCollatorWithFlattening()(rows)
    assert not torch.equal(whole_rows["position_ids"], ours["position_ids"])


def test_transformers_names_rename_only_the_boundaries(output) -> None:
    rows = list(PackedRows(str(output / "sft")))[:2]
    plain, renamed = PackedCollator()(rows), PackedCollator(transformers_names=True)(rows)
    assert set(renamed) == {"input_ids", "labels", "position_ids", "cu_seq_lens_q",
                            "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert torch.equal(renamed["cu_seq_lens_k"], plain["cu_seqlens"])
    assert renamed["max_length_k"] == plain["max_seqlen"]


# --- what the model sees -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def packed_rows(output) -> list[dict]:
    """Two sft rows and two pretrain rows, each of several segments, as one batch."""
    picked = []
    for kind in KINDS:
        rows = (r for r in PackedRows(str(output / kind)) if len(r["seq_lengths"]) > 1)
        picked += [next(rows), next(rows)]
    return fold_ids(picked)


@pytest.fixture(scope="module")
def one_by_one(packed_rows) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the segments run alone, each with its own causal attention,
    weighted by the tokens that carry loss (what the packed batch's mean loss should equal)."""
    model = tiny_llama("sdpa")
    total, n_targets = torch.zeros(()), 0
    for segment in unpack_segments(packed_rows):
        labels = torch.from_numpy(segment["labels"])[None]
        n = int((labels[0, 1:] != -100).sum())  # the model shifts labels: the first is no target
        if n:
            out = model(input_ids=torch.from_numpy(segment["input_ids"])[None], labels=labels,
                        use_cache=False)
            total = total + out.loss * n
            n_targets += n
    loss = total / n_targets
    loss.backward()
    return loss.item(), gradients(model)


def packed_loss(rows, attn_implementation: str, mask: str | None, positions: bool = True,
                use_cache: bool = False):
    model = tiny_llama(attn_implementation)
    batch = PackedCollator(mask=mask)(rows)
    inputs = {"input_ids": batch["input_ids"], "labels": batch["labels"], "use_cache": use_cache}
    if positions:
        inputs["position_ids"] = batch["position_ids"]
    if mask:
        inputs["attention_mask"] = batch["attention_mask"]
    loss = model(**inputs).loss
    loss.backward()
    return loss.item(), gradients(model)


@pytest.mark.parametrize(("attn_implementation", "mask"),
                         [("sdpa", "bool"), ("eager", "float"), ("sdpa", None), ("eager", None)])
def test_packed_batch_trains_like_its_segments_one_by_one(packed_rows, one_by_one,
                                                          attn_implementation, mask) -> None:
    """With the block-diagonal mask, or with position_ids alone (transformers then builds the
    block-diagonal mask itself), loss and every gradient match the segments run alone."""
    assert sum(len(r["seq_lengths"]) for r in packed_rows) >= 8
    loss, grads = packed_loss(packed_rows, attn_implementation, mask)
    reference_loss, reference_grads = one_by_one
    assert loss == pytest.approx(reference_loss, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("attn_implementation", "mask", "positions", "use_cache"),
                         [("sdpa", None, False, False), ("eager", "bool", True, False),
                          ("sdpa", None, True, True)])
def test_attention_across_segments_is_detected(packed_rows, one_by_one, attn_implementation,
                                               mask, positions, use_cache) -> None:
    """The comparison has teeth. Segments see each other, and the loss moves, under plain causal
    attention over the packed batch; with a bool mask on the eager path (which adds the mask to
    the scores); and with position_ids alone but a KV cache, since transformers looks for packed
    sequences only without one (Trainer turns the cache off; a hand-written loop must)."""
    loss, _ = packed_loss(packed_rows, attn_implementation, mask, positions, use_cache)
    assert abs(loss - one_by_one[0]) > 0.01


# --- trainers, set up as the README says -------------------------------------------------------


def first_step_loss(trainer) -> float:
    trainer.train()
    return trainer.state.log_history[0]["loss"]


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_trainer_trains_on_our_labels_without_preparing(output, qwen_tokenizer,
                                                            tmp_path) -> None:
    """The README's SFTConfig: TRL's own collator, no re-tokenization, our loss. (Pretrain rows
    differ only in having no labels, which TRL's collator derives as ours does: see above.)"""
    from trl import SFTConfig, SFTTrainer

    dataset = hf_streaming_dataset(str(output / "sft")).map(lambda row: fold_ids([row])[0])
    args = SFTConfig(output_dir=str(tmp_path), padding_free=True, max_length=None,
                     dataset_kwargs={"skip_prepare_dataset": True},
                     per_device_train_batch_size=3, max_steps=1, logging_steps=1,
                     report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                     bf16=False)  # SFTConfig's default bf16 autocast would blur the comparison
    trainer = SFTTrainer(model=tiny_llama("sdpa"), args=args, train_dataset=dataset,
                         processing_class=qwen_tokenizer)
    expected = tiny_llama("sdpa")(**PackedCollator(transformers_names=True)(
        fold_ids(list(PackedRows(str(output / "sft")))[:3])), use_cache=False).loss.item()
    assert first_step_loss(trainer) == pytest.approx(expected, rel=1e-5)


def test_trainer_takes_the_torch_dataset_and_our_collator(output, tmp_path) -> None:
    from transformers import Trainer, TrainingArguments

    collator = PackedCollator(transformers_names=True)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3,
                             max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                             save_strategy="no", remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=tiny_llama("sdpa"), args=args,
                      train_dataset=loader.PackedParquetDataset(str(output / "sft")),
                      data_collator=lambda rows: collator(fold_ids(rows)))
    rows = fold_ids(list(PackedRows(str(output / "sft")))[:3])
    expected = tiny_llama("sdpa")(**collator(rows), use_cache=False).loss.item()
    assert first_step_loss(trainer) == pytest.approx(expected, rel=1e-5)
