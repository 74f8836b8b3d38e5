"""Output formats that other training stacks read as they are, written beside the Parquet files
by the same workers from the same staged rows (``--output_format``).

Each format's files of a kind go to ``OUTPUT/<format>/<kind>/``, cut like the Parquet files
(``--num_shards``, ``--target_shard_mb``) and named as they are, and the manifest lists them with
their rows and tokens. Parquet is always written: the manifest, report and card describe it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Mapping

from apache_beam.io.filesystems import FileSystems

from transforms.core.packing import PRETRAIN_SCHEMA, SFT_SCHEMA
from transforms.io.formats.base import (
    DEDUP_INDEX,
    DOCUMENTS,
    PRETRAIN,
    SFT,
    OutputFormat,
    Written,
)
from transforms.io.formats.litdata import LitData
from transforms.io.formats.mds import MDS
from transforms.io.formats.megatron import Megatron

PARQUET = "parquet"
STAGED_COLUMNS = {PRETRAIN: tuple(PRETRAIN_SCHEMA.names), SFT: tuple(SFT_SCHEMA.names),
                  DOCUMENTS: ("input_ids",)}
EXTRA_FORMATS: dict[str, OutputFormat] = {f.name: f for f in (Megatron(), MDS(), LitData())}
FORMAT_NAMES = (PARQUET, *EXTRA_FORMATS)
SPLITS = ("", "validation/")  # training rows, then the held-out split's

__all__ = ["DEDUP_INDEX", "DOCUMENTS", "EXTRA_FORMATS", "FORMAT_KINDS", "FORMAT_NAMES", "PARQUET",
           "FormatKind", "Written", "format_kinds", "parse_formats", "stages_documents",
           "write_folder_indexes"]


@dataclasses.dataclass(frozen=True)
class FormatKind:
    """One output kind of an extra format, e.g. ``mds/validation/sft``, and the staged kind
    whose rows it holds."""

    format: str
    base: str  # pretrain or sft
    split: str  # "" or "validation/"

    @property
    def kind(self) -> str:
        return f"{self.format}/{self.split}{self.base}"

    @property
    def source(self) -> str:
        return self.split + EXTRA_FORMATS[self.format].sources[self.base]

    @property
    def writer(self) -> OutputFormat:
        return EXTRA_FORMATS[self.format]

    @property
    def columns(self) -> tuple[str, ...]:
        """The staged rows' columns, all ``list<int32>``, as the format writes them."""
        return STAGED_COLUMNS[EXTRA_FORMATS[self.format].sources[self.base]]


def format_kinds(formats: Iterable[str]) -> tuple[FormatKind, ...]:
    """The output kinds of the extra formats among ``formats``, in a fixed order."""
    wanted = set(formats)
    return tuple(FormatKind(name, base, split) for name in EXTRA_FORMATS if name in wanted
                 for split in SPLITS for base in (PRETRAIN, SFT))


# every kind an extra format may write, e.g. ``mds/sft``, by name
FORMAT_KINDS: dict[str, FormatKind] = {k.kind: k for k in format_kinds(EXTRA_FORMATS)}


def parse_formats(value: str) -> tuple[str, ...]:
    """``--output_format``: comma-separated names; Parquet always comes first.

    >>> parse_formats("mds,megatron")
    ('parquet', 'megatron', 'mds')
    """
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in FORMAT_NAMES]
    if unknown:
        raise ValueError(f"unknown output format(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(FORMAT_NAMES)}")
    return tuple(name for name in FORMAT_NAMES if name == PARQUET or name in names)


def write_folder_indexes(files: Iterable[Mapping], output_dir: str) -> list[str]:
    """Writes the index of each format folder that needs one (MDS's and LitData's
    ``index.json``) from its shards' notes, in shard order, once every shard exists; returns
    the paths written relative to ``output_dir``."""
    entries: dict[str, list[tuple[str, dict]]] = collections.defaultdict(list)
    for note in files:
        if note["kind"] in FORMAT_KINDS and FORMAT_KINDS[note["kind"]].writer.index_name:
            entries[note["kind"]].append((note["path"], note["entry"]))
    written = []
    for kind, found in sorted(entries.items()):
        writer = FORMAT_KINDS[kind].writer
        relative = f"{kind}/{writer.index_name}"
        index = writer.folder_index([entry for _, entry in sorted(found)])
        with FileSystems.create(FileSystems.join(output_dir, relative)) as handle:
            handle.write(json.dumps(index, sort_keys=True).encode("utf-8"))
        written.append(relative)
    return written


def stages_documents(formats: Iterable[str]) -> bool:
    """Whether the knowledge branch must stage its documents (Megatron's pretraining layout)."""
    return any(kind.source.endswith(DOCUMENTS) for kind in format_kinds(formats))
