"""``--write_documents`` and ``--tokenize_only``: a record of every kept document, and a later
run that re-tokenizes it without curating again."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.options import config_from_options
from beam_pipeline.running import run
from tests.conftest import ROOT
from transforms.core.tokenizer import DEFAULT_TOKENIZER, end_of_text_id, load_tokenizer
from transforms.io.earlier_runs import earlier_run_files
from transforms.knowledge.document_records import DOCUMENT_SCHEMA, document_id

PLANTED = ("Our volunteers meet every Thursday evening in the library hall to plan the spring "
           "garden, share seeds and repair tools. Anyone who wants to help can write to "
           "maria.keller@gmail.com before the end of the month, and we will send the schedule "
           "with directions and a list of what to bring along.")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A curating run over real C4 documents and one planted document with an email address,
    with a validation split; then a tokenize-only run over its documents/."""
    folder = tmp_path_factory.mktemp("documents")
    source = folder / "docs.jsonl"
    lines = (ROOT / "examples" / "data" / "c4_sample.jsonl").read_text().splitlines()
    source.write_text("\n".join([*lines, json.dumps({"text": PLANTED})]) + "\n")
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
