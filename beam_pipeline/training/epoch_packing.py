"""Packing SFT examples anew each epoch, in the dataloader workers.

The pipeline packs ``OUTPUT/sft`` once, so every epoch sees the same neighbours in every pack.
With ``--write_examples=true`` it also writes the examples unpacked (``OUTPUT/sft_examples``);
``EpochPacks`` reads those through ``PackedRows`` (dealt evenly over ranks, shuffled per epoch)
and packs them with the pipeline's own packer (``pack_best_fit_decreasing`` and
``build_packed_rows`` from ``transforms.core.packing``: the same bins, the same labels with the
first token of every segment masked, the same ``position_ids``, ``seq_lengths`` and
``sources``), one group of ``group_examples`` examples at a time, so memory and the latency of
the first pack stay bounded. The rows it yields are the pipeline's packed rows:
``PackedCollator`` takes them.

``EpochPackDataset`` is the same as a PyTorch ``IterableDataset``; importing this module needs
no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from beam_pipeline.training.loader import PackedRows, lazy_torch_dataset, table_rows
from transforms.core.packing import build_packed_rows, pack_best_fit_decreasing

EXAMPLE_COLUMNS = ("input_ids", "labels", "sources")


class EpochPacks(PackedRows):
    """Packed rows of at most ``seq_len`` tokens, made each epoch from unpacked examples.

    ``path`` is ``OUTPUT/sft_examples``; ``rank``, ``world_size``, ``seed``, ``drop_last`` and
    ``shuffle_rows`` deal and shuffle the examples as ``PackedRows`` deals rows. Each run of
    ``group_examples`` consecutive examples of this reader is packed best-fit decreasing
    (``max_segments`` caps the examples per pack, as ``--max_segments_per_pack``), and with a
    ``seed`` the packs of a group come out in a shuffled order (best-fit decreasing opens them
    longest example first). Every example this reader is dealt lands in exactly one pack.

    ``state_dict()`` holds the epoch, the group and the packs of it yielded: a restored reader
    re-reads and repacks that one group (packing is deterministic) and goes on from the next pack.
    """

    def __init__(self, path: str | Sequence[str], seq_len: int, group_examples: int = 1024,
                 max_segments: int | None = None, **deal: Any):
        super().__init__(path, columns=EXAMPLE_COLUMNS, **deal)
        if group_examples < 1:
            raise ValueError(f"group_examples must be >= 1, got {group_examples}")
        self.seq_len, self.group_examples, self.max_segments = seq_len, group_examples, max_segments
        self._group = self._packs = 0  # where this pass stands: group, packs yielded of it
        self._resume = (0, 0)  # where the next pass begins (load_state_dict)

    def __len__(self) -> int:
        """Unknown: the packs of an epoch are counted only once packed. (A TypeError, so that
        Trainer and DataLoader treat the dataset as unsized; give Trainer ``max_steps``.)"""
        raise TypeError("EpochPacks has no length: packs per epoch are known only once packed")

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._group = self._packs = 0
            self._resume = (0, 0)
        super().set_epoch(epoch)

    def pack_group(self, examples: Sequence[Mapping[str, np.ndarray]], group: int
                   ) -> list[dict[str, np.ndarray]]:
        """One group's packed rows, in the order they are yielded."""
        lengths = np.fromiter((len(e["input_ids"]) for e in examples), np.int64, len(examples))
        if lengths.size and lengths.max() > self.seq_len:
            raise ValueError(f"an example of {lengths.max()} tokens is longer than seq_len="
                             f"{self.seq_len}: pack with the pipeline's --seq_len or more")
        bins = pack_best_fit_decreasing(lengths, self.seq_len, self.max_segments)
        if self.seed is not None:
            key = [*self.deal().key, group]
            bins = [bins[i] for i in np.random.default_rng(key).permutation(len(bins))]
        table = build_packed_rows([e["input_ids"] for e in examples],
                                  [e["labels"] for e in examples], bins,
                                  [e["sources"][0] for e in examples])
        return list(table_rows(table))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        (group, skip), self._resume = self._resume, (0, 0)
        examples = self.rows_from(group * self.group_examples)
        while chunk := list(itertools.islice(examples, self.group_examples)):
            self._group, self._packs = group, skip
            for row in itertools.islice(self.pack_group(chunk, group), skip, None):
                self._packs += 1
                yield row
            group, skip = group + 1, 0
        self._group, self._packs = group, 0

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "position": self._group * self.group_examples,
                "group": self._group, "packs": self._packs,
                "seq_len": self.seq_len, "group_examples": self.group_examples,
                "max_segments": self.max_segments}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = {"seq_len": self.seq_len, "group_examples": self.group_examples,
                "max_segments": self.max_segments}
        wrong = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if wrong:
            raise ValueError(f"state from other packing settings (saved, now): {wrong}")
        super().load_state_dict(state)
        self._group, self._packs = self._resume = (state["group"], state["packs"])


__getattr__ = lazy_torch_dataset(globals(), "EpochPackDataset", EpochPacks)
