"""Classification rules, declared overrides, and the ClassifyRecords transform's outputs."""

import json

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import SHARED_DATA as SHARED
from tests.conftest import require_shared_data
from transforms.classify import ClassifyRecords, classify
from transforms.core.records import InputSpec, Record, RecordChunk, Rejection
from transforms.core.steps import PARTS, STATS
from transforms.core.vocabulary import (
    EMPTY_RECORD,
    INSTRUCTION,
    KNOWLEDGE,
    MALFORMED_JSON,
    MISSING_FIELD,
    NOT_AN_OBJECT,
    UNCLASSIFIABLE,
    WRONG_TYPE,
    Drop,
)

require_shared_data()


def spec(**declared) -> InputSpec:
    fields = tuple(sorted(declared.pop("fields", {}).items()))
    return InputSpec(index=0, pattern="x", fields=fields, **declared)


def record(value) -> Record:
    return Record(source="x.jsonl", position=7, input_index=0, value=value)


def first_line(path: str) -> dict:
    with open(f"{SHARED}/{path}", encoding="utf-8") as handle:
        return json.loads(handle.readline())


def first_element(path: str) -> dict:
    with open(f"{SHARED}/{path}", encoding="utf-8") as handle:
        return json.load(handle)[0]


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        (first_element("chat/kto_en_demo_messages.json"), "messages"),
        (first_element("chat/fastchat_dummy_conversation.json"), "sharegpt"),
        (first_element("chat/glaive_toolcall_en_demo.json"), "sharegpt"),
        (first_element("instruction/alpaca_en_demo.json"), "alpaca"),
        ({"prompt": "2+2?", "response": "4"}, "prompt_response"),
        ({"prompt": "2+2?", "completion": "4"}, "prompt_response"),
        (first_line("preference/hh_rlhf_harmless_base_test.jsonl"), "transcript"),
    ],
)
def test_instruction_formats_are_detected(value, fmt):
    branch, routed = classify(record(value), spec())
    assert (branch, routed.format) == (INSTRUCTION, fmt)


def test_text_documents_and_plain_text_go_to_knowledge():
    doc = first_line("pretrain/llamafactory_c4_demo.jsonl")
    branch, routed = classify(record(doc), spec())
    assert (branch, routed.value, routed.format) == (KNOWLEDGE, doc["text"], "text")
    branch, routed = classify(record("A whole text file."), spec())
    assert (branch, routed.value) == (KNOWLEDGE, "A whole text file.")


def test_unknown_shapes_are_rejected_as_unclassifiable():
    result = classify(record(first_line("math/gsm8k_test.jsonl")), spec())
    assert isinstance(result, Rejection)
    assert result.reason == UNCLASSIFIABLE
    assert (result.source, result.position) == ("x.jsonl", 7)
    assert "question" in result.message


def test_declared_mapping_routes_gsm8k_to_instruction():
    row = first_line("math/gsm8k_test.jsonl")
    declared = spec(branch=INSTRUCTION, fields={"prompt": "question", "response": "answer"})
    branch, routed = classify(record(row), declared)
    assert branch == INSTRUCTION
    assert routed.format == "prompt_response"
    assert routed.value == {"prompt": row["question"], "response": row["answer"]}


def test_declared_branch_wins_over_detection():
    # A messages record declared as knowledge with a mapped text field stays knowledge.
    value = {"messages": [{"role": "user", "content": "hi"}], "body": "Plain prose."}
    branch, routed = classify(record(value), spec(branch=KNOWLEDGE, fields={"text": "body"}))
    assert (branch, routed.value) == (KNOWLEDGE, "Plain prose.")
    # A text record declared as instruction with no instruction shape is rejected, not guessed.
    result = classify(record({"text": "prose"}), spec(branch=INSTRUCTION))
    assert isinstance(result, Rejection)
    assert result.reason == UNCLASSIFIABLE
    result = classify(record("a text line"), spec(branch=INSTRUCTION))
    assert result.reason == UNCLASSIFIABLE


@pytest.mark.parametrize(
    ("value", "declared", "reason"),
    [
        (
            {"question": "q"},
            {"fields": {"prompt": "question", "response": "answer"}},
            MISSING_FIELD,
        ),
        ({"text": 42}, {}, WRONG_TYPE),
        ({"text": "   \n"}, {}, EMPTY_RECORD),
        ("", {}, EMPTY_RECORD),
        ({"title": "no text"}, {"branch": KNOWLEDGE}, MISSING_FIELD),
        ([1, 2, 3], {}, NOT_AN_OBJECT),
    ],
)
def test_bad_records_are_rejected_with_a_reason(value, declared, reason):
    result = classify(record(value), spec(**declared))
    assert isinstance(result, Rejection)
    assert result.reason == reason


def test_read_errors_pass_through_with_their_reason_and_raw_text():
    failed = Record(
        source="x.jsonl",
        position=3,
        input_index=0,
        error=Drop(MALFORMED_JSON, "Expecting value"),
        raw="{oops",
    )
    result = classify(failed, spec())
    assert (result.reason, result.message, result.raw) == (
        MALFORMED_JSON,
        "Expecting value",
        "{oops",
    )


def test_classify_records_splits_a_chunk_and_counts_every_record():
    values = [{"text": "doc one"}, {"prompt": "p", "response": "r"}, {"nope": 1}, "doc two"]
    chunk = RecordChunk(
        "c0",
        tuple(Record(source="x", position=i, input_index=0, value=v) for i, v in enumerate(values)),
    )
    with test_pipeline.TestPipeline() as p:
        routed = p | beam.Create([chunk]) | ClassifyRecords([spec()])
        assert_that(
            routed[KNOWLEDGE] | "K" >> beam.Map(lambda c: [r.value for r in c.records]),
            equal_to([["doc one", "doc two"]]),
            label="knowledge",
        )
        assert_that(
            routed[INSTRUCTION] | "I" >> beam.Map(lambda c: len(c.records)),
            equal_to([1]),
            label="instruction",
        )
        assert_that(
            routed[PARTS] | beam.Map(lambda p: (p.kind, p.table.column("reason").to_pylist())),
            equal_to([("rejected", [UNCLASSIFIABLE])]),
            label="rejected",
        )
        assert_that(
            routed[STATS] | beam.Map(dict),
            equal_to(
                [
                    {
                        "records_read": 4,
                        "knowledge.records_in": 2,
                        "instruction.records_in": 1,
                        "rejected.unclassifiable": 1,
                        "input.0.read": 4,
                        "input.0.rejected.unclassifiable": 1,
                        "files": {(0, "x"): {"rejected.unclassifiable": 1}},
                    }
                ]
            ),
            label="stats",
        )
