"""Tests for transforms.instruction.adapters: every format on real shared rows, precedence,
each error path."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tests.conftest import SHARED_DATA, require_shared_data
from transforms.core.vocabulary import (
    BAD_TOOL_CALL,
    BAD_TOOLS,
    DUPLICATE_REASONING,
    DUPLICATE_SYSTEM,
    EMPTY_CONVERSATION,
    MISSING_FIELD,
    UNKNOWN_FORMAT,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    Drop,
)
from transforms.instruction.adapters import (
    Conversation,
    instruction_format,
    to_conversation,
)

require_shared_data()


def load_rows(relative: str) -> list[dict]:
    path = SHARED_DATA / relative
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return json.loads(path.read_text(encoding="utf-8"))


def roles(conversation: Conversation) -> list[str]:
    return [m["role"] for m in conversation.messages]


def adapt_error(value: object, fmt: str | None = None) -> Drop:
    with pytest.raises(Drop) as info:
        to_conversation(value, fmt)  # type: ignore[arg-type]
    return info.value


# --- real rows, one test per format -------------------------------------------------------------


def test_messages_rows_keep_roles_and_contents():
    rows = load_rows("chat/kto_en_demo_messages.json")
    for row in rows:
        assert instruction_format(row) == "messages"
        conversation = to_conversation(row)
        assert conversation.tools is None
        assert list(conversation.messages) == [
            {"role": m["role"], "content": m["content"]} for m in row["messages"]
        ]


def test_sharegpt_rows_without_tools():
    for row in load_rows("chat/fastchat_dummy_conversation.json"):
        assert instruction_format(row) == "sharegpt"
        conversation = to_conversation(row)
        expected = ["user" if t["from"] == "human" else "assistant" for t in row["conversations"]]
        assert roles(conversation) == expected
        assert [m["content"] for m in conversation.messages] == [
            t["value"] for t in row["conversations"]
        ]
        assert conversation.tools is None


@pytest.mark.parametrize("name", ["glaive_toolcall_en_demo.json", "glaive_toolcall_zh_demo.json"])
def test_sharegpt_with_tools_and_function_calls(name):
    rows = load_rows(f"chat/{name}")
    seen_tools = seen_calls = 0
    for row in rows:
        conversation = to_conversation(row)
        tools = json.loads(row["tools"])
        if tools:
            seen_tools += 1
            assert conversation.tools == tuple({"type": "function", "function": t} for t in tools)
        else:
            assert conversation.tools is None  # "[]" means no tools, not an empty tool list
        for turn, message in zip(row["conversations"], conversation.messages, strict=True):
            if turn["from"] == "function_call":
                seen_calls += 1
                call = json.loads(turn["value"])
                assert message == {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]},
                        }
                    ],
                }
            else:
                role = {"human": "user", "gpt": "assistant", "observation": "tool"}[turn["from"]]
                assert message == {"role": role, "content": turn["value"]}
    assert seen_tools > 100
    assert seen_calls > 100


def test_alpaca_rows_join_instruction_and_input():
    rows = load_rows("instruction/alpaca_en_demo.json")
    with_input = 0
    for row in rows:
        assert instruction_format(row) == "alpaca"
        user, assistant = to_conversation(row).messages
        if row["input"]:
            with_input += 1
            assert user["content"] == row["instruction"] + "\n\n" + row["input"]
        else:
            assert user["content"] == row["instruction"]
        assert assistant == {"role": "assistant", "content": row["output"]}
    assert 0 < with_input < len(rows)


def test_gsm8k_mapped_to_prompt_response():
    for row in load_rows("math/gsm8k_test.jsonl")[:200]:
        mapped = {"prompt": row["question"], "response": row["answer"]}
        assert instruction_format(mapped) == "prompt_response"
        assert to_conversation(mapped).messages == (
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": row["answer"]},
        )


def test_hh_rlhf_transcripts():
    """Reads the chosen side; assertions report only counts and row numbers, never the text."""
    rows = load_rows("preference/hh_rlhf_harmless_base_test.jsonl")
    for n, row in enumerate(rows):
        assert instruction_format(row) == "transcript", f"row {n}"
        conversation = to_conversation(row)
        speakers = re.findall(r"\n\n(Human|Assistant):", row["chosen"])
        expected = ["user" if s == "Human" else "assistant" for s in speakers]
        assert roles(conversation) == expected, f"row {n}"
        texts_ok = all(
            m["content"] == m["content"].strip() and m["content"] in row["chosen"]
            for m in conversation.messages
        )
        assert texts_ok, f"row {n}: contents are not stripped substrings of the transcript"
        assert conversation.tools is None
    assert len(rows) > 1000


def test_transcript_from_text_and_stripping():
    value = {"text": "\n\nHuman: hi there\n\nAssistant:  hello \n\nHuman: bye\n\nAssistant:"}
    assert instruction_format(value) == "transcript"
    assert to_conversation(value).messages == (
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": ""},
    )


# --- detection and precedence -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"messages": [], "conversations": [], "prompt": "p", "response": "r"}, "messages"),
        ({"conversations": [], "prompt": "p", "response": "r"}, "sharegpt"),
        ({"prompt": "p", "completion": "c", "instruction": "i", "output": "o"}, "prompt_response"),
        ({"instruction": "i", "output": "o", "chosen": "\n\nHuman: a\n\nAssistant: b"}, "alpaca"),
        ({"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "x"}, "transcript"),
        ({"text": "Human: a\n\nAssistant: b"}, "transcript"),
        ({"chosen": "Human: a, no assistant turn"}, None),
        ({"text": "An essay that mentions\n\nAssistant: in passing."}, None),
        ({"chosen": ["not", "a", "string"]}, None),
        ({"prompt": "p"}, None),
        ({"instruction": "i", "input": "x"}, None),
        ({"text": "plain prose"}, None),
        ({}, None),
    ],
)
def test_instruction_format_precedence(value, expected):
    assert instruction_format(value) == expected


def test_detection_ignores_types_so_errors_are_precise():
    assert instruction_format({"messages": "oops"}) == "messages"
    assert adapt_error({"messages": "oops"}).reason == WRONG_TYPE


def test_explicit_format_overrides_detection():
    value = {"messages": [], "prompt": "p", "response": "r"}
    assert roles(to_conversation(value, "prompt_response")) == ["user", "assistant"]


# --- canonical details --------------------------------------------------------------------------


def test_system_field_is_prepended():
    for value in (
        {"system": "S", "prompt": "p", "response": "r"},
        {"system": "S", "instruction": "i", "input": "", "output": "o"},
        {"system": "S", "conversations": [{"from": "human", "value": "p"}]},
        {"system": "S", "messages": [{"role": "user", "content": "p"}]},
    ):
        assert to_conversation(value).messages[0] == {"role": "system", "content": "S"}
    assert roles(to_conversation({"system": "", "prompt": "p", "response": "r"})) == [
        "user",
        "assistant",
    ]


def test_alpaca_whitespace_input_is_ignored():
    value = {"instruction": "Do it.", "input": "  \n", "output": "Done."}
    assert to_conversation(value).messages[0]["content"] == "Do it."


def test_openai_tool_calls_and_tools():
    value = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "content": "rain", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It rains."},
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
    }
    conversation = to_conversation(value)
    assert conversation.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
        ],
    }
    assert conversation.messages[2] == {"role": "tool", "content": "rain"}
    assert conversation.tools == tuple(value["tools"])


def test_sharegpt_parallel_function_calls():
    value = {
        "conversations": [
            {"from": "human", "value": "both"},
            {"from": "function_call", "value": '[{"name": "a", "arguments": {}}, {"name": "b"}]'},
            {"from": "tool", "value": "ok"},
            {"from": "assistant", "value": "done"},
        ]
    }
    message = to_conversation(value).messages[1]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["a", "b"]
    assert message["tool_calls"][1]["function"]["arguments"] == {}


def test_conversation_is_frozen():
    conversation = to_conversation({"prompt": "p", "response": "r"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        conversation.messages = ()  # type: ignore[misc]


# --- every error path ---------------------------------------------------------------------------


def calls(*tool_calls: object, role: str = "assistant") -> dict:
    return {"messages": [{"role": role, "content": "", "tool_calls": list(tool_calls)}]}


def function(name: object = "f", arguments: object = None) -> dict:
    return {"function": {"name": name, "arguments": {} if arguments is None else arguments}}


def turns(*conversation: object) -> dict:
    return {"conversations": list(conversation)}


def function_call(value: str) -> dict:
    return turns({"from": "function_call", "value": value})


def with_tools(tools: object) -> dict:
    return {"conversations": [{"from": "human", "value": "hi"}], "tools": tools}


BAD_CALL = BAD_TOOL_CALL


@pytest.mark.parametrize(
    ("value", "fmt", "reason"),
    [
        (["not", "an", "object"], None, WRONG_TYPE),
        ({"text": "plain prose"}, None, UNKNOWN_FORMAT),
        ({"prompt": "p", "response": "r"}, "yaml", UNKNOWN_FORMAT),
        # messages
        ({"messages": {"role": "user"}}, None, WRONG_TYPE),
        ({"messages": []}, None, EMPTY_CONVERSATION),
        ({"messages": ["hi"]}, None, WRONG_TYPE),
        ({"messages": [{"content": "hi"}]}, None, MISSING_FIELD),
        ({"messages": [{"role": "bot", "content": "hi"}]}, None, UNKNOWN_ROLE),
        ({"messages": [{"role": "user"}]}, None, MISSING_FIELD),
        ({"messages": [{"role": "user", "content": None}]}, None, WRONG_TYPE),
        ({"messages": [{"role": "user", "content": ["part"]}]}, None, WRONG_TYPE),
        (calls(function(), role="user"), None, BAD_CALL),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": "f()"}]}, None, BAD_CALL),
        (calls({}), None, BAD_CALL),
        (calls(function(arguments="{not json")), None, BAD_CALL),
        (calls(function(arguments="[1, 2]")), None, BAD_CALL),
        (calls(function(arguments=7)), None, BAD_CALL),
        (calls(function(name="")), None, BAD_CALL),
        (calls(function(name=["f"])), None, BAD_CALL),
        (
            {"system": "S", "messages": [{"role": "system", "content": "T"}]},
            None,
            DUPLICATE_SYSTEM,
        ),
        # sharegpt
        ({"conversations": "hi"}, None, WRONG_TYPE),
        (turns(["human", "hi"]), None, WRONG_TYPE),
        (turns({"value": "hi"}), None, MISSING_FIELD),
        (turns({"from": "human"}), None, MISSING_FIELD),
        (turns({"from": "human", "value": 3}), None, WRONG_TYPE),
        (turns({"from": "narrator", "value": "hi"}), None, UNKNOWN_ROLE),
        (turns({"from": None, "value": "hi"}), None, UNKNOWN_ROLE),
        (function_call("f(x)"), None, BAD_CALL),
        (function_call("[]"), None, BAD_CALL),
        (function_call('"f"'), None, BAD_CALL),
        (function_call('{"arguments": {}}'), None, BAD_CALL),
        (function_call('{"name": "f", "arguments": "not json"}'), None, BAD_CALL),
        (with_tools("[{"), None, BAD_TOOLS),
        (with_tools('{"name": "f"}'), None, BAD_TOOLS),
        (with_tools(["f"]), None, BAD_TOOLS),
        (with_tools([{"description": "no name"}]), None, BAD_TOOLS),
        # prompt_response / alpaca
        ({"prompt": 1, "response": "r"}, None, WRONG_TYPE),
        ({"prompt": "p", "response": None}, None, MISSING_FIELD),
        ({"prompt": "p", "completion": ["c"]}, None, WRONG_TYPE),
        ({"prompt": "p", "response": "r", "system": 5}, None, WRONG_TYPE),
        ({"prompt": "p"}, "prompt_response", MISSING_FIELD),
        ({"instruction": "i", "input": 3, "output": "o"}, None, WRONG_TYPE),
        ({"instruction": "i", "output": {"text": "o"}}, None, WRONG_TYPE),
        ({"instruction": "i"}, "alpaca", MISSING_FIELD),
        # transcript
        ({"chosen": "no speakers here"}, "transcript", MISSING_FIELD),
    ],
)
def test_adapt_errors(value, fmt, reason):
    error = adapt_error(value, fmt)
    assert error.reason == reason
    assert str(error) == error.message and error.message


# --- reasoning ---------------------------------------------------------------------------------


def reply(conversation: Conversation) -> dict:
    return conversation.messages[-1]


def test_reasoning_from_messages_sharegpt_and_think_blocks():
    messages = to_conversation({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "42", "reasoning_content": "\nsix times seven\n"}]})
    assert reply(messages) == {"role": "assistant", "content": "42",
                               "reasoning_content": "six times seven"}
    sharegpt = to_conversation({"conversations": [
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "<think>\nsix times seven\n</think>\n\n42"}]})
    assert reply(sharegpt) == reply(messages)
    plain = to_conversation({"prompt": "q", "response": "42"})
    assert "reasoning_content" not in reply(plain)
    # A user's <think> is text, not reasoning.
    asked = to_conversation({"prompt": "<think>x</think> y?", "response": "z"})
    assert asked.messages[0]["content"] == "<think>x</think> y?"


def test_record_level_reasoning_for_single_reply_formats():
    for record in ({"prompt": "q", "response": "42", "reasoning": "six times seven"},
                   {"instruction": "q", "output": "42", "reasoning": "six times seven"}):
        assert reply(to_conversation(record))["reasoning_content"] == "six times seven"


@pytest.mark.parametrize("field", ["thinking", "reasoning", "reasoning_content"])
def test_a_turns_reasoning_under_any_of_its_usual_names(field):
    """harmony exports (GPT-OSS) call it ``thinking``; the same text twice is one reasoning."""
    for turns in ({"messages": [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "42", field: "six sevens"}]},
                  {"conversations": [{"from": "human", "value": "q"},
                                     {"from": "gpt", "value": "42", field: "six sevens",
                                      "reasoning_content": "six sevens"}]}):
        assert reply(to_conversation(turns))["reasoning_content"] == "six sevens"


@pytest.mark.parametrize("record, reason", [
    ({"prompt": "q", "response": "<think>a</think>42", "reasoning": "b"},
     DUPLICATE_REASONING),
    ({"messages": [{"role": "user", "content": "q"},
                   {"role": "assistant", "content": "42", "thinking": "a",
                    "reasoning_content": "b"}]}, DUPLICATE_REASONING),
    ({"prompt": "q", "response": "42", "reasoning": 7}, WRONG_TYPE),
])
def test_bad_reasoning_is_rejected(record, reason):
    with pytest.raises(Drop) as error:
        to_conversation(record)
    assert error.value.reason == reason


def test_declared_reasoning_field_per_turn_and_per_record():
    from transforms.core.fields import apply_field_map

    turns = apply_field_map({"conversations": [{"from": "human", "value": "q"},
                                               {"from": "gpt", "value": "42", "thought": "r"}]},
                            {"reasoning": "thought"})
    assert reply(to_conversation(turns))["reasoning_content"] == "r"
    record = apply_field_map({"question": "q", "answer": "42", "thought": "r"},
                             {"prompt": "question", "response": "answer", "reasoning": "thought"})
    assert reply(to_conversation(record))["reasoning_content"] == "r"
