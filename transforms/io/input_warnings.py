"""Warnings about an input whose numbers point to a configuration mistake that no single record
shows: an empty input, or an instruction input mapped onto the wrong column (a 0/1 label as the
response trains every example to answer one token). They go into ``manifest.json``, the summary
and the report; ``--strict`` turns them into a failed run."""

from __future__ import annotations

from collections.abc import Mapping

from transforms.core.lengths import SHORT_REPLY_TOKENS

MIN_EXAMPLES = 20  # fewer examples say too little about a mapping to warn
SHORT_REPLY_SHARE = 0.5  # most examples train on a one-token reply
MIN_TRAINED_SHARE = 0.03  # a few percent of tokens trained: the response is a sliver of each


class StrictWarningError(RuntimeError):
    """``--strict``: a run with warnings is not marked complete."""


def input_warnings(manifest: Mapping) -> list[str]:
    """One line per suspicious input, naming it and what to check."""
    warnings = []
    for entry in manifest["inputs"]:
        where = f"--input {entry['pattern']}" + (f" ({entry['name']})" if entry.get("name") else "")
        if entry["read"] == 0:
            warnings.append(f"{where} read 0 records (its files are empty)")
        sft = entry.get("tokenized", {}).get("instruction")
        if not sft or sft["records"] < MIN_EXAMPLES:
            continue
        short, examples = sft["short_replies"], sft["records"]
        if short / examples > SHORT_REPLY_SHARE:
            warnings.append(
                f"{where}: {short:,} of {examples:,} examples ({short / examples:.0%}) train on a "
                f"reply of at most {SHORT_REPLY_TOKENS} tokens; is the mapped response the "
                "right field?")
        if sft["tokens"] and sft["trained_tokens"] / sft["tokens"] < MIN_TRAINED_SHARE:
            warnings.append(
                f"{where}: only {sft['trained_tokens'] / sft['tokens']:.1%} of its "
                f"{sft['tokens']:,} tokens are trained; is the mapped response the right field?")
    return warnings


def check_strict(manifest: Mapping, strict: bool) -> None:
    if strict and manifest["warnings"]:
        raise StrictWarningError(
            "--strict: " + "; ".join(manifest["warnings"]) + ". The run is not marked complete "
            "(no manifest.json).")
