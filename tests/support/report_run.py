"""One pipeline run that uses everything the data report and the dataset card show: both
branches, rejected and filtered records, mixing by weight, validation splits, decontamination
and declared licences. It is made once per test session (on the bundled examples, so it needs no
shared data) and shared by tests/test_report.py and tests/test_dataset_card.py."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
from pathlib import Path

from beam_pipeline.running import run
from tests.conftest import EXAMPLES

E = EXAMPLES
INPUTS = (
    f"{E}/c4_sample.jsonl#branch=knowledge;name=web;license=odc-by",
    f"{E}/tinyshakespeare_excerpt.txt#branch=knowledge;text_unit=paragraph;name=books",
    f"{E}/alpaca_seed_tasks.json#branch=instruction;name=alpaca;weight=2;license=apache-2.0",
    f"{E}/sharegpt_sample.json#branch=instruction;name=sharegpt;weight=1;license=apache-2.0",
    f"{E}/toolcall_sample.json#branch=instruction;name=toolcall;weight=1;license=apache-2.0",
    f"{E}/gsm8k_sample.jsonl#branch=instruction;prompt=question;response=answer;name=gsm8k;"
    "weight=1;license=mit",
    f"{E}/broken_lines.jsonl#branch=knowledge",
)
EVAL_QUESTIONS = 20  # the first gsm8k questions, planted as an evaluation set


@dataclasses.dataclass(frozen=True)
class Run:
    output: Path
    manifest: dict
    printed: list[str]  # what the run printed: the summary, then the line naming the report


@functools.cache
def curated_run(base: Path) -> Run:
    """The run, made under ``base`` (the session's pytest temporary directory) once."""
    eval_set = base / "report-eval.jsonl"
    lines = (E / "gsm8k_sample.jsonl").read_text().splitlines()[:EVAL_QUESTIONS]
    eval_set.write_text("\n".join(lines) + "\n")
    output = base / "report-run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run([*(f"--input={value}" for value in INPUTS), f"--output={output}",
             f"--decontaminate={eval_set}#text=question",
             "--knowledge_validation=10", "--instruction_validation=0.1",
             "--max_reject_fraction=0.9",  # broken_lines.jsonl is mostly broken on purpose
             "--block_size=512", "--seq_len=1024", "--num_shards=2"])
    return Run(output, json.loads((output / "manifest.json").read_text()),
               printed.getvalue().splitlines())
