"""Deduplication across runs (``transforms/knowledge/dedup/index.py``): day 1 writes the index
of what it published; day 2, whose input repeats some of day 1's documents exactly, some as near
copies, and holds new ones, filters exactly the repeats as ``duplicate_earlier_run``, naming
the earlier run and document, whatever the runner mode and the order the indexes are given in."""

import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.options import config_from_options
from beam_pipeline.running import run
from tests.conftest import EXAMPLES
from tests.support.jsonl_files import filtered_rows, line_offsets, write_jsonl
from transforms.core.vocabulary import DUPLICATE_EARLIER_RUN, DUPLICATE_EXACT
from transforms.knowledge.document_records import document_id

C4 = [json.loads(line) for line in (EXAMPLES / "c4_sample.jsonl").read_text().splitlines()]
DAY1_A, DAY1_B, NEW = C4[:40], C4[40:70], C4[70:100]
EXACT_A, NEAR_A, EXACT_B = range(0, 8), range(8, 14), range(0, 5)  # repeated on day 2


def _near(text: str) -> str:
    """The same page with one word in the middle changed: far above the 0.8 threshold."""
    words = text.split(" ")
    words[len(words) // 2] = "altered"
    return " ".join(words)




@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("across")
    a, b = write_jsonl(base / "a.jsonl", DAY1_A), write_jsonl(base / "b.jsonl", DAY1_B)
    for name, path in (("a", a), ("b", b)):
        run([f"--input={path}", f"--output={base / name}", "--write_dedup_index=true",
             "--write_documents=true"])
    day2 = ([DAY1_A[i] for i in EXACT_A] + [{**DAY1_A[i], "text": _near(DAY1_A[i]["text"])}
                                             for i in NEAR_A]
            + [DAY1_B[i] for i in EXACT_B] + NEW + [NEW[0]])  # NEW[0] twice within the day
    inputs = write_jsonl(base / "day2.jsonl", day2)
    index_a, index_b = base / "a" / "dedup_index", base / "b" / "dedup_index"
    common = [f"--input={inputs}", "--write_filtered=true", "--write_dedup_index=true"]
    run([*common, f"--output={base / 'ab'}", f"--dedup_against={index_a},{index_b}"])
    run([*common, f"--output={base / 'ba'}", f"--dedup_against={index_b},{index_a}",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    return {"base": base, "a": a, "b": b, "day2": inputs, "index_a": index_a,
            "index_b": index_b}



def _table(output: Path, kind: str) -> list[dict]:
    return ds.dataset(output / kind, format="parquet").to_table().to_pylist()


def test_the_index_holds_exactly_the_documents_a_run_published(runs):
    for name in ("a", "b"):
        output = runs["base"] / name
        index = _table(output, "dedup_index")
        documents = _table(output, "documents")
        assert [row["id"] for row in index] == [row["id"] for row in documents]
        manifest = json.loads((output / "manifest.json").read_text())
        assert manifest["dedup_index"]["rows"]["knowledge"] == len(index) \
            == manifest["knowledge"]["documents"]
        assert all(len(row["bands"]) == 16 and len(row["signature"]) == 512 for row in index)
        assert {"text", "input_ids"}.isdisjoint(index[0])  # keys only


def test_day_two_filters_exactly_the_repeats_of_what_day_one_published(runs):
    output = runs["base"] / "ab"
    published = {name: {row["id"] for row in _table(runs["base"] / name, "documents")}
                 for name in ("a", "b")}
    offsets = {name: line_offsets(runs[name]) for name in ("a", "b")}
    day2 = line_offsets(runs["day2"])
    # Day 2's lines, in order: the exact and near repeats of a, the exact repeats of b, new.
    origins = ([("a", i) for i in EXACT_A] + [("a", i) for i in NEAR_A]
               + [("b", i) for i in EXACT_B])
    expected = {}
    for line, (name, i) in enumerate(origins):
        earlier_id = document_id(str(runs[name]), offsets[name][i])
        if earlier_id in published[name]:
            expected[day2[line]] = (earlier_id, runs[f"index_{name}"])
    assert len(expected) >= 15  # day 1 kept most of the repeated pages
    found = {row["position"]: row["message"] for row in filtered_rows(output)
             if row["reason"] == DUPLICATE_EARLIER_RUN}
    assert set(found) == set(expected)
    for position, (earlier_id, index) in expected.items():
        assert found[position] == (f"copy of document {earlier_id} of the earlier run "
                                   f"indexed at {index}")
    # New pages are judged by the usual rules only: the one given twice is an in-run copy.
    new_positions = set(day2[len(origins):])
    assert not new_positions & set(found)
    exact = [row for row in filtered_rows(output) if row["reason"] == DUPLICATE_EXACT]
    assert [row["position"] for row in exact] == [day2[-1]]
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["dedup_index"]["earlier_run_copies"] == {"knowledge": len(expected),
                                                             "instruction": 0}
    assert manifest["records"]["balanced"]


def test_rows_do_not_depend_on_the_runner_or_the_order_of_the_indexes(runs):
    first, second = (runs["base"] / name for name in ("ab", "ba"))
    for kind in ("pretrain", "dedup_index"):
        assert _table(first, kind) == _table(second, kind), kind
    assert [(r["position"], r["reason"], r["message"]) for r in filtered_rows(first)] == [
        (r["position"], r["reason"], r["message"]) for r in filtered_rows(second)]


def _config(*argv):
    return config_from_options(PipelineOptions(["--input=x.jsonl", "--output=o", *argv]))


def test_an_index_that_is_missing_incomplete_or_incomparable_is_refused(runs, tmp_path):
    with pytest.raises(ValueError, match="no index files"):
        _config(f"--dedup_against={tmp_path}")
    with pytest.raises(ValueError, match="--dedup_num_perm"):
        _config(f"--dedup_against={runs['index_a']}", "--dedup_num_perm=64", "--dedup_bands=8")
    with pytest.raises(ValueError, match="need deduplication on"):
        _config(f"--dedup_against={runs['index_a']}", "--dedup=none")
    copy = tmp_path / "copy" / "dedup_index"
    copy.mkdir(parents=True)
    for path in runs["index_a"].glob("*.parquet"):
        (copy / path.name).write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match=r"manifest\.json is missing"):
        _config(f"--dedup_against={copy}")
    assert _config(f"--dedup_against={runs['index_a']}").knowledge.dedup_against == (
        str(runs["index_a"]),)
