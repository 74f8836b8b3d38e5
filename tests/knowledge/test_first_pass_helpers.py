"""Deduplication's first pass keys large chunks' texts in helper processes: the same verdicts,
keys and units as in the calling process, and the same run outputs. Runs on the bundled
examples, without the shared datasets."""

import json
import os

import pyarrow.parquet as pq

from beam_pipeline.running import run
from tests.conftest import ROOT
from tests.support.helper_processes import heavy_modules_loaded_by, send_every_batch_to_helpers
from transforms.core import helpers
from transforms.knowledge.dedup.config import BoilerplateConfig, DedupConfig
from transforms.knowledge.dedup.text_keys import KeyTexts
from transforms.knowledge.quality import QualityConfig

C4 = ROOT / "examples" / "data" / "c4_sample.jsonl"
SHAKESPEARE = ROOT / "examples" / "data" / "tinyshakespeare_excerpt.txt"


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in C4.read_text().splitlines()]


def test_helpers_key_texts_as_the_calling_process_does(monkeypatch):
    texts = _texts()
    texts += [texts[0], texts[1].replace(".", ";", 3), "Too short."]  # a copy, a near copy
    key_texts = KeyTexts(QualityConfig(), DedupConfig(), BoilerplateConfig(min_chars=20))
    here = key_texts(texts)
    assert {keys.reason for keys in here} > {None}  # some texts fail a rule
    assert all(len(keys.bands) == 16 for keys in here if keys.reason is None)
    assert any(keys.units for keys in here)
    monkeypatch.setattr(helpers, "MIN_CHARS", 10_000)
    helpers.close_helpers()
    assert helpers.start_split(key_texts, texts, sum(map(len, texts)))() == here
    assert os.getpid() in helpers._POOLS  # the batch went to the helpers


def test_a_helper_keying_texts_loads_no_beam():
    assert heavy_modules_loaded_by("transforms.knowledge.dedup.text_keys") == []


def _run(output, crafted):
    run([f"--input={C4}", f"--input={SHAKESPEARE}#text_unit=paragraph", f"--input={crafted}",
         f"--output={output}", "--block_size=256", "--write_filtered=true",
         "--boilerplate_min_chars=40", "--direct_running_mode=in_memory"])
    manifest = json.loads((output / "manifest.json").read_text())
    return (pq.read_table(output / "pretrain"),
            [path.read_bytes() for path in sorted((output / "filtered").iterdir())],
            {key: manifest[key] for key in ("records", "knowledge", "personal_data")})


def test_a_run_whose_first_pass_keys_in_helpers_writes_the_same_rows(tmp_path, monkeypatch):
    texts = _texts()
    footer = "Subscribe to our newsletter for weekly updates on every new post here."
    crafted = tmp_path / "crafted.jsonl"
    pages = ["The harbour froze early that winter, and the ferry stopped running in December.",
             "Our garden club planted forty apple trees along the old railway path last spring.",
             "The museum reopened its east wing with a new hall of clocks and music boxes.",
             "Volunteers counted two hundred herons nesting on the island during the survey."]
    crafted.write_text("".join(json.dumps({"text": text}) + "\n" for text in
                           [texts[2], texts[3].replace(",", ";"),
                            *(f"{page}\n\n{footer}" for page in pages)]))
    monkeypatch.setattr(helpers, "_pool", lambda: None)
    here = _run(tmp_path / "here", crafted)
    knowledge = here[2]["knowledge"]
    assert knowledge["dropped"]["duplicate_exact"] >= 1  # the copy
    assert knowledge["boilerplate"]["paragraphs_removed"] >= 3  # the footer, in all but one
    monkeypatch.undo()
    batches = send_every_batch_to_helpers(monkeypatch, KeyTexts)
    in_helpers = _run(tmp_path / "helpers", crafted)
    assert os.getpid() in helpers._POOLS and batches and max(batches) > 1  # went to helpers
    assert in_helpers[0].equals(here[0])
    assert in_helpers[1:] == here[1:]
