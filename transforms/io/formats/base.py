"""What every output format beside Parquet provides to the writer, the manifest and the
ownership rules: one file (or a pair) per planned shard, its rows read back from its header,
and the small index a folder may need once all its shards exist."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

PRETRAIN = "pretrain"
SFT = "sft"
DEDUP_INDEX = "dedup_index"  # --write_dedup_index: what a later run deduplicates against
DOCUMENTS = "documents"  # staged only for Megatron: one row per pretraining document


@dataclasses.dataclass(frozen=True)
class Written:
    """What one shard holds: rows, tokens (``input_ids``), and the entry its folder's index
    lists (MDS, LitData), which travels in the manifest's file list."""

    rows: int
    tokens: int
    entry: dict | None = None


class OutputFormat:
    """One trainer's layout. ``sources`` maps each base kind (``pretrain``, ``sft``) to the
    staged kind its rows come from; ``suffix`` ends a shard's main file name."""

    name = ""
    sources: Mapping[str, str] = {PRETRAIN: PRETRAIN, SFT: SFT}
    index_name: str | None = None  # a folder-wide index, written once its shards exist

    def suffix(self, base: str) -> str:
        raise NotImplementedError

    def companions(self, path: str) -> list[str]:
        """Files written beside ``path`` for the same shard (Megatron's ``.idx``)."""
        return []

    def write(self, path: str, base: str, tables: Iterable[pa.Table], rows: int,
              columns: Sequence[str], vocab_size: int) -> Written:
        """Writes the ``rows`` rows of ``tables`` (their ``columns``) as one shard."""
        raise NotImplementedError

    def rows(self, path: str) -> int:
        """The rows a written shard holds, read from its header."""
        raise NotImplementedError

    def folder_index(self, entries: Sequence[Mapping]) -> dict | None:
        """The folder's index from its shards' entries, in shard order."""
        return None


def read_bytes(path: str, length: int, offset: int = 0) -> bytes:
    with FileSystems.open(path) as handle:
        if offset:
            handle.seek(offset)
        return handle.read(length)
