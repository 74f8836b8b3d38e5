"""MosaicML Streaming's MDS shards (``streaming.StreamingDataset``), written with numpy alone.

The layout is mosaicml-streaming 0.13.0's (``streaming/base/format/mds/writer.py``,
``encodings.py``): a shard is ``[samples: u32][offsets: u32 x (samples + 1)][its config as
JSON][samples]``; a sample is the byte sizes (u32) of its variable-size columns, then each
column's bytes, columns in name order. A column here is ``ndarray:int32`` (fixed dtype, shape
per sample): ``[ndim << 2 | shape dtype code][shape][values]``, the shape in the smallest
unsigned type that holds it. ``index.json`` lists every shard with its config, sample count and
byte size; the reader checks sizes, and no hashes are written (streaming's default).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.io.formats.base import OutputFormat, Written, read_bytes
from transforms.io.formats.rows import CountedRows, write_offset_table

ENCODING = "ndarray:int32"
INDEX_VERSION = 2
# the shape's dtype code by the largest value it holds (streaming's NDArray._shape_dtype2int)
SHAPE_DTYPES = ((1 << 8, np.uint8, 0), (1 << 16, np.uint16, 1), (1 << 32, np.uint32, 2))


def encode_array(values: np.ndarray) -> bytes:
    """One 1-D int32 array as an ``ndarray:int32`` column."""
    for bound, dtype, code in SHAPE_DTYPES:
        if len(values) < bound:
            return bytes([(1 << 2) | code]) + dtype(len(values)).tobytes() + values.tobytes()
    raise ValueError(f"an array of {len(values):,} values is too long for a shard")


def encode_sample(row: Sequence[np.ndarray]) -> bytes:
    """A sample: the byte sizes of its (all variable-size) columns, then the columns."""
    encoded = [encode_array(values) for values in row]
    return np.array([len(e) for e in encoded], np.uint32).tobytes() + b"".join(encoded)


def shard_config(columns: Sequence[str]) -> dict:
    """The writer configuration a shard carries and its index entry repeats."""
    names = sorted(columns)
    return {"column_encodings": [ENCODING] * len(names), "column_names": names,
            "column_sizes": [None] * len(names), "compression": None, "format": "mds",
            "hashes": [], "size_limit": None, "version": INDEX_VERSION}


class MDS(OutputFormat):
    name = "mds"
    index_name = "index.json"

    def suffix(self, base: str) -> str:
        return ".mds"

    def write(self, path: str, base: str, tables: Iterable[pa.Table], rows: int,
              columns: Sequence[str], vocab_size: int) -> Written:
        config = shard_config(columns)
        counted = CountedRows(tables, config["column_names"])
        with FileSystems.create(path) as handle:
            size = write_offset_table(handle, map(encode_sample, counted), rows,
                                      json.dumps(config, sort_keys=True).encode(), path)
        entry = {**config, "samples": rows, "zip_data": None,
                 "raw_data": {"basename": FileSystems.split(path)[1], "bytes": size,
                              "hashes": {}}}
        return Written(rows, counted.tokens, entry)

    def rows(self, path: str) -> int:
        return int(np.frombuffer(read_bytes(path, 4), np.uint32)[0])

    def folder_index(self, entries: Sequence[Mapping]) -> dict:
        return {"version": INDEX_VERSION, "shards": list(entries)}
