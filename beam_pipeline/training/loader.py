"""Reading the pipeline's Parquet outputs in a training job: streamed, sharded and collated.

This is the training side of the output contract (``OUTPUT/pretrain`` and ``OUTPUT/sft``, as
the README's *Outputs* section states it):

- ``list_parquet_files`` / ``list_row_groups`` plan the reading from the footers, and
  ``PackedRows.deal`` deals rows (not whole row groups) so that every rank reads the same number
  per epoch (``rows_per_rank``: ``drop_last`` or the first rows repeated, as PyTorch's
  ``DistributedSampler``), each rank's range split over its dataloader workers; with a ``seed``
  the row groups are reordered and the rows shuffled in bounded windows, anew each epoch.
  ``state_dict`` / ``load_state_dict`` resume a stopped job on the next row (torchdata's
  ``StatefulDataLoader`` protocol).
- ``read_row_group`` reads one row group of a local file through its own memory map, unmapped
  as soon as the group is decoded, so the reader's resident memory is bounded by a row group,
  not by the file; ``gs://`` and every other Beam filesystem are streamed through
  ``FileSystems.open``. Rows come out as int32 numpy views of the decoded Arrow buffers.
- ``PackedRows`` iterates the rows of one reader; ``PackedParquetDataset`` is the same as a
  PyTorch ``IterableDataset`` (it finds its dataloader worker itself), and
  ``hf_streaming_dataset`` is the Hugging Face ``datasets`` way in.
- ``collate_packed`` / ``PackedCollator`` flatten a batch of packed rows into the padding-free
  form attention kernels take: ``position_ids`` restarting per segment, ``cu_seqlens`` and
  ``max_seqlen`` for variable-length flash attention, and optionally a block-diagonal causal
  mask for kernels that take an explicit mask.

Labels: sft rows carry theirs. Pretrain rows have none, so they get ``input_ids`` with ``-100``
at the first token of every segment (``seq_lengths`` piece): with attention kept inside each
document, that token's only possible predictor is the last token of the previous document, so
training on it would be the cross-document leak the packing avoids. TRL's padding-free collator
and transformers' ``DataCollatorWithFlattening`` make the same choice.

Importing this module needs only numpy and pyarrow: torch, ``datasets`` and Beam (for non-local
paths) are imported where they are used, so the pipeline and its Dataflow workers never need
them. ``PackedParquetDataset`` is built on first access (a module ``__getattr__``), for the same
reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.core.vocabulary import (
    IGNORE_INDEX,
)

if TYPE_CHECKING:
    import datasets

MaskKind = Literal["bool", "float"]
_GLOB_CHARS = frozenset("*?[")


def _is_local(path: str) -> bool:
    return urlparse(path).scheme in ("", "file")


def list_parquet_files(path: str) -> list[str]:
    """The Parquet files under an output directory (``OUT/sft``), matching a glob, or one file.

    Names are sorted (``part-00000-of-0000N`` ...), so every rank sees the same global order
    and so deals the same row groups.
    """
    if _is_local(path):
        local = path.removeprefix("file://")
        if os.path.isdir(local):
            files = glob.glob(os.path.join(local, "*.parquet"))
        elif os.path.isfile(local):
            files = [local]
        else:
            files = glob.glob(local)
    else:
        from apache_beam.io.filesystems import FileSystems

        pattern = path
        if not _GLOB_CHARS & set(path) and not path.endswith(".parquet"):
            pattern = path.rstrip("/") + "/*.parquet"
        files = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    if not files:
        raise FileNotFoundError(f"no Parquet files at {path}")
    return sorted(files)


@contextlib.contextmanager
def _open(path: str) -> Iterator[pa.NativeFile]:
    """A memory map of a local file (its pages leave the process on close), else a Beam stream."""
    if _is_local(path):
        with pa.memory_map(path.removeprefix("file://")) as source:
            yield source
    else:
        from apache_beam.io.filesystems import CompressionTypes, FileSystems

        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            yield pa.PythonFile(handle, mode="r")


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: the unit that is read and decoded at once."""

    path: str
    index: int
    num_rows: int


def list_row_groups(files: Iterable[str]) -> list[RowGroup]:
    """Every row group of ``files`` in file order, from the footers alone."""
    groups: list[RowGroup] = []
    for path in files:
        with _open(path) as source:
            meta = pq.read_metadata(source)
        groups.extend(RowGroup(path, i, meta.row_group(i).num_rows)
                      for i in range(meta.num_row_groups))
    return groups


def read_row_group(group: RowGroup, columns: Sequence[str] | None = None) -> pa.Table:
    """One row group, with the file mapped (or streamed) only while it is decoded."""
    with _open(group.path) as source:
        return pq.ParquetFile(source).read_row_group(group.index, columns=columns)


def _int32_view(array: pa.Array) -> np.ndarray:
    """The values of an int32 array without nulls as a numpy view of its buffer (no copy).

    ``Array.to_numpy`` would do the same but imports pandas on first use (50 MB resident).
    """
    if array.type != pa.int32() or array.null_count:
        raise TypeError(f"expected int32 values without nulls, got {array.type} "
                        f"with {array.null_count} nulls")
    return np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array),
                         offset=array.offset * 4)


def table_rows(table: pa.Table) -> Iterator[dict[str, np.ndarray]]:
    """Each row of a table of ``list<int32>`` columns as int32 numpy views (no copies)."""
    if not table.num_rows:
        return
    table = table.combine_chunks()  # one chunk per column
    columns = [(name, _int32_view(column.chunk(0).values), _int32_view(column.chunk(0).offsets))
               for name, column in zip(table.column_names, table.columns, strict=True)]
    for i in range(table.num_rows):
        yield {name: values[offsets[i]:offsets[i + 1]] for name, values, offsets in columns}


def epoch_group_order(num_groups: int, seed: int | None, epoch: int) -> np.ndarray:
    """The order row groups are laid end to end in this epoch: file order, or with a ``seed``
    a permutation drawn from (seed, epoch) alone, so every rank computes the same one."""
    if seed is None:
        return np.arange(num_groups)
    return np.random.default_rng([seed, epoch]).permutation(num_groups)


def rows_per_rank(total_rows: int, world_size: int, drop_last: bool) -> int:
    """Rows every rank reads per epoch: ``total // world_size`` with ``drop_last`` (at most
    ``world_size - 1`` rows left out), else ``ceil(total / world_size)`` with the first rows of
    the epoch read twice to make up the difference, as ``DistributedSampler`` does.

    >>> rows_per_rank(10, 4, drop_last=True), rows_per_rank(10, 4, drop_last=False)
    (2, 3)
    """
    return total_rows // world_size if drop_last else -(-total_rows // world_size)


@dataclasses.dataclass(frozen=True)
class Deal:
    """The rows one reader (a rank's dataloader worker) yields in one epoch, in order.

    The epoch lays the row groups end to end (``epoch_group_order``); rank ``r`` reads positions
    ``[r * per_rank, (r + 1) * per_rank)`` of that stream (wrapping round to its start for the
    repeated rows), and its workers split that range into contiguous parts, so each reader
    decodes only the few row groups its range covers. Each part is read in windows of
    ``window`` rows, shuffled inside each window with a seed: the shuffle crosses row-group
    boundaries, the groups are reordered every epoch, and memory holds one window.
    """

    sizes: np.ndarray  # rows of each row group, in the epoch's group order
    start: int  # first position of this reader in the epoch stream
    count: int  # rows this reader yields
    window: int
    key: tuple[int, ...] | None  # the shuffle seed of this reader, None: no shuffle

    def positions(self, window: int) -> np.ndarray:
        """Stream positions (modulo the total, for repeated rows) of window ``window``, in the
        order they are yielded."""
        lo = window * self.window
        hi = min(lo + self.window, self.count)
        positions = (self.start + np.arange(lo, hi)) % int(self.sizes.sum())
        if self.key is None:
            return positions
        return np.random.default_rng([*self.key, window]).permutation(positions)

    def last_position(self, window: int) -> int:
        """The stream position that ends window ``window``: its row group goes on into the next
        window."""
        return (self.start + min((window + 1) * self.window, self.count) - 1) \
            % int(self.sizes.sum())

    @property
    def windows(self) -> int:
        return -(-self.count // self.window)


class PackedRows:
    """The rows of this process's share of an output, dealt evenly and shuffled per epoch.

    ``path`` is an output directory (``OUT/sft``), a glob, a file, or a list of files, local or
    ``gs://``. Every rank must see the same files. ``rank`` / ``world_size`` shard across
    processes: pass them in a plain ``torchrun`` loop; leave the defaults under Trainer or
    accelerate, which shard (or dispatch) batches themselves.

    Every rank reads ``rows_per_rank`` rows per epoch: with ``drop_last`` the last rows of the
    epoch (fewer than ``world_size``) are left out, else the first ones are read twice. With a
    ``seed`` the order changes with ``set_epoch`` and is the same on every rerun: a function of
    (seed, epoch, rank, world_size and the number of dataloader workers). The shuffle buffer
    holds ``shuffle_rows`` rows (default four of the largest row groups).

    ``state_dict()`` / ``load_state_dict()`` save and restore the epoch and the rows yielded,
    the protocol of torchdata's ``StatefulDataLoader``: a restored reader yields exactly the
    rows that the uninterrupted one would have yielded next, without reading the rows before.
    """

    def __init__(self, path: str | Sequence[str], columns: Sequence[str] | None = None,
                 rank: int = 0, world_size: int = 1, seed: int | None = None,
                 drop_last: bool = False, shuffle_rows: int | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if shuffle_rows is not None and shuffle_rows < 1:
            raise ValueError(f"shuffle_rows must be >= 1, got {shuffle_rows}")
        files = list_parquet_files(path) if isinstance(path, str) else sorted(path)
        self.row_groups = list_row_groups(files)
        self.columns = list(columns) if columns is not None else None
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.drop_last, self.shuffle_rows = drop_last, shuffle_rows
        self.epoch = 0
        self._start = 0  # where the next pass begins (load_state_dict)
        self._position = 0  # rows yielded in this pass

    def set_epoch(self, epoch: int) -> None:
        """Reshuffles for ``epoch`` (only with a ``seed``); Trainer calls this each epoch."""
        if epoch != self.epoch:
            self._start = self._position = 0
        self.epoch = epoch

    def worker(self) -> tuple[int, int]:
        """This reader's (worker, num_workers) inside its process: one, without torch."""
        return 0, 1

    def rows_per_epoch(self) -> int:
        """Rows this rank reads per epoch (all its workers together)."""
        total = sum(g.num_rows for g in self.row_groups)
        return rows_per_rank(total, self.world_size, self.drop_last)

    def __len__(self) -> int:
        return self.rows_per_epoch()

    def deal(self) -> Deal:
        """What this rank and worker read this epoch."""
        worker, num_workers = self.worker()
        order = epoch_group_order(len(self.row_groups), self.seed, self.epoch)
        sizes = np.array([self.row_groups[i].num_rows for i in order], dtype=np.int64)
        if not sizes.sum():
            raise ValueError("the output has no rows")
        per_rank = self.rows_per_epoch()
        bounds = [per_rank * i // num_workers for i in range(num_workers + 1)]
        window = self.shuffle_rows or 4 * int(sizes.max())
        key = None if self.seed is None else (self.seed, self.epoch, self.rank, self.world_size,
                                              worker, num_workers)
        return Deal(sizes, self.rank * per_rank + bounds[worker],
                    bounds[worker + 1] - bounds[worker], window, key)

    def rows_from(self, start: int) -> Iterator[dict[str, np.ndarray]]:
        """This reader's rows of the epoch from its ``start``-th on (no state kept)."""
        deal = self.deal()
        if not deal.count:
            return
        order = epoch_group_order(len(self.row_groups), self.seed, self.epoch)
        ends = np.cumsum(deal.sizes)
        decoded: dict[int, list[dict[str, np.ndarray]]] = {}  # row groups in use, by position
        first_window, skip = divmod(start, deal.window)
        for window in range(first_window, deal.windows):
            positions = deal.positions(window)
            groups = np.searchsorted(ends, positions, side="right")
            offsets = (positions - (ends[groups] - deal.sizes[groups])).tolist()
            groups = groups.tolist()
            last = deal.last_position(window)
            boundary = int(np.searchsorted(ends, last, side="right"))
            if ends[boundary] - 1 == last:  # the window ends with its group: nothing to keep
                boundary = -1
            last_use = {group: i for i, group in enumerate(groups)}
            for i, (group, offset) in enumerate(zip(groups, offsets, strict=True)):
                if group not in decoded:  # decoded when first needed, dropped after last use
                    table = read_row_group(self.row_groups[order[group]], self.columns)
                    decoded[group] = list(table_rows(table))
                row = decoded[group][offset]
                if last_use[group] == i and group != boundary:
                    del decoded[group]
                if i >= skip:
                    yield row
            decoded = {group: rows for group, rows in decoded.items() if group == boundary}
            skip = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self._position, self._start = self._start, 0
        for row in self.rows_from(self._position):
            self._position += 1
            yield row

    def state_dict(self) -> dict[str, Any]:
        """Where this reader stands: the epoch and the rows it has yielded in it."""
        return {"epoch": self.epoch, "position": self._position, **self._identity()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()``: the next pass resumes after the rows yielded then. The
        deal must be the same (seed, ranks, workers, rows), or the position would mean other
        rows: a mismatch is an error."""
        wrong = {k: (state.get(k), v) for k, v in self._identity().items() if state.get(k) != v}
        if wrong:
            raise ValueError(f"state from another deal (saved, now): {wrong}")
        self.epoch, self._start = state["epoch"], state["position"]
        self._position = self._start

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                "num_workers": self.worker()[1], "drop_last": self.drop_last,
                "rows": sum(g.num_rows for g in self.row_groups)}


def torch_dataset_class(base: type, name: str) -> type:
    """``base`` as a PyTorch ``IterableDataset`` that finds its dataloader worker itself, so
    each worker reads its own part (torch imported only here)."""
    import torch.utils.data

    def worker(self: Any) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    cls = type(name, (base, torch.utils.data.IterableDataset),
               {"worker": worker, "__module__": base.__module__,
                "__doc__": f"``{base.__name__}`` as a PyTorch ``IterableDataset``: each "
                           "dataloader worker reads its own part of this rank's rows."})
    return cls


def lazy_torch_dataset(namespace: dict, name: str, base: type) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds ``name`` (``base`` as a torch dataset) on first
    access, so importing the module needs no torch."""

    def module_getattr(attr: str) -> Any:
        if attr != name:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {attr!r}")
        namespace[name] = cls = torch_dataset_class(base, name)
        return cls

    return module_getattr


__getattr__ = lazy_torch_dataset(globals(), "PackedParquetDataset", PackedRows)


def hf_streaming_dataset(path: str, rank: int = 0, world_size: int = 1
                         ) -> datasets.IterableDataset:
    """The output as a streaming Hugging Face dataset, one shard per row group.

    ``load_dataset("parquet", streaming=True)`` shards by file; ``reshard`` splits that into row
    groups, so a few large files still spread over many ranks and workers. With
    ``world_size > 1`` this rank's part is kept (``split_dataset_by_node``); Trainer does that
    split itself, so leave the defaults there. ``gs://`` paths need ``gcsfs`` (fsspec).
    """
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    dataset = load_dataset("parquet", data_files=list_parquet_files(path), split="train",
                           streaming=True).reshard()
    if world_size > 1:
        dataset = split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    return dataset


def segment_lengths(row: Mapping[str, Any]) -> np.ndarray:
    """The lengths of a packed row's segments, as int64.

    From ``seq_lengths`` (both outputs carry it), else from where ``position_ids`` restart at 0,
    else the row is one segment.
    """
    n_tokens = len(row["input_ids"])
    if "seq_lengths" in row:
        lengths = np.asarray(row["seq_lengths"], dtype=np.int64)
    elif "position_ids" in row:
        starts = np.flatnonzero(np.asarray(row["position_ids"]) == 0)
        lengths = np.diff(np.append(starts, n_tokens))
    else:
        lengths = np.array([n_tokens], dtype=np.int64)
    if lengths.sum() != n_tokens or (lengths < 1).any():
        raise ValueError(f"segment lengths {lengths.tolist()} do not split a row of {n_tokens} "
                         "tokens into non-empty segments")
    return lengths


def _labels(row: Mapping[str, Any]) -> np.ndarray:
    return np.asarray(row["labels"] if "labels" in row else row["input_ids"], dtype=np.int64)


def block_causal_mask(seq_lengths: np.ndarray, kind: MaskKind = "bool") -> np.ndarray:
    """The (1, 1, T, T) mask of segments laid back to back: query i sees key j iff both are in
    the same segment and j <= i.

    ``"bool"``: True where attention is allowed (torch SDPA, flex attention). ``"float"``: 0
    there and the float32 minimum elsewhere, added to the scores (transformers' eager path adds
    the mask, so a bool mask would be wrong there). Memory grows with T², so this is for kernels
    that take nothing else; varlen kernels take ``cu_seqlens``.

    >>> block_causal_mask(np.array([2, 1]))[0, 0].astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    lengths = np.asarray(seq_lengths, dtype=np.int64)
    segment = np.repeat(np.arange(len(lengths)), lengths)
    allowed = (segment[:, None] == segment[None, :]) & np.tri(len(segment), dtype=bool)
    if kind == "bool":
        return allowed[None, None]
    if kind == "float":
        return np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
    raise ValueError(f"mask kind must be 'bool' or 'float', got {kind!r}")


def collate_packed(rows: Sequence[Mapping[str, Any]], mask: MaskKind | None = None
                   ) -> dict[str, Any]:
    """A batch of packed rows flattened into one padding-free sequence, as numpy.

    Returns ``input_ids``, ``labels`` and ``position_ids`` of shape (1, T) as int64 (what
    embedding and loss layers index with), ``cu_seqlens`` (int32, segment boundaries over the
    flattened batch, starting at 0) and ``max_seqlen`` (int) for varlen flash attention, and
    with ``mask`` an ``attention_mask`` from ``block_causal_mask``. Labels are the row's (else
    its ``input_ids``) with ``-100`` at every segment start, so no segment learns the start of
    the next. Rows may be dicts of numpy arrays (``PackedRows``) or of lists (``datasets``).

    >>> out = collate_packed([{"input_ids": [5, 6, 7], "seq_lengths": [2, 1]},
    ...                       {"input_ids": [8, 9], "labels": [-100, 9]}])
    >>> out["labels"].tolist(), out["position_ids"].tolist()
    ([[-100, 6, -100, -100, 9]], [[0, 1, 0, 0, 1]])
    >>> out["cu_seqlens"].tolist(), out["max_seqlen"]
    ([0, 2, 3, 5], 2)
    """
    if not rows:
        raise ValueError("cannot collate an empty batch")
    lengths = np.concatenate([segment_lengths(row) for row in rows])
    input_ids = np.concatenate([np.asarray(row["input_ids"], dtype=np.int64) for row in rows])
    labels = np.concatenate([_labels(row) for row in rows])
    if len(labels) != len(input_ids):
        raise ValueError(f"{len(input_ids)} input_ids but {len(labels)} labels in the batch")
    cu_seqlens = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    starts = cu_seqlens[:-1]
    labels[starts] = IGNORE_INDEX
    position_ids = np.arange(len(input_ids), dtype=np.int64) - np.repeat(starts, lengths)
    batch: dict[str, Any] = {
        "input_ids": input_ids[None],
        "labels": labels[None],
        "position_ids": position_ids[None],
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
    }
    if mask is not None:
        batch["attention_mask"] = block_causal_mask(lengths, mask)
    return batch


@dataclasses.dataclass(frozen=True)
class PackedCollator:
    """``collate_packed`` as torch tensors: a DataLoader's ``collate_fn``, a Trainer's
    ``data_collator``.

    ``transformers_names`` renames ``cu_seqlens`` / ``max_seqlen`` to the keyword arguments a
    transformers model forwards to its flash-attention path (``cu_seq_lens_q``,
    ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``), so the batch can go straight into
    ``model(**batch)``.
    """

    mask: MaskKind | None = None
    transformers_names: bool = False

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        batch = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                 for key, value in collate_packed(rows, self.mask).items()}
        if self.transformers_names:
            cu_seqlens, max_seqlen = batch.pop("cu_seqlens"), batch.pop("max_seqlen")
            batch.update(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
                         max_length_q=max_seqlen, max_length_k=max_seqlen)
        return batch


def unpack_segments(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
    """Every segment of every packed row as its own example (``input_ids`` and ``labels``).

    For collators that take one sequence per example, such as transformers'
    ``DataCollatorWithFlattening``: given a packed row whole, it would let the row's segments
    attend to each other.
    """
    segments = []
    for row in rows:
        ids, labels = np.asarray(row["input_ids"]), _labels(row)
        bounds = np.cumsum(segment_lengths(row))[:-1]
        segments.extend({"input_ids": seg_ids, "labels": seg_labels} for seg_ids, seg_labels
                        in zip(np.split(ids, bounds), np.split(labels, bounds), strict=True))
    return segments
