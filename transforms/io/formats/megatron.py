"""Megatron-LM / NeMo / Megatron-Bridge layouts, written with numpy alone (no torch, no
megatron-core on the workers).

Pretraining: Megatron's indexed dataset, one ``PREFIX.bin`` / ``PREFIX.idx`` pair per shard,
one sequence per document (its tokens and the end-of-text token), which Megatron's
``GPTDataset`` concatenates into samples itself. The layout is megatron-core 0.16.1's
(``megatron/core/datasets/indexed_dataset.py``): ``.bin`` is the sequences back to back in one
dtype, uint16 below a vocabulary of 65,500 and int32 above (``DType.optimal_dtype``); ``.idx`` is
the header ``MMIDIDX\\0\\0``, version 1 (u64), the dtype code (u8), the sequence and document
counts (u64), the sequence lengths (i32), their byte offsets in ``.bin`` (i64) and the document
indices (i64, ``0..n``: one sequence per document).

SFT: the packed-sequence rows of NeMo's ``GPTSFTPackedDataset`` (nemo-toolkit 2.7.3,
``nemo.collections.llm.gpt.data.core``; the same class in Megatron-Bridge 0.3.1,
``megatron.bridge.data.datasets.sft``): a ``.npy`` object array, one dict per pack with
``input_ids``, ``loss_mask`` and ``seq_start_id``. NeMo's mask is its labels' mask shifted by
one (``loss_mask[j]`` trains the prediction of token ``j + 1``, and each segment's last entry is
false), so it is read off our ``labels``: ``loss_mask[j] = labels[j + 1] != -100`` inside a
segment. ``input_ids`` and ``loss_mask`` are numpy arrays (int32, bool), which the reader's
slicing and ``np.concatenate`` take as they take lists, at a tenth of a list's memory.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.core.vocabulary import IGNORE_INDEX
from transforms.io.formats.base import DOCUMENTS, PRETRAIN, SFT, OutputFormat, Written, read_bytes
from transforms.io.formats.rows import table_rows

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {np.dtype(np.int32): 4, np.dtype(np.uint16): 8}  # megatron-core's DType
UINT16_VOCAB_LIMIT = 65500  # below it, megatron-core stores tokens as uint16
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype megatron-core's ``DType.optimal_dtype`` picks for a vocabulary."""
    return np.dtype(np.uint16 if vocab_size < UINT16_VOCAB_LIMIT else np.int32)


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` of documents of ``lengths`` tokens, one sequence each."""
    count = len(lengths)
    pointers = np.zeros(count, np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    return b"".join([INDEX_HEADER, struct.pack("<Q", INDEX_VERSION),
                     struct.pack("<B", DTYPE_CODES[dtype]), struct.pack("<Q", count),
                     struct.pack("<Q", count + 1), lengths.astype(np.int32).tobytes(),
                     pointers.tobytes(), np.arange(count + 1, dtype=np.int64).tobytes()])


def nemo_loss_mask(labels: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """NeMo's shifted mask from Hugging Face labels: position j trains token j + 1 of its
    segment; the last position of each segment trains nothing.

    >>> nemo_loss_mask(np.array([-100, -100, 7, 8, -100, 9]), np.array([0, 4])).tolist()
    [False, True, True, False, True, False]
    """
    mask = np.zeros(len(labels), bool)
    mask[:-1] = labels[1:] != IGNORE_INDEX
    ends = np.append(starts[1:], len(labels)) - 1
    mask[ends] = False
    return mask


class Megatron(OutputFormat):
    name = "megatron"
    sources = {PRETRAIN: DOCUMENTS, SFT: SFT}

    def suffix(self, base: str) -> str:
        return ".bin" if base == PRETRAIN else ".npy"

    def companions(self, path: str) -> list[str]:
        return [path[:-len(".bin")] + ".idx"] if path.endswith(".bin") else []

    def write(self, path: str, base: str, tables: Iterable[pa.Table], rows: int,
              columns: Sequence[str], vocab_size: int) -> Written:
        if base == PRETRAIN:
            return self._write_documents(path, tables, token_dtype(vocab_size))
        return self._write_packs(path, tables)

    def _write_documents(self, path: str, tables: Iterable[pa.Table],
                         dtype: np.dtype) -> Written:
        lengths = []
        with FileSystems.create(path) as handle:
            for table in tables:
                column = table.column("input_ids").combine_chunks()
                handle.write(column.values.to_numpy().astype(dtype).tobytes())
                lengths.append(np.diff(column.offsets.to_numpy()))
        found = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
        with FileSystems.create(self.companions(path)[0]) as handle:
            handle.write(index_bytes(found, dtype))
        return Written(len(found), int(found.sum()))

    def _write_packs(self, path: str, tables: Iterable[pa.Table]) -> Written:
        packs, tokens = [], 0
        for ids, labels, lengths in table_rows(tables, ("input_ids", "labels", "seq_lengths")):
            starts = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)
            packs.append({"input_ids": ids.copy(), "loss_mask": nemo_loss_mask(labels, starts),
                          "seq_start_id": starts.tolist()})
            tokens += len(ids)
        array = np.empty(len(packs), dtype=object)
        array[:] = packs
        with FileSystems.create(path) as handle:
            np.save(handle, array, allow_pickle=True)
        return Written(len(packs), tokens)

    def rows(self, path: str) -> int:
        if path.endswith(".bin"):
            header = read_bytes(self.companions(path)[0], 26)
            if header[:9] != INDEX_HEADER:
                raise ValueError(f"{path}: its .idx is not a Megatron index")
            return struct.unpack("<Q", header[18:26])[0]
        with FileSystems.open(path) as handle:
            read_header = NPY_HEADERS[np.lib.format.read_magic(handle)]
            shape, _, _ = read_header(handle)
        return shape[0]
