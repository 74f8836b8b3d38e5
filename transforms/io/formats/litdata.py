"""Lightning's LitData optimized format (``litdata.StreamingDataset``), written with numpy
alone: LitData's own writer (``litdata.streaming.writer.BinaryWriter``, which ``optimize()``'s
process pool drives) could run in a Beam worker without that pool, but it imports torch, which
the pipeline's workers do not install; its layout is small enough to write directly.

The layout is litdata 0.2.76's (``litdata/streaming/writer.py``, ``serializers.py``,
``item_loader.py``): a chunk is ``[items: u32][offsets: u32 x (items + 1)][items]``; an item is
its dict's leaves in key order, each a 1-D int32 array stored without a header
(``no_header_numpy:2``, 2 being int32's index in LitData's dtype table), after their byte sizes
(u32). ``index.json`` lists the chunks and the item's structure (a dict of the columns, as
LitData's pytree module writes it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.io.formats.base import OutputFormat, Written, read_bytes
from transforms.io.formats.rows import CountedRows, write_offset_table

INT32_FORMAT = "no_header_numpy:2"


def encode_item(row: Sequence[np.ndarray]) -> bytes:
    return np.array([v.nbytes for v in row], np.uint32).tobytes() + b"".join(
        v.tobytes() for v in row)


def data_spec(columns: Sequence[str]) -> str:
    """The item's structure as LitData's ``treespec_dumps`` writes a flat dict of arrays."""
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": "builtins.dict", "context": json.dumps(list(columns)),
                           "children_spec": [leaf] * len(columns)}])


class LitData(OutputFormat):
    name = "litdata"
    index_name = "index.json"

    def suffix(self, base: str) -> str:
        return ".bin"

    def write(self, path: str, base: str, tables: Iterable[pa.Table], rows: int,
              columns: Sequence[str], vocab_size: int) -> Written:
        counted = CountedRows(tables, columns)
        with FileSystems.create(path) as handle:
            size = write_offset_table(handle, map(encode_item, counted), rows, what=path)
        entry = {"chunk_bytes": size, "chunk_size": rows, "dim": None,
                 "filename": FileSystems.split(path)[1], "columns": list(columns)}
        return Written(rows, counted.tokens, entry)

    def rows(self, path: str) -> int:
        return int(np.frombuffer(read_bytes(path, 4), np.uint32)[0])

    def folder_index(self, entries: Sequence[Mapping]) -> dict:
        columns = entries[0]["columns"]
        chunks = [{k: v for k, v in entry.items() if k != "columns"} for entry in entries]
        return {"chunks": chunks, "config": {
            "chunk_bytes": max(c["chunk_bytes"] for c in chunks), "chunk_size": None,
            "compression": None, "data_format": [INT32_FORMAT] * len(columns),
            "data_spec": data_spec(columns), "encryption": None,
            "item_loader": "PyTreeLoader"}}
