"""Tests for transforms.instruction.schema: the built-in schemas accept the real data and every
rule rejects
with its own reason; user schemas load through Beam's filesystems; the conversation rules."""

from __future__ import annotations

import collections
import itertools
import json
import re

import pytest

from tests.conftest import SHARED_DATA, require_shared_data
from transforms.core.vocabulary import (
    INSTRUCTION_FORMATS,
    Drop,
)
from transforms.instruction import adapters, schema
from transforms.instruction.adapters import Conversation, instruction_format, to_conversation
from transforms.instruction.schema import (
    ConversationLimits,
    RecordSchema,
    builtin_schema,
    check_conversation,
    load_schema,
    load_schemas,
)

require_shared_data()

REAL_FILES = {
    "chat/kto_en_demo_messages.json": "messages",
    "chat/fastchat_dummy_conversation.json": "sharegpt",
    "chat/glaive_toolcall_en_demo.json": "sharegpt",
    "chat/glaive_toolcall_zh_demo.json": "sharegpt",
    "instruction/alpaca_en_demo.json": "alpaca",
    "instruction/alpaca_zh_demo.json": "alpaca",
    "math/gsm8k_test.jsonl": "prompt_response",
    "preference/hh_rlhf_harmless_base_test.jsonl": "transcript",
}


def load_rows(relative: str) -> list[dict]:
    text = (SHARED_DATA / relative).read_text(encoding="utf-8")
    rows = ([json.loads(line) for line in text.splitlines()] if relative.endswith(".jsonl")
            else json.loads(text))
    if "gsm8k" in relative:
        rows = [{"prompt": r["question"], "response": r["answer"]} for r in rows]
    return rows


def schema_error(fmt: str, value: dict) -> Drop:
    with pytest.raises(Drop) as info:
        builtin_schema(fmt).check(value)
    return info.value


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, **extra) -> dict:
    return {"role": "assistant", "content": text, **extra}


CALL = [{"type": "function", "function": {"name": "f", "arguments": {}}}]


# --- built-in schemas --------------------------------------------------------------------------


@pytest.mark.parametrize(("relative", "fmt"), sorted(REAL_FILES.items()))
def test_builtin_schemas_accept_every_real_record(relative, fmt):
    rows = load_rows(relative)
    for n, row in enumerate(rows):
        assert instruction_format(row) == fmt, n
        builtin_schema(fmt).check(row)
    assert len(rows) >= 300


def test_role_domains_match_what_the_adapters_accept():
    def domain(fmt: str) -> frozenset:
        (feature,) = [f for f in builtin_schema(fmt).features if f.type == "STRUCT"]
        (role,) = [f for f in feature.fields if f.strings is not None]
        return role.strings

    assert domain("messages") == frozenset(adapters.ROLES)
    assert domain("sharegpt") == frozenset({*adapters.SHAREGPT_ROLES, adapters.FUNCTION_CALL})


def test_every_format_has_a_schema_and_user_schemas_replace_one(tmp_path):
    path = tmp_path / "mine.pbtxt"
    path.write_text('feature { name: "prompt" type: BYTES presence { min_fraction: 1.0 } }')
    schemas = load_schemas({"prompt_response": str(path)})
    assert sorted(schemas) == sorted(INSTRUCTION_FORMATS)
    assert schemas["prompt_response"].source == str(path)
    assert schemas["alpaca"].source == "builtin:alpaca.pbtxt"
    with pytest.raises(ValueError, match=r"unknown format\(s\) \['chatml'\]"):
        load_schemas({"chatml": str(path)})


# --- each schema rule and its reason -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "value", "reason", "message"),
    [
        ("messages", {"tools": []}, schema.SCHEMA_MISSING_FEATURE,
         "required feature messages is missing"),
        ("messages", {"messages": None}, schema.SCHEMA_MISSING_FEATURE, "messages is missing"),
        ("messages", {"messages": {"role": "user"}}, schema.SCHEMA_WRONG_TYPE,
         "messages must be a list of STRUCT values, got an object"),
        ("messages", {"messages": []}, schema.SCHEMA_VALUE_COUNT,
         "messages has 0 value(s); the schema allows 1.."),
        ("messages", {"messages": ["hi"]}, schema.SCHEMA_WRONG_TYPE,
         "messages[0] must be STRUCT (an object), got a string"),
        ("messages", {"messages": [{"content": "hi"}]}, schema.SCHEMA_MISSING_FEATURE,
         "required feature messages[0].role is missing"),
        ("messages", {"messages": [{"role": "bot", "content": "hi"}]}, schema.SCHEMA_DOMAIN,
         "messages[0].role is 'bot', not in domain 'role' (assistant, system, tool, user)"),
        ("messages", {"messages": [{"role": 1, "content": "hi"}]}, schema.SCHEMA_WRONG_TYPE,
         "messages[0].role must be BYTES (a string), got an integer"),
        ("messages", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
         schema.SCHEMA_WRONG_TYPE, "messages[0].content must be one BYTES value"),
        ("messages", {"messages": [{"role": "assistant", "tool_calls": [{"id": "c1"}]}]},
         schema.SCHEMA_MISSING_FEATURE, "messages[0].tool_calls[0].function is missing"),
        ("messages", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
         schema.SCHEMA_MISSING_FEATURE, "messages[0].tool_calls[0].function.name is missing"),
        ("messages", {"messages": [user("hi")], "system": ["a", "b"]}, schema.SCHEMA_WRONG_TYPE,
         "system must be one BYTES value"),
        ("sharegpt", {"conversations": [{"from": "narrator", "value": "x"}]},
         schema.SCHEMA_DOMAIN, "conversations[0].from is 'narrator', not in domain 'speaker'"),
        ("sharegpt", {"conversations": [{"from": "human"}]}, schema.SCHEMA_MISSING_FEATURE,
         "conversations[0].value is missing"),
        ("sharegpt", {"conversations": [{"from": "gpt", "value": 3}]}, schema.SCHEMA_WRONG_TYPE,
         "conversations[0].value must be BYTES"),
        ("prompt_response", {"prompt": None, "response": "r"}, schema.SCHEMA_MISSING_FEATURE,
         "prompt is missing"),
        ("prompt_response", {"prompt": "p", "completion": 7}, schema.SCHEMA_WRONG_TYPE,
         "completion must be BYTES (a string), got an integer"),
        ("alpaca", {"instruction": "i", "output": True}, schema.SCHEMA_WRONG_TYPE,
         "output must be BYTES (a string), got a boolean"),
        ("alpaca", {"instruction": "i", "input": ["x"], "output": "o"}, schema.SCHEMA_WRONG_TYPE,
         "input must be one BYTES value"),
        ("transcript", {"chosen": {"text": "x"}}, schema.SCHEMA_WRONG_TYPE,
         "chosen must be BYTES (a string), got an object"),
    ],
)
def test_schema_rules_reject_with_their_reason(fmt, value, reason, message):
    error = schema_error(fmt, value)
    assert error.reason == reason
    assert message in error.message
    assert str(error) == error.message


def test_the_first_broken_rule_in_schema_order_is_reported():
    error = schema_error("alpaca", {"instruction": 1, "output": None})
    assert error.reason == schema.SCHEMA_WRONG_TYPE and error.message.startswith("instruction")


USER_SCHEMA = """
# A user's schema: an id, a bounded score, a bounded number of turns and its own role domain.
feature { name: "id" type: INT presence { min_fraction: 1.0 min_count: 1 }
          value_count { min: 1 max: 1 } int_domain { min: 1 } }
feature { name: "score" type: FLOAT domain: "unit" }
feature { name: "tags" type: BYTES value_count { min: 0 max: 2 } }
feature { name: "legacy" type: BYTES deprecated: true presence { min_fraction: 1.0 } }
feature { name: "planned" type: BYTES lifecycle_stage: PLANNED presence { min_fraction: 1.0 } }
feature {
  name: "messages" type: STRUCT presence { min_fraction: 1.0 } value_count { min: 2 max: 4 }
  struct_domain { feature { name: "role" type: BYTES domain: "role" } }
}
string_domain { name: "role" value: "user" value: "assistant" }
float_domain { name: "unit" min: 0.0 max: 1.0 disallow_nan: true }
annotation { tag: "ignored: annotations describe, they do not constrain" }
"""


@pytest.fixture
def user_schema(tmp_path) -> RecordSchema:
    path = tmp_path / "user.pbtxt"
    path.write_text(USER_SCHEMA)
    return load_schema(str(path))


def record(**changes) -> dict:
    base = {"id": 7, "score": 0.5, "tags": ["a"], "messages": [user("q"), assistant("a")]}
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "reason", "message"),
    [
        ({"id": None}, schema.SCHEMA_MISSING_FEATURE, "id is missing"),
        ({"id": True}, schema.SCHEMA_WRONG_TYPE, "id must be INT (an integer), got a boolean"),
        ({"id": 1.5}, schema.SCHEMA_WRONG_TYPE, "got a number"),
        ({"id": 0}, schema.SCHEMA_DOMAIN, "id is 0, outside domain 'id' [1..]"),
        ({"score": 1.5}, schema.SCHEMA_DOMAIN, "score is 1.5, outside domain 'unit' [0.0..1.0]"),
        ({"score": float("nan")}, schema.SCHEMA_DOMAIN, "not a finite number"),
        ({"tags": ["a", "b", "c"]}, schema.SCHEMA_VALUE_COUNT, "tags has 3 value(s)"),
        ({"tags": "a"}, schema.SCHEMA_WRONG_TYPE, "tags must be a list of BYTES values"),
        ({"messages": [user("q")]}, schema.SCHEMA_VALUE_COUNT,
         "messages has 1 value(s); the schema allows 2..4"),
        ({"messages": [user("q"), {"role": "system", "content": "s"}]}, schema.SCHEMA_DOMAIN,
         "messages[1].role is 'system', not in domain 'role' (assistant, user)"),
    ],
)
def test_a_user_schema_enforces_its_own_rules(user_schema, changes, reason, message):
    with pytest.raises(Drop) as info:
        user_schema.check(record(**changes))
    assert info.value.reason == reason
    assert message in info.value.message


def test_a_user_schema_accepts_good_records_and_skips_retired_features(user_schema):
    user_schema.check(record())  # "legacy" and "planned" are required but not enforced
    user_schema.check(record(score=1, tags=None))  # an int is a FLOAT; tags are optional


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("feature { name: ", "not a tensorflow-metadata Schema"),
        ('feature { name: "a" }', "needs a type"),
        ("", "declares no feature to enforce"),
        ('feature { type: BYTES }', "a feature has no name"),
        ('feature { name: "a" type: BYTES shape { dim { size: 1 } } }',
         "shape cannot be checked per record"),
        ('feature { name: "a" type: BYTES bool_domain { } }', "bool_domain cannot be checked"),
        ('feature { name: "a" type: INT } sparse_feature { name: "s" }',
         "sparse_feature cannot be checked per record"),
        ('feature { name: "a" type: BYTES domain: "nope" }', "no top-level domain named 'nope'"),
        ('feature { name: "a" type: INT string_domain { value: "x" } }',
         "a StringDomain does not fit type INT"),
        ('feature { name: "a" type: BYTES struct_domain { } }', "struct_domain needs type STRUCT"),
    ],
)
def test_schemas_that_cannot_be_enforced_fail_at_load(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RecordSchema.parse(text, "test.pbtxt")


def test_an_unreadable_schema_path_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read schema"):
        load_schema(str(tmp_path / "missing.pbtxt"))


# --- conversation rules ------------------------------------------------------------------------


def conversation(*messages: dict) -> Conversation:
    return Conversation(tuple(messages))


SYSTEM = {"role": "system", "content": "Be brief."}
TOOL = {"role": "tool", "content": "rain"}


@pytest.mark.parametrize(
    "messages",
    [
        (user("q"), assistant("a")),
        (SYSTEM, user("q"), assistant("a"), user("thanks")),  # a trailing user turn is context
        (user("q"), assistant("", tool_calls=CALL), TOOL, TOOL, assistant("It rains.")),
        (user("q"), assistant("", tool_calls=CALL), TOOL, assistant("", tool_calls=CALL), TOOL),
    ],
)
def test_valid_conversations_pass(messages):
    check_conversation(conversation(*messages), ConversationLimits())


@pytest.mark.parametrize(
    ("messages", "reason", "message"),
    [
        ((user("q"),), schema.NO_ASSISTANT_TURN, "the conversation has no assistant message"),
        ((SYSTEM, user("q")), schema.NO_ASSISTANT_TURN,
         "the conversation has no assistant message"),
        ((assistant("Hi!"), user("q"), assistant("a")), schema.BAD_ROLE_ORDER,
         "messages[0]: the conversation must open with a user message, not assistant"),
        ((user("q"), SYSTEM, assistant("a")), schema.BAD_ROLE_ORDER,
         "messages[1]: a system message may only come first"),
        ((user("a"), user("b"), assistant("c")), schema.BAD_ROLE_ORDER,
         "messages[1]: a user message cannot follow a user message"),
        ((user("q"), assistant("a"), assistant("b")), schema.BAD_ROLE_ORDER,
         "messages[2]: an assistant message cannot follow an assistant message"),
        ((user("q"), assistant("a"), TOOL), schema.BAD_ROLE_ORDER,
         "messages[2]: a tool message cannot follow an assistant message"),
        ((user("q"), assistant("", tool_calls=CALL), user("and?")), schema.BAD_ROLE_ORDER,
         "messages[2]: a user message cannot follow an assistant tool call"),
        ((user("q"), assistant(" \n ")), schema.EMPTY_ASSISTANT_TURN,
         "messages[1] is an assistant message with no content or tool call"),
    ],
)
def test_conversation_rules_reject_with_their_reason(messages, reason, message):
    with pytest.raises(Drop) as info:
        check_conversation(conversation(*messages), ConversationLimits())
    assert (info.value.reason, info.value.message) == (reason, message)


def test_size_limits_count_messages_and_content_characters():
    chat = conversation(SYSTEM, user("q" * 10), assistant("a" * 10))
    check_conversation(chat, ConversationLimits(max_turns=3, max_chars=29))
    with pytest.raises(Drop, match=r"3 messages > --max_turns 2") as info:
        check_conversation(chat, ConversationLimits(max_turns=2))
    assert info.value.reason == schema.TOO_MANY_TURNS
    with pytest.raises(Drop, match=r"29 characters of content > --max_chars 28") as info:
        check_conversation(chat, ConversationLimits(max_chars=28))
    assert info.value.reason == schema.TOO_MANY_CHARS


def test_rules_on_real_transcripts_find_exactly_the_malformed_ones():
    """HH transcripts with a doubled "Assistant:" speaker or an empty reply are the only ones the
    rules reject; the expectation is read off the raw text, not through the adapter."""
    expected, found = {}, {}
    for n, row in enumerate(load_rows("preference/hh_rlhf_harmless_base_test.jsonl")):
        turns = re.split(r"\n\n(Human|Assistant):", "\n\n" + row["chosen"].lstrip())
        speakers, texts = turns[1::2], turns[2::2]
        if any(a == b for a, b in itertools.pairwise(speakers)):
            expected[n] = schema.BAD_ROLE_ORDER
        elif any(s == "Assistant" and not t.strip() for s, t in zip(speakers, texts, strict=True)):
            expected[n] = schema.EMPTY_ASSISTANT_TURN
        try:
            check_conversation(to_conversation(row), ConversationLimits())
        except Drop as e:
            found[n] = e.reason
    assert found == expected
    assert collections.Counter(found.values()) == {schema.BAD_ROLE_ORDER: 8,
                                                   schema.EMPTY_ASSISTANT_TURN: 4}
