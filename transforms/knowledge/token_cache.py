"""What deduplication's first pass learned of each document, kept on storage for the main pass.

The first pass judges every knowledge document by the quality rules and spends its time on one
core (the rules and MinHash in Python), while the main pass waited for the tokenizer and judged
again wherever a document reached another process than in the first pass (always on Dataflow;
half the time with two local workers). So the first pass writes, per chunk, each judged
document's verdict (the failed rule's reason code, or none) and, for the kept ones, the token
ids it encodes in the background (tiktoken and the Hugging Face backend release the GIL). It
also writes what normalisation and the personal-data scan made of the text (``Prepared``),
which the main pass would otherwise compute again. The main pass takes texts, verdicts and ids
from the chunk's file and computes only what it does not find. Entries are found by 128-bit
hashes of text (``text_hash``): verdicts and ids by the normalised text's, prepared texts by
the text's as read; never by position, so a missing, stale or partial file costs time, not
correctness. The files live in the run's staging directory and go with it at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from transforms.io.writers import read_arrow, write_arrow
from transforms.knowledge.quality import text_hash

_DIGEST = pa.binary(16)
_PII = pa.map_(pa.string(), pa.int32())


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What the text steps (normalisation, personal data) made of a document the first pass
    judged: ``source`` is the hash of its text as read, ``text`` the text they left (None when
    it is the text as read) and ``pii`` the spans found by kind, as ``Record.pii``."""

    source: bytes
    text: str | None = None
    pii: tuple[tuple[str, int], ...] = ()


def cache_path(cache_dir: str, chunk_id: str) -> str:
    name = hashlib.sha256(chunk_id.encode("utf-8")).hexdigest()[:24]
    return FileSystems.join(cache_dir, f"{name}.arrow")


def write_chunk(path: str, digests: Sequence[bytes], reasons: Sequence[str | None],
                arrays: Sequence[np.ndarray], prepared: Sequence[Prepared]) -> None:
    """One Arrow IPC file: each judged document's text hash, verdict, ``Prepared`` text and
    (kept documents, in order) token ids; a dropped document has no ids."""
    kept = iter(arrays)
    lengths = np.array([len(next(kept)) if reason is None else 0 for reason in reasons],
                       dtype=np.int32)
    offsets = np.zeros(len(reasons) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if len(arrays) else np.empty(0, dtype=np.int32)
    write_arrow(path, pa.table({
        "digest": pa.array(digests, _DIGEST),
        "reason": pa.array(reasons, pa.string()),
        "tokens": pa.ListArray.from_arrays(offsets, values.astype(np.int32)),
        "source": pa.array([p.source for p in prepared], _DIGEST),
        "text": pa.array([p.text for p in prepared], pa.large_string()),
        "pii": pa.array([list(p.pii) for p in prepared], _PII)}))


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


def read_prepared(path: str) -> dict[bytes, Prepared]:
    """What the text steps made of each document judged in the file's chunk, by the hash of
    its text as read; empty without a file."""
    table = _read(path, ["source", "text", "pii"])
    if table is None:
        return {}
    return {source: Prepared(source, text, tuple(pii)) for source, text, pii in
            zip(*(table.column(name).to_pylist() for name in ("source", "text", "pii")),
                strict=True)}


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
