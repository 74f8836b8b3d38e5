"""``--write_documents`` and ``--tokenize_only``: a record of every kept document, and a later
run that re-tokenizes it without curating again."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.options import config_from_options
from beam_pipeline.running import run
from tests.conftest import ROOT
from transforms.core.records import Record
from transforms.core.tokenizer import DEFAULT_TOKENIZER, end_of_text_id, load_tokenizer
from transforms.core.vocabulary import DUPLICATE_EXACT, DUPLICATE_NEAR
from transforms.io.earlier_runs import earlier_run_files
from transforms.knowledge.dedup.decisions import (
    DROPS,
    ChunkDecisions,
    CountCopies,
    WriteDecisions,
    decisions_path,
    write_decisions,
)
from transforms.knowledge.dedup.minhash import Node
from transforms.knowledge.document_records import COPY_REASONS, DOCUMENT_SCHEMA, document_id
from transforms.knowledge.quality import text_hash

PLANTED = ("Our volunteers meet every Thursday evening in the library hall to plan the spring "
           "garden, share seeds and repair tools. Anyone who wants to help can write to "
           "maria.keller@gmail.com before the end of the month, and we will send the schedule "
           "with directions and a list of what to bring along.")
COPIED = 2  # the C4 document that gets copies: twice as it is, once with a few words changed
EXACT_COPIES, NEAR_COPIES = 2, 1


def near_copy(text: str) -> str:
    """``text`` with three of its 400 words replaced: a near copy by MinHash, not an exact one."""
    words = text.split(" ")
    for position in (40, 160, 320):
        words[position] = "zebra"
    return " ".join(words)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A curating run over real C4 documents, copies of one of them and one planted document
    with an email address, with a validation split; then a tokenize-only run over its
    documents/."""
    folder = tmp_path_factory.mktemp("documents")
    source = folder / "docs.jsonl"
    lines = (ROOT / "examples" / "data" / "c4_sample.jsonl").read_text().splitlines()
    copied = json.loads(lines[COPIED])["text"]
    copies = [lines[COPIED]] * EXACT_COPIES + [json.dumps({"text": near_copy(copied)})]
    source.write_text("\n".join([*lines, json.dumps({"text": PLANTED}), *copies]) + "\n")
    first, second = folder / "first", folder / "second"
    run([f"--input={source}", f"--output={first}", "--write_documents=true",
         "--knowledge_validation=0.1", "--block_size=256"])
    run([f"--input={first / 'documents'}", f"--output={second}", "--write_documents=true",
         "--tokenize_only=true", "--block_size=256"])
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (first, second)]
    return source, first, second, manifests


def test_every_kept_document_is_recorded_with_exactly_the_text_it_was_tokenized_from(runs):
    source, first, _, (manifest, _) = runs
    documents = pq.read_table(first / "documents")
    held_out = pq.read_table(first / "validation" / "documents")
    assert documents.schema == DOCUMENT_SCHEMA
    assert documents.num_rows == manifest["knowledge"]["documents"] > 0
    assert held_out.num_rows == manifest["validation"]["knowledge"]["documents"] > 0
    assert sum(documents["tokens"].to_pylist()) == manifest["knowledge"]["tokens"]
    tokenizer = load_tokenizer(DEFAULT_TOKENIZER)
    eot = end_of_text_id(tokenizer)
    for row in documents.to_pylist():
        ids = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == [*ids, eot] and row["tokens"] == len(ids)
        assert row["id"] == document_id(row["source"], row["position"])
        assert row["source"] == str(source) and row["input"] == 0
        assert row["language"] == "en" and 0 < row["language_score"] <= 1
    ids = documents["id"].to_pylist() + held_out["id"].to_pylist()
    assert len(set(ids)) == len(ids)
    kept = documents.num_rows + held_out.num_rows
    assert kept + sum(manifest["records"]["filtered"].values()) == manifest["records"]["read"]


def test_a_documents_personal_data_and_measures_are_in_its_columns(runs):
    _, first, _, (manifest, _) = runs
    rows = [row for name in ("documents", "validation/documents")
            for row in pq.read_table(first / name).to_pylist()]
    planted = [row for row in rows if row["text"].startswith(PLANTED[:40])]
    assert len(planted) == 1 and "maria.keller" not in planted[0]["text"]
    assert planted[0]["pii"]["email"] == planted[0]["text"].count("<EMAIL>") == 1
    assert planted[0]["words"] == len(PLANTED.split())
    for row in rows:  # each document's count is what its text shows
        assert row["pii"]["email"] == row["text"].count("<EMAIL>")
        assert row["pii"]["phone"] == row["text"].count("<PHONE>")
        assert 0 < row["letter_share"] <= 1 and row["mean_word_length"] > 2
    # the manifest also counts documents the quality rules dropped after redaction
    found = manifest["personal_data"]["knowledge"]["by_kind"]
    assert 1 <= sum(row["pii"]["email"] for row in rows) <= found["email"]


def test_the_survivor_of_a_cluster_counts_the_copies_dropped_in_its_favour(runs):
    """The planted copies leave; the C4 document they copy is kept with their count, every
    other document counts none, and the counts add up to the manifest's duplicate drops."""
    source, first, _, (manifest, _) = runs
    rows = [row for name in ("documents", "validation/documents")
            for row in pq.read_table(first / name).to_pylist()]
    lines = source.read_bytes().split(b"\n")
    at = sum(len(line) + 1 for line in lines[:COPIED])  # the byte offset of its line
    (survivor,) = [row for row in rows if row["position"] == at]
    assert (survivor["duplicate_exact"], survivor["duplicate_near"]) == (EXACT_COPIES,
                                                                        NEAR_COPIES)
    assert not [row for row in rows if row is not survivor
                and (row["duplicate_exact"] or row["duplicate_near"])]
    dropped = manifest["knowledge"]["dropped"]
    assert {reason: sum(row[reason] for row in rows) for reason in COPY_REASONS} == {
        reason: dropped.get(reason, 0) for reason in COPY_REASONS}


def test_a_tokenize_only_run_gives_back_the_same_documents_token_for_token(runs):
    _, first, second, (manifest, again) = runs
    before, after = pq.read_table(first / "documents"), pq.read_table(second / "documents")
    assert after["text"].equals(before["text"])
    assert after["input_ids"].equals(before["input_ids"])
    assert again["records"]["read"] == before.num_rows
    assert not again["records"]["filtered"] and not again["records"]["rejected"]
    assert again["knowledge"]["tokens"] == manifest["knowledge"]["tokens"]
    assert again["config"]["knowledge"]["dedup"]["mode"] == "none"


def test_tokenize_only_refuses_filters_it_would_skip():
    with pytest.raises(ValueError, match="--tokenize_only skips"):
        config_from_options(PipelineOptions(["--input=x.jsonl", "--output=out",
                                             "--tokenize_only=true", "--languages=en"]))


def test_an_earlier_runs_documents_are_found_for_overwrite(tmp_path):
    ours = tmp_path / "validation" / "documents" / "part-00000-of-00001.parquet"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"x")
    assert earlier_run_files(str(tmp_path)) == [str(ours)]


# ------------------------------------------------------------- copies counted per survivor

def node(position: int, chunk: int, text: str = "kept") -> Node:
    return (0, 0, position, chunk, text_hash(text))


SURVIVOR, OTHER = node(3, chunk=7), node(50, chunk=8, text="other")
COPIES = [  # (copy, reason, survivor): in the survivor's chunk and in others
    (node(10, 7), DUPLICATE_EXACT, SURVIVOR),
    (node(20, 9), DUPLICATE_EXACT, SURVIVOR),
    (node(30, 9, "kept, nearly"), DUPLICATE_NEAR, SURVIVOR),
    (node(60, 9, "other"), DUPLICATE_EXACT, OTHER),
]


def test_copies_are_counted_per_survivor_and_reason_and_keyed_by_its_chunk():
    with test_pipeline.TestPipeline() as p:
        found = p | beam.Create(COPIES) | CountCopies()
        assert_that(found, equal_to([(7, (SURVIVOR, DUPLICATE_EXACT, 2)),
                                     (7, (SURVIVOR, DUPLICATE_NEAR, 1)),
                                     (8, (OTHER, DUPLICATE_EXACT, 1))]))


def test_a_survivor_learns_its_copies_from_its_own_chunks_file(tmp_path):
    """Chunk 8 has no copy to drop, only a survivor: it gets a file all the same."""
    with test_pipeline.TestPipeline() as p:
        _ = {DROPS: p | beam.Create(COPIES)} | WriteDecisions(str(tmp_path))
    numbers = {"f": 0}
    decisions = {chunk: ChunkDecisions.read(decisions_path(str(tmp_path), chunk))
                 for chunk in (7, 8, 9)}
    assert [len(decisions[chunk].drops) for chunk in (7, 8, 9)] == [1, 0, 3]
    kept = decisions[7].credited(Record("f", 3, 0, "kept"), numbers)
    assert kept.duplicates == ((DUPLICATE_EXACT, 2), (DUPLICATE_NEAR, 1))
    assert decisions[8].credited(Record("f", 50, 0, "other"), numbers).duplicates == (
        (DUPLICATE_EXACT, 1),)
    # a document without copies, or a stale file's survivor (another text there), learns none
    assert decisions[7].credited(Record("f", 4, 0, "kept"), numbers).duplicates == ()
    assert decisions[7].credited(Record("f", 3, 0, "new"), numbers).duplicates == ()
    assert not decisions[9].survivors


def test_a_chunks_file_is_the_same_bytes_whatever_order_its_survivors_came_in(tmp_path):
    survivors = [(SURVIVOR, DUPLICATE_NEAR, 1), (OTHER, DUPLICATE_EXACT, 1),
                 (SURVIVOR, DUPLICATE_EXACT, 2)]
    written = [write_decisions(7, COPIES[:1], [], str(tmp_path / name), order)
               for name, order in (("a", survivors), ("b", survivors[::-1]))]
    assert Path(written[0]).read_bytes() == Path(written[1]).read_bytes()
