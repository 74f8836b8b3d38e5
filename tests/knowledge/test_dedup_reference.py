"""The knowledge branch's outputs on real data, held for every ``--dedup`` mode and both local
runner modes: the reference that deduplication's rewrites must keep (same kept document per
cluster, same dropped records with the same reasons and survivors, same manifest counts).

The inputs are the shared C4 pages, the Wikipedia articles one per line, the KLUE premises
(each appears three times: real exact copies) and a file made here of copies of C4 pages:
exact, edited, restyled, chains of edits and exact copies of near copies.
``tests/data/knowledge/dedup_reference.json`` holds, per mode, the dropped records (file name,
position, reason, message naming the survivor), a digest of every pretrain row and the
manifest's knowledge counts. It was written from the outputs of the code before the
rewrite (``DEDUP_REFERENCE_WRITE=1`` writes it again: only on purpose, after checking a diff),
with personal data left in place (``--pii=off``), which it predates.
"""

import hashlib
import json
import os
import re

import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import SHARED_DATA, TEST_DATA, require_shared_data
from tests.knowledge.test_dedup import edited, restyled
from transforms.core.vocabulary import DUPLICATE_EXACT, DUPLICATE_NEAR
from transforms.knowledge.dedup.config import MODES
from transforms.knowledge.normalize import normalize_text
from transforms.knowledge.quality import quality_reason

require_shared_data()

REFERENCE = TEST_DATA / "knowledge" / "dedup_reference.json"
C4 = SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl"
WIKI = SHARED_DATA / "pretrain" / "llamafactory_wiki_demo.txt"
KLUE = SHARED_DATA / "multilingual" / "ko_klue_nli_v1.1_dev.json"
RUNNER_MODES = {
    "in_memory": (),
    "multi_processing": ("--direct_running_mode=multi_processing", "--direct_num_workers=2"),
}
# Each multi_processing run takes about 20 s on two cores, so they run with -m slow;
# test_knowledge's multi_processing test checks the default (near) mode in every run.
RUNNER_PARAMS = [pytest.param(name, marks=[pytest.mark.slow] if name != "in_memory" else [])
                 for name in RUNNER_MODES]


def copies_of(pages: list[str]) -> list[str]:
    """Documents that copy C4 pages in the ways a crawl does. This file is input 0, so its
    copies survive and the C4 originals (input 1) are dropped: input order decides."""
    long_pages = [page for page in pages
                  if len(page.split()) >= 200 and quality_reason(normalize_text(page)) is None]
    a, b, c, d = long_pages[:4]
    once = edited(a, 2, seed=3)
    return [
        edited(b, 3, seed=4),
        once,  # a near copy of a
        edited(once, 2, seed=5),  # a near copy of the near copy: one cluster with a
        once,  # an exact copy of a near copy
        restyled(c),
        restyled(c) + "\n",  # exact copy once normalised
        d + "\r\n\r\n",
        edited(d, 1, seed=6),
    ]


@pytest.fixture(scope="module")
def values(tmp_path_factory) -> list[str]:
    pages = [json.loads(line)["text"] for line in C4.read_text().splitlines()]
    path = tmp_path_factory.mktemp("inputs") / "c4_copies.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in copies_of(pages)))
    return [str(path), str(C4), f"{WIKI}#text_unit=line",
            f"{KLUE}#branch=knowledge;text=premise"]


def outputs(output, manifest: dict) -> dict:
    """What the reference holds of one run; paths are cut to file names."""
    def name(text: str) -> str:
        return re.sub(r"/\S*/([^/\s]+)", r"\1", text)

    filtered = sorted(
        [name(row["source"]), row["position"], row["reason"], name(row["message"])]
        for f in sorted((output / "filtered").glob("*"))
        for row in map(json.loads, f.read_text().splitlines()))
    digest = hashlib.sha256()
    for f in sorted((output / "pretrain").glob("*.parquet")):
        for ids in pq.read_table(f, columns=["input_ids"]).column("input_ids").to_pylist():
            digest.update(json.dumps(ids).encode())
    know = manifest["knowledge"]
    return {"dropped": filtered, "pretrain_rows": digest.hexdigest(),
            "counts": {key: know[key] for key in ("records_in", "documents", "dropped",
                                                  "blocks", "tokens_out")}}


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {}


@pytest.mark.parametrize("runner_mode", RUNNER_PARAMS)
@pytest.mark.parametrize("mode", MODES)
def test_outputs_match_the_reference(mode, runner_mode, values, reference, tmp_path):
    output = tmp_path / "out"
    run([*(f"--input={value}" for value in values), f"--output={output}", f"--dedup={mode}",
         "--block_size=256", "--remainder=pad", "--num_shards=2", "--chunk_records=64",
         "--write_filtered=true", "--pii=off", *RUNNER_MODES[runner_mode]])
    found = outputs(output, json.loads((output / "manifest.json").read_text()))
    if os.environ.get("DEDUP_REFERENCE_WRITE") and runner_mode == "in_memory":
        REFERENCE.write_text(json.dumps({**reference, mode: found}, indent=1) + "\n")
        reference[mode] = found
    assert found == reference[mode]
    dropped = found["counts"]["dropped"]
    duplicates = [row for row in found["dropped"] if row[2] in (DUPLICATE_EXACT, DUPLICATE_NEAR)]
    assert len(duplicates) == dropped.get(DUPLICATE_EXACT, 0) + dropped.get(DUPLICATE_NEAR, 0)
    if mode == "none":
        assert not duplicates
    else:  # KLUE repeats each premise three times; copies of pages are found
        assert dropped[DUPLICATE_EXACT] >= 2000 + 2
        assert (mode == "near") == bool(dropped.get(DUPLICATE_NEAR))
