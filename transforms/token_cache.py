"""Token ids computed in deduplication's first pass, kept on storage for the main pass.

The first pass spends its time on one core (quality rules and MinHash in Python), the main
pass waits for the tokenizer. So the first pass also tokenizes the documents it keys, in the
background (tiktoken and the Hugging Face backend release the GIL), and writes one file per
chunk; the main pass takes a document's ids from that file and encodes only what it does not
find. Entries are found by the 128-bit hash of the normalised text (``text_hash``), never by
position, so a missing, stale or partial file costs time, not correctness. The files live in
the run's staging directory and go with it at the end.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.quality import text_hash
from transforms.writers import read_arrow, write_arrow

_DIGEST = pa.binary(16)


def cache_path(cache_dir: str, chunk_id: str) -> str:
    name = hashlib.sha256(chunk_id.encode("utf-8")).hexdigest()[:24]
    return FileSystems.join(cache_dir, f"{name}.arrow")


def write_tokens(path: str, digests: Sequence[bytes], arrays: Sequence[np.ndarray]) -> None:
    """One Arrow IPC file: each document's text hash and its int32 token ids."""
    lengths = np.fromiter(map(len, arrays), dtype=np.int32, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int32)
    write_arrow(path, pa.table({
        "digest": pa.array(digests, _DIGEST),
        "tokens": pa.ListArray.from_arrays(offsets, values.astype(np.int32))}))


def read_tokens(path: str) -> dict[bytes, np.ndarray]:
    """The file's ids by text hash; empty when there is no file."""
    if not FileSystems.exists(path):
        return {}
    table = read_arrow(path)
    tokens = table.column("tokens").combine_chunks()
    values = tokens.values.to_numpy()
    offsets = tokens.offsets.to_numpy()
    return {digest: values[start:end] for digest, start, end in
            zip(table.column("digest").to_pylist(), offsets[:-1], offsets[1:], strict=True)}


def lookup(cached: dict[bytes, np.ndarray], texts: Sequence[str]) -> list[np.ndarray | None]:
    """Each text's cached ids, or None."""
    if not cached:
        return [None] * len(texts)
    return [cached.get(text_hash(text)) for text in texts]
