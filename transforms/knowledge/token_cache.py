"""What deduplication's first pass learned of each document, kept on storage for the main pass.

The first pass judges every knowledge document by the quality rules and spends its time on one
core (the rules and MinHash in Python), while the main pass waited for the tokenizer and judged
again wherever a document reached another process than in the first pass (always on Dataflow;
half the time with two local workers). So the first pass writes, per chunk, each judged
document's verdict (the failed rule's reason code, or none) and, for the kept ones, the token
ids it encodes in the background (tiktoken and the Hugging Face backend release the GIL). The
main pass takes verdicts and ids from the chunk's file and computes only what it does not find.
Entries are found by the 128-bit hash of the normalised text (``text_hash``), never by
position, so a missing, stale or partial file costs time, not correctness. The files live in
the run's staging directory and go with it at the end.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.quality import text_hash

_DIGEST = pa.binary(16)


def cache_path(cache_dir: str, chunk_id: str) -> str:
    name = hashlib.sha256(chunk_id.encode("utf-8")).hexdigest()[:24]
    return FileSystems.join(cache_dir, f"{name}.arrow")


def write_chunk(path: str, digests: Sequence[bytes], reasons: Sequence[str | None],
                arrays: Sequence[np.ndarray]) -> None:
    """One Arrow IPC file: each judged document's text hash, verdict and (kept documents, in
    order) token ids; a dropped document has no ids."""
    kept = iter(arrays)
    lengths = np.array([len(next(kept)) if reason is None else 0 for reason in reasons],
                       dtype=np.int32)
    offsets = np.zeros(len(reasons) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if len(arrays) else np.empty(0, dtype=np.int32)
    write_arrow(path, pa.table({
        "digest": pa.array(digests, _DIGEST),
        "reason": pa.array(reasons, pa.string()),
        "tokens": pa.ListArray.from_arrays(offsets, values.astype(np.int32))}))


def _read(path: str, columns: list[str]) -> pa.Table | None:
    if not FileSystems.exists(path):
        return None
    return read_arrow(path).select(columns)


def read_verdicts(path: str) -> dict[bytes, str | None]:
    """The quality verdict of each document judged in the file's chunk; empty without a file."""
    table = _read(path, ["digest", "reason"])
    if table is None:
        return {}
    return dict(zip(table.column("digest").to_pylist(), table.column("reason").to_pylist(),
                    strict=True))


def read_tokens(path: str) -> dict[bytes, np.ndarray]:
    """The ids of each kept document in the file, by text hash; empty without a file."""
    table = _read(path, ["digest", "reason", "tokens"])
    if table is None:
        return {}
    tokens = table.column("tokens").combine_chunks()
    values = tokens.values.to_numpy()
    offsets = tokens.offsets.to_numpy()
    return {digest: values[start:end] for digest, reason, start, end in
            zip(table.column("digest").to_pylist(), table.column("reason").to_pylist(),
                offsets[:-1], offsets[1:], strict=True) if reason is None}


def lookup(cached: dict[bytes, np.ndarray], texts: Sequence[str]) -> list[np.ndarray | None]:
    """Each text's cached ids, or None."""
    if not cached:
        return [None] * len(texts)
    return [cached.get(text_hash(text)) for text in texts]
