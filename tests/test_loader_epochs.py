"""A training job's epochs: even ranks, a new shuffle and a new packing each epoch, and exact
resumption, on the shared pipeline run (real chats and tool calls, row groups of 16 rows).

Streams are compared token for token: a resumed job must yield exactly the batches the
uninterrupted one would have, with 0, 1 and 2 dataloader workers (torchdata's
``StatefulDataLoader`` saves and restores each worker's ``state_dict``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_pipeline.training import epoch_packing, loader
from beam_pipeline.training.epoch_packing import EpochPacks
from beam_pipeline.training.loader import PackedRows, collate_packed, rows_per_rank
from tests.conftest import ROOT, require_shared_data
from tests.support.loader_run import SEQ_LEN, loader_output
from transforms.core.packing import packing_efficiency

require_shared_data()
StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
# torchdata 0.11 calls a torch function that torch 2.13 deprecates; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="module")
def output() -> Path:
    return loader_output()


def ids(row: Mapping) -> bytes:
    return np.asarray(row["input_ids"], dtype=np.int32).tobytes()


def file_rows(path: Path, columns: Iterable[str] = ("input_ids",)) -> list[dict]:
    return pq.read_table(sorted(path.glob("*.parquet")), columns=list(columns)).to_pylist()


class WorkerRows(PackedRows):
    """``PackedRows`` as dataloader worker ``worker_id`` of ``num_workers`` sees them."""

    def __init__(self, *args, worker_id: int = 0, num_workers: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker_id, self.num_workers = worker_id, num_workers

    def worker(self) -> tuple[int, int]:
        return self.worker_id, self.num_workers


# --- even ranks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [True, False])
def test_every_rank_reads_the_same_number_of_rows(output, drop_last) -> None:
    """World sizes 1 to 8, two dataloader workers each: equal rows per rank; together the
    ranks read every row once, less (drop_last) or plus (repeated) fewer than world_size rows."""
    path = output / "sft_examples"
    expected = Counter(ids(r) for r in file_rows(path))
    total = expected.total()
    for world_size in range(1, 9):
        per_rank, seen = [], Counter()
        for rank in range(world_size):
            rows = [ids(r) for worker in range(2) for r in WorkerRows(
                str(path), rank=rank, world_size=world_size, seed=7, drop_last=drop_last,
                worker_id=worker, num_workers=2)]
            per_rank.append(len(rows))
            seen.update(rows)
        assert per_rank == [rows_per_rank(total, world_size, drop_last)] * world_size
        if drop_last:
            assert seen <= expected and total - seen.total() == total % world_size
        else:
            assert seen >= expected and seen.total() - total == -total % world_size


# --- shuffling ----------------------------------------------------------------------------------


def test_shuffle_differs_between_epochs_and_repeats_between_runs(output) -> None:
    path = str(output / "sft_examples")
    in_files = [ids(r) for r in file_rows(output / "sft_examples")]
    first = PackedRows(path, seed=11)
    epochs = []
    for epoch in (0, 1):
        first.set_epoch(epoch)
        epochs.append([ids(r) for r in first])
    rerun = PackedRows(path, seed=11)
    rerun.set_epoch(1)
    assert [ids(r) for r in rerun] == epochs[1]
    assert epochs[0] != epochs[1] and Counter(epochs[0]) == Counter(epochs[1]) == Counter(in_files)
    assert epochs[0] != in_files
    other_seed = PackedRows(path, seed=12)
    other_seed.set_epoch(1)
    assert [ids(r) for r in other_seed] != epochs[1]


def test_shuffle_crosses_row_groups_within_a_bounded_window(output, monkeypatch) -> None:
    """Neighbours come from different row groups, each group is decoded at most twice (once
    per window it overlaps), and no row moves further than its window."""
    path = output / "sft_examples"
    in_files = [ids(r) for r in file_rows(path)]
    group_of = {row: i // 16 for i, row in enumerate(in_files)}  # files hold row groups of 16
    decoded: Counter = Counter()
    read = loader.read_row_group

    def counting_read(group, columns=None):
        decoded[(group.path, group.index)] += 1
        return read(group, columns)

    monkeypatch.setattr(loader, "read_row_group", counting_read)
    rows = PackedRows(str(path), seed=3, shuffle_rows=48)
    order = [ids(r) for r in rows]
    assert len({group_of[row] for row in order[:16]}) > 2
    assert max(decoded.values()) <= 2 and len(decoded) == len(rows.row_groups)
    deal = rows.deal()
    for window in range(deal.windows):  # each window holds what its positions say
        positions = deal.positions(window)
        assert sorted(positions.tolist()) == list(range(window * 48, window * 48 + len(positions)))


# --- resumption ---------------------------------------------------------------------------------


def batch_tokens(rows: list[Mapping]) -> list[list[int]]:
    return [np.asarray(r["input_ids"]).tolist() for r in rows]


def resumed_stream(make, num_workers: int, stop_after: int, batch_size: int = 3
                   ) -> tuple[list, list]:
    """The whole epoch's batches, and the batches of a run stopped after ``stop_after``
    batches and restarted from its saved state in a new loader over a new dataset."""
    def loader_of(dataset):
        return StatefulDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                  collate_fn=batch_tokens)

    whole = list(loader_of(make()))
    stopped = loader_of(make())
    batches = iter(stopped)
    head = [next(batches) for _ in range(stop_after)]
    state = json.loads(json.dumps(stopped.state_dict()))  # as a checkpoint file keeps it
    del batches, stopped
    restarted = loader_of(make())
    restarted.load_state_dict(state)
    return whole, head + list(restarted)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_resumed_rows_continue_the_token_stream(output, num_workers) -> None:
    def make():
        dataset = loader.PackedParquetDataset(str(output / "sft"), seed=5, rank=1, world_size=2,
                                              shuffle_rows=20)
        dataset.set_epoch(3)
        return dataset

    whole, resumed = resumed_stream(make, num_workers, stop_after=5)
    assert len(whole) > 8 and resumed == whole


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_resumed_epoch_packs_continue_the_token_stream(output, num_workers) -> None:
    def make():
        dataset = epoch_packing.EpochPackDataset(str(output / "sft_examples"), seq_len=SEQ_LEN,
                                                 group_examples=40, seed=5)
        dataset.set_epoch(2)
        return dataset

    whole, resumed = resumed_stream(make, num_workers, stop_after=4, batch_size=2)
    assert len(whole) > 6 and resumed == whole


def test_every_stop_point_resumes_exactly(output) -> None:
    """Without a dataloader: stopped after any row (group boundaries and window boundaries
    included), a restored reader yields exactly the rest."""
    path = str(output / "sft_examples")
    whole = [ids(r) for r in PackedRows(path, seed=2, shuffle_rows=10)]
    for stop in (0, 1, 9, 10, 11, 16, 33, len(whole) - 1, len(whole)):
        first = PackedRows(path, seed=2, shuffle_rows=10)
        head = [ids(r) for _, r in zip(range(stop), first, strict=False)]
        restored = PackedRows(path, seed=2, shuffle_rows=10)
        restored.load_state_dict(first.state_dict())
        assert head + [ids(r) for r in restored] == whole, stop
        assert [ids(r) for r in restored] == whole  # the pass after starts the epoch again


def test_state_from_another_deal_is_refused(output) -> None:
    path = str(output / "sft")
    state = PackedRows(path, seed=1, world_size=2).state_dict()
    with pytest.raises(ValueError, match="another deal"):
        PackedRows(path, seed=1, world_size=4).load_state_dict(state)
    packs = EpochPacks(str(output / "sft_examples"), seq_len=SEQ_LEN).state_dict()
    with pytest.raises(ValueError, match="other packing settings"):
        EpochPacks(str(output / "sft_examples"), seq_len=SEQ_LEN * 2).load_state_dict(packs)


# --- packing each epoch -------------------------------------------------------------------------


def segments(rows: Iterable[Mapping]) -> list[tuple[bytes, bytes]]:
    """Every segment of packed rows as (input_ids, labels) bytes."""
    found = []
    for segment in loader.unpack_segments(rows):
        found.append((segment["input_ids"].astype(np.int32).tobytes(),
                      segment["labels"].astype(np.int32).tobytes()))
    return found


def as_packed(example: Mapping) -> tuple[bytes, bytes]:
    """An example as a pack holds it: the first label masked, so no segment learns the start
    of the next."""
    labels = np.asarray(example["labels"], dtype=np.int32).copy()
    labels[0] = -100
    return np.asarray(example["input_ids"], np.int32).tobytes(), labels.tobytes()


@pytest.fixture(scope="module")
def examples(output) -> Counter:
    return Counter(as_packed(r) for r in file_rows(output / "sft_examples",
                                                  ("input_ids", "labels")))


def test_sft_examples_are_the_examples_the_pipeline_packed(output, examples) -> None:
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["instruction"]["examples_written"] == manifest["instruction"]["examples"] \
        == examples.total()
    assert Counter(segments(loader.PackedRows(str(output / "sft")))) == examples


def test_each_epoch_packs_every_example_once_with_all_invariants(output, examples) -> None:
    packs = EpochPacks(str(output / "sft_examples"), seq_len=SEQ_LEN, seed=9, group_examples=64)
    with pytest.raises(TypeError, match="no length"):  # examples per rank are not packs
        len(packs)
    epochs = []
    for epoch in (0, 1):
        packs.set_epoch(epoch)
        rows = list(packs)
        assert Counter(segments(rows)) == examples  # every example exactly once, labels as packed
        for row in rows:
            lengths = row["seq_lengths"]
            assert len(row["input_ids"]) == lengths.sum() <= SEQ_LEN
            assert row["position_ids"].tolist() == [p for n in lengths for p in range(n)]
        batch = collate_packed(rows[:4])
        assert batch["cu_seqlens"].tolist() == \
            [0, *np.cumsum(np.concatenate([r["seq_lengths"] for r in rows[:4]])).tolist()]
        epochs.append([tuple(segments([row])) for row in rows])
    assert epochs[0] != epochs[1]
    assert Counter(epochs[0]) != Counter(epochs[1])  # other neighbours, not only another order


def test_epoch_packing_efficiency_is_close_to_the_pipelines(output, examples) -> None:
    manifest = json.loads((output / "manifest.json").read_text())["instruction"]
    tokens = manifest["packed_tokens"]
    packs = list(EpochPacks(str(output / "sft_examples"), seq_len=SEQ_LEN, seed=1))
    ours = packing_efficiency(sum(len(r["input_ids"]) for r in packs), len(packs), SEQ_LEN)
    assert sum(len(r["input_ids"]) for r in packs) == tokens
    assert ours >= manifest["packing_efficiency"] - 0.01


def test_ranks_pack_the_same_number_of_examples(output, examples) -> None:
    seen: Counter = Counter()
    dealt = []
    for rank in range(3):
        rows = list(EpochPacks(str(output / "sft_examples"), seq_len=SEQ_LEN, seed=4, rank=rank,
                               world_size=3, drop_last=True, group_examples=50))
        dealt.append(sum(len(r["seq_lengths"]) for r in rows))
        seen.update(segments(rows))
    assert dealt == [examples.total() // 3] * 3
    assert seen <= examples and examples.total() - seen.total() == examples.total() % 3


def test_held_out_examples_are_written_unpacked_beside_their_packs(tmp_path) -> None:
    """With a validation split, validation/sft_examples holds the held-out examples, counted
    apart and checked against the rows written like every other output."""
    from beam_pipeline.running import run

    out = tmp_path / "run"
    run([f"--input={ROOT / 'examples' / 'data' / 'sharegpt_sample.json'}",
         f"--input={ROOT / 'examples' / 'data' / 'alpaca_seed_tasks.json'}", f"--output={out}",
         "--instruction_validation=20", "--write_examples=true", "--seq_len=1024"])
    manifest = json.loads((out / "manifest.json").read_text())
    held, kept = manifest["validation"]["instruction"], manifest["instruction"]
    assert held["examples_written"] == held["examples"] == 20
    assert kept["examples_written"] == kept["examples"] > 0
    for prefix in ("", "validation/"):
        unpacked = file_rows(out / f"{prefix}sft_examples", ("input_ids", "labels"))
        assert Counter(segments(PackedRows(str(out / f"{prefix}sft")))) == \
            Counter(as_packed(r) for r in unpacked)
