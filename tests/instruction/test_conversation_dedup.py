"""Deduplication of conversations (``--instruction_dedup``, ``transforms/instruction/dedup.py``):
planted exact copies, copies that differ only in case and spacing, and near copies across two
inputs are dropped with their reasons, the first by input order surviving; an earlier run's
index wins over this run; decontamination is counted beside it."""

import json

import pyarrow.dataset as ds
import pytest

from beam_pipeline.running import run
from tests.conftest import EXAMPLES
from tests.support.jsonl_files import filtered_rows, line_offsets, write_jsonl
from transforms.core.vocabulary import (
    CONTAMINATED,
    DUPLICATE_EARLIER_RUN,
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.dedup import conversation_text

ROWS = [json.loads(line) for line in (EXAMPLES / "gsm8k_sample.jsonl").read_text().splitlines()]
FIRST, NEW = ROWS[:40], ROWS[40:60]
EXACT, SPACED, NEAR = range(0, 8), range(8, 12), range(12, 20)  # repeated in the second input
MAPPING = "#branch=instruction;prompt=question;response=answer"


def _second_input() -> list[dict]:
    spaced = [{**FIRST[i], "question": f"  {FIRST[i]['question'].upper()}\n"} for i in SPACED]
    near = []
    for i in NEAR:
        words = FIRST[i]["answer"].split(" ")
        words[len(words) // 2] = "perhaps"
        near.append({**FIRST[i], "answer": " ".join(words)})
    return [FIRST[i] for i in EXACT] + spaced + near + NEW





@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("conversations")
    first = write_jsonl(base / "first.jsonl", FIRST)
    second = write_jsonl(base / "second.jsonl", _second_input())
    evals = write_jsonl(base / "eval.jsonl", [{"question": NEW[0]["question"]}])
    both = [f"--input={first}{MAPPING}", f"--input={second}{MAPPING}", "--write_filtered=true"]
    run([*both, f"--output={base / 'near'}", "--instruction_dedup=near",
         f"--decontaminate={evals}#text=question", "--write_examples=true"])
    run([*both, f"--output={base / 'exact'}", "--instruction_dedup=exact",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    run([f"--input={first}{MAPPING}", f"--output={base / 'day1'}", "--instruction_dedup=near",
         "--write_dedup_index=true"])
    run([f"--input={second}{MAPPING}", f"--output={base / 'day2'}", "--instruction_dedup=near",
         f"--dedup_against={base / 'day1' / 'dedup_index'}", "--write_filtered=true"])
    return {"base": base, "first": first, "second": second}


def test_copies_are_dropped_with_their_reasons_and_the_first_survives(runs):
    output = runs["base"] / "near"
    first, second = line_offsets(runs["first"]), line_offsets(runs["second"])
    found = {row["position"]: row for row in filtered_rows(output)
             if str(runs["second"]) == row["source"]}
    exact = {second[n] for n in range(len(EXACT) + len(SPACED))}
    near = {second[len(EXACT) + len(SPACED) + n] for n in range(len(NEAR))}
    assert {p for p, r in found.items() if r["reason"] == DUPLICATE_EXACT} == exact
    assert {p for p, r in found.items() if r["reason"] == DUPLICATE_NEAR} == near
    # Each names its original in the first input.
    for n, position in enumerate(sorted(exact | near)):
        assert found[position]["message"] == (f"copy of the document at position {first[n]} "
                                               f"of {runs['first']} (input 0)")
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["instruction"]["dedup"] == {
        "mode": "near", "dropped": {DUPLICATE_EXACT: len(exact), DUPLICATE_NEAR: len(near)}}
    examples = ds.dataset(output / "sft_examples", format="parquet").count_rows()
    assert examples == len(FIRST) + len(NEW) - 1  # one new question is an evaluation item
    assert manifest["records"]["filtered"][CONTAMINATED] == 1
    assert manifest["records"]["balanced"]
    report = (output / "report.html").read_text()
    assert (f"conversations deduplicated (near), dropped as copies: {DUPLICATE_EXACT} "
            f"{len(exact)}, {DUPLICATE_NEAR} {len(near)}") in report
    assert "decontamination: 8-word n-grams" in report


def test_exact_mode_keeps_near_copies_on_any_runner(runs):
    manifest = json.loads((runs["base"] / "exact" / "manifest.json").read_text())
    assert manifest["instruction"]["dedup"]["dropped"] == {
        DUPLICATE_EXACT: len(EXACT) + len(SPACED)}
    assert manifest["instruction"]["examples"] == len(FIRST) + len(NEAR) + len(NEW)


def test_an_earlier_runs_conversations_win(runs):
    day1 = runs["base"] / "day1"
    index = ds.dataset(day1 / "dedup_index", format="parquet").to_table().to_pylist()
    assert {row["branch"] for row in index} == {"instruction"}
    assert len(index) == len(FIRST)
    assert json.loads((day1 / "manifest.json").read_text())["dedup_index"]["rows"] == {
        "knowledge": 0, "instruction": len(FIRST)}
    dropped = filtered_rows(runs["base"] / "day2")
    assert {row["reason"] for row in dropped} == {DUPLICATE_EARLIER_RUN}
    assert len(dropped) == len(EXACT) + len(SPACED) + len(NEAR)
    manifest = json.loads((runs["base"] / "day2" / "manifest.json").read_text())
    assert manifest["dedup_index"]["earlier_run_copies"]["instruction"] == len(dropped)
    assert all("of the earlier run indexed at" in row["message"] for row in dropped)


def test_the_normalised_text_keeps_roles_and_words_and_drops_case_and_spacing():
    conversation = Conversation((
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  What IS\n2+2?  "},
        {"role": "assistant", "content": "4", "tool_calls": [{"x": 1}]},
        {"role": "assistant", "content": None}))
    assert conversation_text(conversation) == "system: be brief. user: what is 2+2? assistant: 4"
    fullwidth = Conversation(({"role": "user", "content": "\uff21\uff22\uff23"},))
    assert conversation_text(fullwidth) == "user: abc"
