"""Faults: a step that crashes mid-bundle is retried by the runner, and nothing is doubled.

Beam's BundleBasedDirectRunner retries a failed bundle (as Dataflow does); every kind of chunk
step and the staging writer are made to fail once, after doing their work (the staging writer
after it has already written its file). The output must equal a clean run's, file for file.
"""

import json

import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import EXAMPLES
from transforms.core import steps
from transforms.io import writers

INPUTS = [f"--input={EXAMPLES}/{name}" for name in (
    "c4_sample.jsonl", "alpaca_seed_tasks.json", "sharegpt_sample.json", "broken_lines.jsonl")]
KINDS = ("pretrain", "sft", "rejected")


def run_into(output, *extra):
    run([*INPUTS, f"--output={output}", "--block_size=512", "--num_shards=2",
         "--chunk_records=64", *extra])


def fail_once(method, seen: set):
    def flaky(self, element, *side_inputs):
        # The work is done and its outputs may be written...
        results = list(method(self, element, *side_inputs))
        if type(self) not in seen:
            seen.add(type(self))
            raise RuntimeError(f"injected fault in {type(self).__name__}")  # ...then it dies
        yield from results

    return flaky


@pytest.fixture
def flaky_steps(monkeypatch):
    seen: set = set()
    monkeypatch.setattr(steps.ChunkStep, "process", fail_once(steps.ChunkStep.process, seen))
    monkeypatch.setattr(writers.StagePart, "process", fail_once(writers.StagePart.process, seen))
    return seen


def test_retried_bundles_give_the_same_files_as_a_clean_run(tmp_path, flaky_steps):
    run_into(tmp_path / "flaky", "--runner=BundleBasedDirectRunner")
    # The faults really fired: in classification, both branches' steps and the writer.
    assert {t.__name__ for t in flaky_steps} >= {"_Classify", "TokenizeDocuments",
                                                  "PackSequences", "StagePart"}
    clean = tmp_path / "clean"
    run_into(clean, "--direct_running_mode=in_memory")  # each step already failed its once
    flaky, clean_manifest = tmp_path / "flaky", json.loads((clean / "manifest.json").read_text())
    assert json.loads((flaky / "manifest.json").read_text())["records"] == clean_manifest["records"]
    for kind in KINDS:
        mine = sorted((flaky / kind).iterdir())
        theirs = sorted((clean / kind).iterdir())
        assert [p.name for p in mine] == [p.name for p in theirs]
        for a, b in zip(mine, theirs, strict=True):
            if a.suffix == ".parquet":
                assert pq.read_table(a).equals(pq.read_table(b)), a.name
            else:
                assert a.read_text() == b.read_text(), a.name
