"""How each trainer reads the extra formats a run wrote.

The manifest keeps the data (``formats.how_to_read``: paths relative to the output folder, so a
moved or uploaded folder still matches, and Megatron's per-shard weights); ``snippets`` renders
it, once, into the lines the run's summary prints and the dataset card shows, so the two cannot
disagree. The versions named are those whose layouts the writers follow.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping

from apache_beam.io.filesystems import FileSystems

from transforms.io.formats.base import PRETRAIN, SFT

# split name -> the folder prefix of its kinds (as ``SPLITS`` in this package's __init__)
SPLIT_FOLDERS = {"train": "", "validation": "validation/"}
MEGATRON_VERSION = "megatron-core 0.16.1"
NEMO_VERSION = "nemo-toolkit 2.7.3"
STREAMING_VERSION = "mosaicml-streaming 0.13.0"
LITDATA_VERSION = "litdata 0.2.76"
# Megatron normalizes the weights of --data-path itself; a shard's tokens make the blend draw
# every shard's tokens once per pass, as if the shards were one dataset.
MEGATRON_WEIGHTS = "tokens"


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One way in: a title saying which trainer and version, and the code (``language``)."""

    title: str
    language: str
    lines: tuple[str, ...]


def how_to_read(outputs: Mapping[str, list[Mapping]], formats: Iterable[str],
                seq_len: int) -> dict:
    """The manifest's ``formats.how_to_read``: per extra format written, per base kind and
    split, what its trainer is pointed at (files of a kind with no rows are left out)."""
    def names(kind: str) -> list[tuple[Mapping, str]]:
        return [(entry, f"{kind}/{FileSystems.split(entry['path'])[1]}")
                for entry in outputs.get(kind, [])]

    def by_split(fmt: str, base: str, value) -> dict:
        found = {split: value(f"{fmt}/{folder}{base}")
                 for split, folder in SPLIT_FOLDERS.items()}
        return {split: v for split, v in found.items() if v}

    found: dict[str, dict] = {}
    for fmt in formats:
        if fmt == "megatron":
            found[fmt] = {
                "weights": MEGATRON_WEIGHTS,
                PRETRAIN: by_split(fmt, PRETRAIN, lambda kind: [
                    [entry["tokens"], name[:-len(".bin")]] for entry, name in names(kind)]),
                SFT: by_split(fmt, SFT, lambda kind: [name for _, name in names(kind)]),
                "seq_len": seq_len}
        elif fmt in ("mds", "litdata"):
            found[fmt] = {base: by_split(fmt, base, lambda kind: kind if outputs.get(kind)
                                         else None) for base in (PRETRAIN, SFT)}
    return found


def snippets(found: Mapping[str, Mapping], root: str) -> list[Snippet]:
    """``how_to_read`` rendered with its paths under ``root`` (the output folder)."""
    def path(relative: str) -> str:
        return f"{root.rstrip('/')}/{relative}"

    rendered = []
    for fmt, entry in found.items():
        if fmt == "megatron":
            rendered += _megatron(entry, path, root)
        elif fmt == "mds":
            rendered += _streaming(entry, path, root)
        elif fmt == "litdata":
            rendered += _litdata(entry, path)
    return rendered


def _megatron(entry: Mapping, path: Callable[[str], str], root: str) -> list[Snippet]:
    found = []
    if entry[PRETRAIN]:
        found.append(_megatron_pretrain(entry[PRETRAIN], path))
    if "train" in entry[SFT]:
        found.append(_nemo_packs(entry[SFT], entry["seq_len"], path, root))
    return found


def _megatron_pretrain(splits: Mapping[str, list], path: Callable[[str], str]) -> Snippet:
    """Weights always precede the prefixes: Megatron reads an even-length list of bare
    prefixes as weight/prefix pairs."""
    def data_path(pairs: list) -> str:
        return " ".join(f"{tokens} {path(prefix)}" for tokens, prefix in pairs)

    if "validation" in splits:
        line = (f"--train-data-path {data_path(splits['train'])} "
                f"--valid-data-path {data_path(splits['validation'])}")
    else:
        line = f"--data-path {data_path(splits['train'])}"
    return Snippet(f"Megatron-LM / Megatron-Bridge pretraining ({MEGATRON_VERSION} indexed "
                   "dataset; weight = the shard's tokens, which Megatron normalizes)", "bash",
                   (line,))


def _nemo_packs(splits: Mapping[str, list], size: int, path: Callable[[str], str],
                root: str) -> Snippet:
    """NeMo loads one .npy per split: a split written as several shards is joined first."""
    joins, chosen = [], {}
    for split, files in splits.items():
        if len(files) == 1:
            chosen[split] = path(files[0])
            continue
        chosen[split] = f"{split}.npy"
        joins += [f"np.save({json.dumps(chosen[split])}, np.concatenate([np.load(p, "
                  "allow_pickle=True) for p in [",
                  *(f"    {json.dumps(path(name))}," for name in files),
                  "]]), allow_pickle=True)  # or rerun with --num_shards=1"]
    lines = [*(["import numpy as np", *joins] if joins else []),
             "from nemo.collections import llm",
             "from nemo.collections.llm.gpt.data.packed_sequence import PackedSequenceSpecs",
             f"data = llm.FineTuningDataModule(dataset_root={json.dumps(root)}, "
             f"seq_length={size}, micro_batch_size=1,",
             "    packed_sequence_specs=PackedSequenceSpecs(",
             f"        packed_sequence_size={size},",
             f"        packed_train_data_path={json.dumps(chosen['train'])},"]
    if "validation" in chosen:
        lines.append(f"        packed_val_data_path={json.dumps(chosen['validation'])},")
    lines.append("))")
    return Snippet(f"NeMo packed SFT ({NEMO_VERSION} GPTSFTPackedDataset; one .npy per split)",
                   "python", tuple(lines))


def _streaming(entry: Mapping, path: Callable[[str], str], root: str) -> list[Snippet]:
    """``local=`` for a local folder; a remote one is streamed into a local cache."""
    lines = ["from streaming import StreamingDataset"]
    for base, splits in entry.items():
        for split, folder in splits.items():
            where = (f"local={json.dumps(path(folder))}" if "://" not in root else
                     f"remote={json.dumps(path(folder))}, "
                     f"local={json.dumps('/tmp/mds-cache/' + folder)}")
            lines.append(f"{_name(base, split)} = StreamingDataset({where}, "
                         f"shuffle={split == 'train'})")
    return [Snippet(f"MosaicML Streaming / LLM Foundry / Composer ({STREAMING_VERSION} MDS)",
                    "python", tuple(lines))]


def _litdata(entry: Mapping, path: Callable[[str], str]) -> list[Snippet]:
    lines = ["from litdata import StreamingDataset"]
    for base, splits in entry.items():
        lines += [f"{_name(base, split)} = StreamingDataset({json.dumps(path(folder))}, "
                  f"shuffle={split == 'train'})" for split, folder in splits.items()]
    return [Snippet(f"LitData ({LITDATA_VERSION} optimized format)", "python", tuple(lines))]


def _name(base: str, split: str) -> str:
    return base if split == "train" else f"{base}_{split}"
