"""OUTPUT/README.md: a Hugging Face dataset card for a run's outputs.

Its YAML ``configs`` tell ``datasets`` where each part lives, so ``load_dataset(OUTPUT, "sft")``,
``"pretrain"`` and their ``validation`` splits work without knowing the folder layout
(https://huggingface.co/docs/hub/datasets-manual-configuration). The rest is the manifest's
facts a reader checks first: tokenizer, lengths, counts and the licences declared per input
with ``#license=...``. Plain Python, no extra dependency: the YAML is written with JSON-quoted
strings, which YAML reads as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from apache_beam.io.filesystems import FileSystems

from transforms.core.steps import base_kind
from transforms.io.formats.how_to_read import snippets
from transforms.io.manifest import read_manifest
from transforms.io.writers import CARD_NAME, CARD_TAG

CARD_ROOT = "path/to/this/folder"  # how the card's snippets name the folder it describes
# config name -> (split -> output kind); a split is listed only when its files exist.
# rejected/ and filtered/ are JSONL: `datasets` picks one file format for all of a card's
# configs, so they are not configs (the card says how to load them).
CONFIGS = {
    "pretrain": {"train": "pretrain", "validation": "validation/pretrain"},
    "sft": {"train": "sft", "validation": "validation/sft"},
}


def card_configs(manifest: Mapping) -> dict[str, dict[str, str]]:
    """config -> split -> file pattern relative to the output directory, for written parts
    (a kind written in partition folders, ``pretrain/language=en/``, by a pattern over them)."""
    patterns: dict[str, str] = {}
    for kind, files in manifest["outputs"].items():
        if files:
            base = base_kind(kind)
            patterns[base] = f"{base}/*.parquet" if base == kind else f"{base}/*/*.parquet"
    return {config: {split: patterns[kind] for split, kind in splits.items() if kind in patterns}
            for config, splits in CONFIGS.items()
            if splits["train"] in patterns}


def declared_licenses(manifest: Mapping) -> list[str]:
    return sorted({spec["license"] for spec in manifest["config"]["inputs"]
                   if spec.get("license")})


def _yaml_header(manifest: Mapping) -> str:
    q = json.dumps
    lines = ["---"]
    licenses = declared_licenses(manifest)
    undeclared = any(not spec.get("license") for spec in manifest["config"]["inputs"])
    if licenses:
        # The card's licence is every input's; "other" stands for inputs that declared none.
        names = licenses + (["other"] if undeclared and "other" not in licenses else [])
        lines.append("license:")
        lines += [f"- {q(name)}" for name in names]
    lines += ["task_categories:", f"- {q('text-generation')}",
              "tags:", f"- {q(CARD_TAG)}"]
    configs = card_configs(manifest)
    if configs:  # a run that wrote no rows has nothing to load
        lines.append("configs:")
    for config, splits in configs.items():
        lines += [f"- config_name: {q(config)}", "  data_files:"]
        for split, pattern in splits.items():
            lines += [f"  - split: {q(split)}", f"    path: {q(pattern)}"]
    lines.append("---")
    return "\n".join(lines)


def _md(value: object) -> str:
    """A table cell: pipes and newlines would break the row."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _format_section(formats: Mapping) -> list[str]:
    """The other trainers' formats the run wrote beside the Parquet files, and how each
    trainer reads them (the same snippets as the run's summary)."""
    found = snippets(formats.get("how_to_read", {}), CARD_ROOT)
    if not found:
        return []
    parts = ["## Other training stacks", "",
             f"Also written: {', '.join(f'`{f}/`' for f in formats['how_to_read'])}, the same "
             "rows in the layouts these trainers read (see `formats` in `manifest.json`).", ""]
    for snippet in found:
        parts += [f"{snippet.title}:", "", f"```{snippet.language}", *snippet.lines, "```", ""]
    return parts


def _quality_rows(manifest: Mapping) -> list[str]:
    """A row per ``--quality_model`` and branch: what it is, its mean score, what it filtered."""
    rows = []
    for branch, models in (manifest.get("quality_scores") or {}).items():
        for name, entry in models.items():
            mean = "n/a" if entry["mean"] is None else f"{entry['mean']:.4f}"
            cut = ("" if entry["min_score"] is None
                   else f"; {entry['filtered']:,} filtered under {entry['min_score']:g}")
            rows.append(f"| quality model `{_md(name)}` ({branch}) | {entry['kind']} "
                        f"`{_md(entry['path'])}`: {entry['scored']:,} scored, mean {mean}{cut} |")
    return rows


def build_card(manifest: Mapping) -> str:
    records, know, inst = manifest["records"], manifest["knowledge"], manifest["instruction"]
    tokenizer = manifest["tokenizer"]
    configs = card_configs(manifest)
    parts = [_yaml_header(manifest), "", "# Prepared training data", "",
             "Written by beam-llm-dataprep: pretraining blocks (`pretrain`) and packed SFT "
             "sequences with assistant-only loss masks (`sft`), as sharded Parquet. "
             "`manifest.json` holds every count; `report.html` shows the distributions.", "",
             "## Loading", "", "```python", "from datasets import load_dataset", ""]
    for config, splits in configs.items():
        for split in splits:
            parts.append(f"load_dataset({json.dumps(CARD_ROOT)}, {json.dumps(config)}, "
                         f"split={json.dumps(split)})")
    parts += ["```", "", "| config | split | files | rows |", "|---|---|---|---|"]
    for config, splits in configs.items():
        for split, pattern in splits.items():
            files = [f for kind, listed in manifest["outputs"].items()
                     if base_kind(kind) == CONFIGS[config][split] for f in listed]
            parts.append(f"| {config} | {split} | `{pattern}` ({len(files)}) | "
                         f"{sum(f['rows'] for f in files):,} |")
    parts += [
        "", "## Columns", "",
        f"- `pretrain`: `input_ids` (exactly {know['block_size']} token ids per row), "
        "`seq_lengths` (the lengths of the document pieces in the block) and `sources` (per "
        "piece, the index of the input it came from in `manifest.json`'s `inputs`; `-1` for "
        "padding).",
        f"- `sft`: `input_ids`, `labels` (`-100` where no loss: everything but assistant "
        "replies, and each segment's first token), `position_ids` (restart at 0 per example), "
        "`seq_lengths` (one per packed example) and `sources` (each example's input, as for "
        f"`pretrain`); at most {inst['seq_len']} tokens a row.",
        "- `rejected/*.jsonl` (not a config: JSON lines): the records that could not be used, "
        "with source, position, reason and the raw record; "
        '`load_dataset("json", data_files="rejected/*.jsonl")` reads them.', "",
        *_format_section(manifest.get("formats", {})),
        "## Facts", "",
        "| | |", "|---|---|",
        f"| tokenizer | {_md(tokenizer.get('name'))} (vocabulary {tokenizer.get('vocab_size')}, "
        f"sha256 `{str(tokenizer.get('vocab_sha256'))[:16]}`) |",
        f"| chat template sha256 | `{str(tokenizer.get('chat_template_sha256'))[:16]}` |",
        f"| records read | {records['read']:,} (every one accounted for: "
        f"{str(records['balanced']).lower()}) |",
        f"| pretrain | {know['documents']:,} documents, {know['tokens']:,} tokens -> "
        f"{know['blocks']:,} blocks of {know['block_size']} |",
        f"| sft | {inst['examples']:,} examples, {inst['trained_tokens']:,} trained tokens -> "
        f"{inst['packs']:,} packs of <= {inst['seq_len']} |",
        f"| filtered | {sum(records['filtered'].values()):,} |",
        *_quality_rows(manifest),
        f"| rejected | {sum(records['rejected'].values()):,} |",
        f"| created | {manifest.get('created_at', '')} |",
        "", "## Sources and licences", "",
        "| input | name | licence | records read |", "|---|---|---|---|"]
    licenses = {spec["index"]: spec.get("license") for spec in manifest["config"]["inputs"]}
    for index, entry in enumerate(manifest["inputs"]):
        parts.append(f"| `{_md(entry['pattern'])}` | {_md(entry.get('name') or '')} | "
                     f"{_md(licenses.get(index) or 'not declared')} | {entry['read']:,} |")
    parts += ["", "Licences are as declared with `--input PATTERN#license=ID`; check each "
              "source's own terms before use.", ""]
    return "\n".join(parts)


def write_card(output_dir: str) -> str:
    path = FileSystems.join(output_dir, CARD_NAME)
    with FileSystems.create(path) as handle:
        handle.write(build_card(read_manifest(output_dir)).encode("utf-8"))
    return path
