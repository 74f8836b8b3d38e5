"""Boilerplate across documents: a long paragraph that many documents share stays in the first
of them, by the run's order, and leaves all the others.

The functions are tested on their own; then one run of the real pipeline on C4 pages with a
cookie notice and a licence footer planted in many of them, across two inputs and many chunks,
next to a short paragraph every page holds and a long one only two pages hold (both left
alone), and a page made almost only of boilerplate (filtered).
"""

import json

import pyarrow.parquet as pq
import pytest

from beam_pipeline.running import run
from tests.conftest import SHARED_DATA, require_shared_data
from transforms.core.vocabulary import BOILERPLATE_TOO_SHORT
from transforms.knowledge.dedup.config import BoilerplateConfig
from transforms.knowledge.dedup.decisions import ChunkDecisions, write_decisions
from transforms.knowledge.dedup.paragraphs import (
    chunk_rows,
    keepers_in_bucket,
    remove_units,
    rows_by_bucket,
)
from transforms.knowledge.dedup.units import unit_hash, unit_hashes
from transforms.knowledge.normalize import normalize_text
from transforms.knowledge.quality import quality_reason

require_shared_data()

C4 = SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl"
COOKIES = ("We use cookies to personalise content and ads, to provide social media features and "
           "to analyse our traffic. By continuing to browse this site you agree to our use of "
           "cookies.")
LICENCE = ("Except where otherwise noted, content on this site is licensed under a Creative "
           "Commons Attribution 4.0 International licence.")
SHORT = "Share this article with your friends."  # in every page, under 100 characters
RARE = ("The author thanks the volunteers of the county historical society for their help with "
        "the archive photographs.")  # long, but in two pages only
ENDOFTEXT = "<|endoftext|>"
CONFIG = BoilerplateConfig()


def test_a_unit_is_hashed_with_its_spacing_collapsed_and_only_when_long_enough():
    assert unit_hash(COOKIES, 100) == unit_hash(COOKIES.replace(" ", "  \n "), 100) is not None
    assert unit_hash(SHORT, 100) is None
    assert unit_hash(SHORT, len(SHORT)) is not None
    assert unit_hash(COOKIES, 100) != unit_hash(LICENCE, 100)


def test_units_are_paragraphs_and_with_lines_also_long_lines():
    text = f"Title\n\n{COOKIES}\n\n{SHORT}\n{LICENCE}"
    assert unit_hashes(text, CONFIG) == {unit_hash(COOKIES, 100),
                                         unit_hash(f"{SHORT}\n{LICENCE}", 100)}
    lines = BoilerplateConfig(lines=True)
    assert unit_hashes(text, lines) == unit_hashes(text, CONFIG) | {unit_hash(LICENCE, 100)}


def test_a_removed_paragraph_takes_one_break_with_it():
    cookies = unit_hash(COOKIES, 100)
    remove = {cookies}.__contains__
    assert remove_units(f"Body one.\n\n{COOKIES}\n\nBody two.", CONFIG, remove).text == (
        "Body one.\n\nBody two.")
    removal = remove_units(f"{COOKIES}\n \n\nBody.", CONFIG, remove)
    assert (removal.text, removal.paragraphs, removal.lines) == ("Body.", 1, 0)
    assert remove_units(f"Body.\n\n{COOKIES}", CONFIG, remove).text == "Body."
    kept = f"Body.\n\n{LICENCE}"
    assert remove_units(kept, CONFIG, remove).text is kept  # nothing to remove: untouched


def test_with_lines_a_long_line_goes_and_the_rest_of_its_paragraph_stays():
    lines = BoilerplateConfig(lines=True)
    text = f"Body.\n\nMenu\n{LICENCE}\nMore text here."
    removal = remove_units(text, lines, {unit_hash(LICENCE, 100)}.__contains__)
    assert (removal.text, removal.paragraphs, removal.lines) == (
        "Body.\n\nMenu\nMore text here.", 0, 1)
    assert remove_units(text, CONFIG, {unit_hash(LICENCE, 100)}.__contains__).text is text


def test_a_unit_in_enough_documents_is_kept_by_the_first_and_named_to_every_chunk():
    cookies, licence = unit_hash(COOKIES, 100), unit_hash(LICENCE, 100)
    chunks = {
        11: chunk_rows([((0, 0, 50), {cookies, licence}), ((0, 0, 60), {cookies})], 11),
        22: chunk_rows([((0, 0, 10), {cookies}), ((1, 0, 0), {licence})], 22),
    }
    buckets = {}
    for packed in chunks.values():
        for bucket, rows in rows_by_bucket(packed, 2):
            buckets.setdefault(bucket, []).append(rows)
    found = {}
    for bucket in buckets.items():
        for chunk, keepers in keepers_in_bucket(bucket, 3):
            found.setdefault(chunk, set()).update(keepers)
    # cookies: 3 documents, the first at position 10 of chunk 22; licence: 2, not enough
    assert found == {11: {(cookies, (0, 0, 10))}, 22: {(cookies, (0, 0, 10))}}
    assert not [found for bucket in buckets.items() for found in keepers_in_bucket(bucket, 4)]


def test_a_chunks_file_holds_its_drops_and_its_units(tmp_path):
    drop = ((0, 0, 7, 5, b"d" * 16), "duplicate_exact", (0, 0, 3, 5, b"d" * 16))
    units = [(2**63 + 5, (0, 1, 2)), (7, (1, 0, 0))]
    found = ChunkDecisions.read(write_decisions(5, [drop], units, str(tmp_path)))
    assert found.drops == {(0, 0, 7): (b"d" * 16, "duplicate_exact", (0, 0, 3))}
    assert found.units == {2**63 + 5: (0, 1, 2), 7: (1, 0, 0)}
    only_units = ChunkDecisions.read(write_decisions(6, [], units, str(tmp_path)))
    assert (only_units.drops, only_units.units) == ({}, found.units)


# ------------------------------------------------------------------ a run of the pipeline

COOKIE_PAGES = range(2, 22)  # of the first input: page 2 keeps the notice
LICENCE_PAGES = range(10, 30)  # page 10 keeps the footer
RARE_PAGES = (4, 5)
MORE_PAGES = 6  # the second input: every page carries both


def _page_texts() -> list[str]:
    """Real C4 pages that the quality rules keep, whole (they stay in one paragraph order)."""
    pages = [json.loads(line)["text"] for line in C4.read_text().splitlines()]
    return [page for page in pages
            if len(page.split()) >= 100 and quality_reason(normalize_text(page)) is None]


def _planted(page: str, *paragraphs: str) -> str:
    return "\n\n".join([page, *paragraphs])


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    pages = _page_texts()[:30 + MORE_PAGES]
    first, second = [], []
    for number, page in enumerate(pages[:30]):
        extra = [SHORT]
        if number in RARE_PAGES:
            extra.append(RARE)
        if number in COOKIE_PAGES:
            extra.insert(0, COOKIES)
        if number in LICENCE_PAGES:
            extra.append(LICENCE)
        first.append(_planted(page, *extra))
    mostly = f"Site menu\n\n{COOKIES}\n\n{LICENCE}"
    first.insert(25, mostly)
    second = [_planted(page, COOKIES, SHORT, LICENCE) for page in pages[30:]]
    folder = tmp_path_factory.mktemp("boilerplate")
    paths = []
    for name, texts in (("web.jsonl", first), ("more.jsonl", second)):
        path = folder / name
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        paths.append(path)
    output = folder / "out"
    return {"pages": pages, "paths": paths, "output": output,
            "manifest": _run(paths, output, "--write_filtered=true")}


def _run(paths: list, output, *extra: str) -> dict:
    # Small chunks, so a paragraph's documents are spread over many chunks; blocks far larger
    # than the corpus, so every document comes back whole from the tails.
    run([*(f"--input={path}" for path in paths), f"--output={output}", "--chunk_records=4",
         "--block_size=100000", "--remainder=pad", "--pii=off", *extra])
    return json.loads((output / "manifest.json").read_text())


def _blocks(output) -> list:
    return [row["input_ids"] for f in sorted((output / "pretrain").glob("*.parquet"))
            for row in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def documents(planted, qwen_tokenizer) -> list[str]:
    """The documents written, decoded from the pretraining blocks."""
    text = "".join(qwen_tokenizer.decode(row) for row in _blocks(planted["output"]))
    return [doc for doc in text.split(ENDOFTEXT) if doc]


def _holders(documents: list[str], paragraph: str) -> list[str]:
    return [doc for doc in documents if paragraph in doc]


def test_planted_boilerplate_stays_only_in_the_first_document_by_input_order(planted,
                                                                             documents):
    pages = planted["pages"]
    assert len(documents) == 30 + MORE_PAGES
    (cookies,) = _holders(documents, COOKIES)
    assert cookies.startswith(normalize_text(pages[COOKIE_PAGES[0]])[:200])
    (licence,) = _holders(documents, LICENCE)
    assert licence.startswith(normalize_text(pages[LICENCE_PAGES[0]])[:200])
    assert len(_holders(documents, SHORT)) == len(documents)  # too short to count
    assert len(_holders(documents, RARE)) == len(RARE_PAGES)  # in too few documents


def test_a_page_of_boilerplate_is_filtered_with_its_reason(planted):
    output, manifest = planted["output"], planted["manifest"]
    filtered = [json.loads(line) for f in sorted((output / "filtered").glob("*"))
                for line in f.read_text().splitlines()]
    assert [(row["reason"], row["source"].endswith("web.jsonl")) for row in filtered] == [
        (BOILERPLATE_TOO_SHORT, True)]
    assert manifest["knowledge"]["dropped"] == {BOILERPLATE_TOO_SHORT: 1}


def test_the_manifest_counts_what_was_removed_and_every_record(planted):
    manifest = planted["manifest"]
    records = manifest["records"]
    assert records["balanced"] and records["read"] == 31 + MORE_PAGES
    assert records["knowledge"] == 30 + MORE_PAGES
    # Every holder but the first, apart from the filtered page; each paragraph with its break.
    cookies = len(COOKIE_PAGES) - 1 + MORE_PAGES
    licence = len(LICENCE_PAGES) - 1 + MORE_PAGES
    assert manifest["knowledge"]["boilerplate"] == {
        "documents_changed": len(set(COOKIE_PAGES) | set(LICENCE_PAGES)) - 1 + MORE_PAGES,
        "paragraphs_removed": cookies + licence,
        "lines_removed": 0,
        "chars_removed": cookies * (len(COOKIES) + 2) + licence * (len(LICENCE) + 2),
    }


def test_two_worker_processes_write_the_same_rows(planted, tmp_path):
    other = _run(planted["paths"], tmp_path / "multi", "--direct_running_mode=multi_processing",
                 "--direct_num_workers=2")
    assert other["knowledge"] == planted["manifest"]["knowledge"]
    assert _blocks(tmp_path / "multi") == _blocks(planted["output"])
