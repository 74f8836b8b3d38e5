"""manifest.json: what a run read, kept, dropped and wrote, and the proof that it all adds up."""

from __future__ import annotations

import collections
import datetime
import importlib.metadata
import json
from collections.abc import Iterable, Mapping

from apache_beam.io.filesystems import FileSystems

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
VERSIONED_PACKAGES = ("apache-beam", "pyarrow", "transformers", "tokenizers", "numpy",
                      "tensorflow-metadata", "jinja2")


def sum_counters(counters: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Adds per-chunk counters; a combine function, so it also accepts partial sums."""
    total: collections.Counter = collections.Counter()
    for counter in counters:
        total.update(counter)
    return dict(sorted(total.items()))


def _by_prefix(stats: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: v for k, v in sorted(stats.items()) if k.startswith(prefix)}


def build_manifest(stats: Mapping[str, int], files: Iterable[Mapping], config: Mapping,
                   tokenizer: Mapping) -> dict:
    """Lays the counters out for people and tools; ``records.balanced`` is the accounting check."""
    rejected = _by_prefix(stats, "rejected.")
    filtered = _by_prefix(stats, "filtered.")
    knowledge = _by_prefix(stats, "knowledge.")
    instruction = _by_prefix(stats, "instruction.")
    read = stats.get("records_read", 0)
    kept_documents = knowledge.get("documents", 0)
    kept_examples = instruction.get("examples", 0)
    accounted = kept_documents + kept_examples + sum(filtered.values()) + sum(rejected.values())
    packs = instruction.get("packs", 0)
    seq_len = config["instruction"]["seq_len"]
    outputs: dict[str, list] = collections.defaultdict(list)
    for entry in sorted(files, key=lambda f: f["path"]):
        outputs[entry["kind"]].append({"path": entry["path"], "rows": entry["rows"]})
    return {
        "format_version": FORMAT_VERSION,
        "complete": True,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "records": {
            "read": read,
            "knowledge": kept_documents,
            "instruction": kept_examples,
            "filtered": filtered,
            "rejected": rejected,
            "accounted": accounted,
            "balanced": accounted == read,
        },
        "knowledge": {
            "records_in": knowledge.get("records_in", 0),
            "documents": kept_documents,
            "dropped": _by_prefix(knowledge, "dropped."),
            "tokens": knowledge.get("tokens", 0),
            "document_tokens": {  # per kept document, without its end-of-text separator
                "min": knowledge.get("document_tokens_min"),
                "mean": (round(knowledge.get("tokens", 0) / kept_documents, 1)
                         if kept_documents else None),
                "max": knowledge.get("document_tokens_max"),
                "histogram": {f"<={bound}": count for bound, count in sorted(
                    (int(bound), count)
                    for bound, count in _by_prefix(knowledge, "document_tokens.le_").items())},
            },
            "separator_tokens": knowledge.get("separator_tokens", 0),
            "blocks": knowledge.get("blocks", 0),
            "block_size": config["knowledge"]["block_size"],
            "tokens_out": knowledge.get("tokens_out", 0),
            "remainder_policy": config["knowledge"]["remainder"],
            "remainder_tokens": knowledge.get("remainder_tokens", 0),
            "pad_tokens": knowledge.get("pad_tokens", 0),
        },
        "instruction": {
            "records_in": instruction.get("records_in", 0),
            "examples": kept_examples,
            "tokens": instruction.get("tokens", 0),
            "trained_tokens": instruction.get("trained_tokens", 0),
            "packs": packs,
            "seq_len": seq_len,
            "packing_efficiency": (round(instruction.get("tokens", 0) / (packs * seq_len), 6)
                                   if packs else None),
            # ceil(tokens / seq_len): no packing of these examples needs fewer rows.
            "packs_lower_bound": -(-instruction.get("tokens", 0) // seq_len),
            "overflow": config["instruction"].get("overflow"),
            "truncated": instruction.get("truncated", 0),
            "truncated_tokens": instruction.get("truncated_tokens", 0),
            "pad_tokens": instruction.get("pad_tokens", 0),
        },
        "inputs": _inputs(stats, config["inputs"]),
        "outputs": dict(outputs),
        "tokenizer": dict(tokenizer),
        "config": dict(config),
        "versions": package_versions(),
    }


def _inputs(stats: Mapping[str, int], inputs: Iterable[Mapping]) -> list[dict]:
    """Per ``--input``: records read and what left the pipeline, by reason."""
    return [
        {
            "pattern": spec["pattern"],
            "read": stats.get(f"input.{spec['index']}.read", 0),
            "rejected": _by_prefix(stats, f"input.{spec['index']}.rejected."),
            "filtered": _by_prefix(stats, f"input.{spec['index']}.filtered."),
        }
        for spec in inputs
    ]


def check_rows_written(manifest: Mapping) -> None:
    """Refuses to mark a run complete when the files hold fewer or more rows than the steps
    counted: a lost or doubled staged part must fail loudly, never pass as a smaller dataset."""
    records = manifest["records"]
    expected = {
        "pretrain": manifest["knowledge"]["blocks"],
        "sft": manifest["instruction"]["packs"],
        "rejected": sum(records["rejected"].values()),
    }
    if manifest["config"]["knowledge"].get("write_filtered"):
        expected["filtered"] = sum(records["filtered"].values())
    written = {kind: sum(f["rows"] for f in manifest["outputs"].get(kind, []))
               for kind in expected}
    wrong = {kind: (written[kind], n) for kind, n in expected.items() if written[kind] != n}
    if wrong:
        detail = ", ".join(f"{kind}: {w:,} rows written, {n:,} counted"
                           for kind, (w, n) in wrong.items())
        raise RowCountError(f"output files do not hold what the steps produced ({detail}); "
                            "the run is not marked complete (no manifest.json)")


class RowCountError(RuntimeError):
    """Rows were lost or doubled between the steps and the output files."""


def check_reject_fraction(manifest: Mapping, max_fraction: float) -> None:
    """Refuses to mark a run complete when an input's rejections point to a configuration
    mistake (a wrong mapping, format or branch), naming the input and its top reasons."""
    for entry in manifest["inputs"]:
        rejected = sum(entry["rejected"].values())
        if entry["read"] and rejected / entry["read"] > max_fraction:
            top = sorted(entry["rejected"].items(), key=lambda kv: -kv[1])[:3]
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in top)
            raise RejectRateError(
                f"{rejected:,} of {entry['read']:,} records of --input {entry['pattern']} were "
                f"rejected ({rejected / entry['read']:.0%} > --max_reject_fraction="
                f"{max_fraction}); top reasons: {reasons}. The run is not marked complete "
                "(no manifest.json); see rejected/ for the records.")


class RejectRateError(RuntimeError):
    """Too many records of one input were rejected."""


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def write_manifest(output_dir: str, manifest: Mapping) -> str:
    path = FileSystems.join(output_dir, MANIFEST_NAME)
    with FileSystems.create(path) as handle:
        handle.write(json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
    return path


def read_manifest(output_dir: str) -> dict:
    with FileSystems.open(FileSystems.join(output_dir, MANIFEST_NAME)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def summary_lines(manifest: Mapping) -> list[str]:
    """The short report printed at the end of a local run."""
    records, know, inst = manifest["records"], manifest["knowledge"], manifest["instruction"]
    efficiency = inst["packing_efficiency"]
    lines = [
        f"records read {records['read']:,}: knowledge {records['knowledge']:,}, "
        f"instruction {records['instruction']:,}, filtered {sum(records['filtered'].values()):,}, "
        f"rejected {sum(records['rejected'].values()):,} "
        f"({'balanced' if records['balanced'] else 'NOT BALANCED'})",
        f"pretrain: {know['documents']:,} of {know['records_in']:,} documents kept "
        f"({sum(know['dropped'].values()):,} filtered), {know['tokens']:,} tokens -> "
        f"{know['blocks']:,} blocks of {know['block_size']} "
        f"({know['remainder_tokens']:,} remainder tokens dropped, {know['pad_tokens']:,} padded)",
        f"sft: {inst['examples']:,} examples ({inst.get('truncated', 0):,} truncated, "
        f"{inst.get('truncated_tokens', 0):,} tokens cut), {inst['tokens']:,} tokens "
        f"({inst['trained_tokens']:,} trained) -> {inst['packs']:,} packs of <= {inst['seq_len']} "
        f"(lower bound {inst.get('packs_lower_bound', 0):,}), "
        f"efficiency {'n/a' if efficiency is None else f'{efficiency:.2%}'}"
        + (f", {inst['pad_tokens']:,} pad tokens" if inst.get("pad_tokens") else ""),
    ]
    for kind in ("rejected", "filtered"):
        if records[kind]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(records[kind].items(),
                                                                  key=lambda kv: -kv[1]))
            lines.append(f"{kind} by reason: {reasons}")
    for kind, files in manifest["outputs"].items():
        rows = sum(f["rows"] for f in files)
        lines.append(f"{kind}: {len(files)} file(s), {rows:,} rows under "
                     f"{FileSystems.split(files[0]['path'])[0]}")
    return lines
