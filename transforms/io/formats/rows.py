"""Rows of the staged tables as numpy arrays, and files laid out as a count, an offset table and
the samples: the shape MDS shards and LitData chunks share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

import numpy as np
import pyarrow as pa

UINT32_LIMIT = 1 << 32
COPY_BUFFER = 1 << 22


def list_columns(table: pa.Table, names: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(values, offsets) of each named ``list<int32>`` column, without Python lists."""
    found = []
    for name in names:
        column = table.column(name).combine_chunks()
        offsets = column.offsets.to_numpy()
        found.append((column.values.to_numpy(zero_copy_only=False), offsets))
    return found


def table_rows(tables: Iterable[pa.Table], names: Sequence[str]) -> Iterator[list[np.ndarray]]:
    """Each row of ``tables`` as one int32 array per named column, in order."""
    for table in tables:
        columns = list_columns(table, names)
        for row in range(table.num_rows):
            yield [values[offsets[row]:offsets[row + 1]] for values, offsets in columns]


class CountedRows:
    """The rows of ``tables`` (``table_rows``), counting the ``input_ids`` tokens they hold as
    they go by."""

    def __init__(self, tables: Iterable[pa.Table], names: Sequence[str]):
        self.rows = table_rows(tables, names)
        self.ids = list(names).index("input_ids")
        self.tokens = 0

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        for row in self.rows:
            self.tokens += len(row[self.ids])
            yield row


def write_offset_table(handle: BinaryIO, samples: Iterable[bytes], count: int,
                       preamble: bytes = b"", what: str = "file") -> int:
    """Writes ``[count: u32][offsets: u32 x (count + 1)][preamble][samples]``, each offset the
    absolute position of a sample (the last, of the end); returns the bytes written.

    The offsets come first but are known only once every sample is encoded, so the samples go
    to a local temporary file while their sizes are counted: memory holds one sample, whatever
    the file's size. u32 offsets bound a file to 4 GiB, as the readers do.
    """
    header = 4 + 4 * (count + 1) + len(preamble)
    sizes = np.zeros(count + 1, np.int64)
    with tempfile.TemporaryFile() as body:
        written = 0
        for index, sample in enumerate(samples):
            body.write(sample)
            sizes[index + 1] = len(sample)
            written = index + 1
        if written != count:
            raise ValueError(f"{what}: {written} samples written, {count} planned")
        offsets = header + np.cumsum(sizes)
        if offsets[-1] >= UINT32_LIMIT:
            raise ValueError(f"{what} would be {offsets[-1]:,} bytes, over the 4 GiB its u32 "
                             "offsets address; raise --num_shards or lower --target_shard_mb")
        handle.write(np.uint32(count).tobytes())
        handle.write(offsets.astype(np.uint32).tobytes())
        handle.write(preamble)
        body.seek(0)
        shutil.copyfileobj(body, handle, COPY_BUFFER)
    return int(offsets[-1])
