"""Every supported instruction format, adapted to one canonical conversation.

The chat-template step only ever sees a ``Conversation``: OpenAI-style messages (``system``,
``user``, ``assistant``, ``tool``), assistant tool calls with parsed ``arguments``, and optional
JSON-schema tool definitions. Adapters are strict on purpose: a record that does not fit is
rejected with a reason code instead of being silently rendered into a wrong training signal.

Formats, tried in this order by ``instruction_format`` (first match wins, so a record that carries
several shapes is always read the same way; structured shapes beat the free-text transcript):

1. ``messages``: a ``messages`` field (OpenAI chat format).
2. ``sharegpt``: a ``conversations`` field, a list of ``{"from", "value"}`` turns.
3. ``prompt_response``: ``prompt`` plus ``response`` (or, if absent, ``completion``).
4. ``alpaca``: ``instruction`` plus ``output``, optional ``input``.
5. ``transcript``: a string in the Anthropic HH form ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``
   held in ``chosen`` (preference data: the chosen side is the SFT target) or else ``text``.
   Detected when the string, after leading whitespace, starts with ``Human:`` and contains
   ``"\\n\\nAssistant:"``.

Detection looks only at which fields are present (and, for transcripts, at the string's form);
types are checked by ``to_conversation`` so that a malformed record gets a precise reason
(``wrong_type``) rather than falling through to ``unclassifiable``.

Every structured format accepts an optional non-empty ``system`` string, prepended as a system
message; a record that also carries a system turn is rejected (``duplicate_system``) rather
than guessing which one wins.

Reasoning. A reply's reasoning trace becomes its ``reasoning_content`` (the field Qwen3,
DeepSeek-R1 and vLLM use), from: that field on a ``messages`` or ShareGPT turn; a
``<think>...</think>`` block that opens the reply's text; or, for ``prompt_response`` and
``alpaca``, a record-level ``reasoning`` string. An input declares another field with
``#reasoning=FIELD`` (``core.fields.apply_field_map``). The chat template decides where it is
rendered.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from transforms.core.fields import REASONING, REASONING_CONTENT, TURN_REASONING_FIELDS
from transforms.core.vocabulary import (
    BAD_TOOL_CALL,
    BAD_TOOLS,
    DUPLICATE_REASONING,
    DUPLICATE_SYSTEM,
    EMPTY_CONVERSATION,
    INSTRUCTION_FORMATS,
    MISSING_FIELD,
    UNKNOWN_FORMAT,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    Drop,
)

ROLES = ("system", "user", "assistant", "tool")

# ShareGPT speaker tags -> canonical roles; function_call is handled separately (tool calls).
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "observation": "tool",
    "tool": "tool",
}
FUNCTION_CALL = "function_call"

_THINK = re.compile(r"\s*<think>(.*?)</think>", re.DOTALL)

TRANSCRIPT_FIELDS = ("chosen", "text")
_TRANSCRIPT_TURN = re.compile(r"\n\n(Human|Assistant):")
_TRANSCRIPT_ROLES = {"Human": "user", "Assistant": "assistant"}




@dataclasses.dataclass(frozen=True)
class Conversation:
    """The canonical form: OpenAI-style messages and optional JSON-schema tool definitions.

    Messages are ``{"role", "content"}`` dicts; assistant messages may add ``tool_calls`` as
    ``[{"type": "function", "function": {"name": str, "arguments": dict}}]`` and a non-empty
    ``reasoning_content`` string. Tools are in the
    OpenAI ``{"type": "function", "function": {...}}`` form that chat templates expect.
    """

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None


def instruction_format(value: dict) -> str | None:
    """The record's format by the precedence in the module docstring, or None."""
    if "messages" in value:
        return "messages"
    if "conversations" in value:
        return "sharegpt"
    if "prompt" in value and ("response" in value or "completion" in value):
        return "prompt_response"
    if "instruction" in value and "output" in value:
        return "alpaca"
    if _transcript_field(value) is not None:
        return "transcript"
    return None


def to_conversation(value: dict, fmt: str | None = None) -> Conversation:
    """Adapt one record (in format ``fmt``, detected when None) or raise ``Drop``."""
    if not isinstance(value, dict):
        raise Drop(WRONG_TYPE, f"record must be an object, got {type(value).__name__}")
    fmt = fmt or instruction_format(value)
    if fmt is None:
        raise Drop(UNKNOWN_FORMAT, f"no instruction format matches fields {sorted(value)}")
    if fmt not in _ADAPTERS:
        raise Drop(UNKNOWN_FORMAT, f"unknown format {fmt!r}; expected one of "
                          f"{INSTRUCTION_FORMATS}")
    messages, tools = _ADAPTERS[fmt](value)
    if fmt != "transcript":
        messages = _with_system(messages, _optional_str(value, "system"))
    if not messages:
        raise Drop(EMPTY_CONVERSATION, "the conversation has no messages")
    return Conversation(tuple(messages), tools)


def _from_messages(value: dict) -> tuple[list[dict], tuple[dict, ...] | None]:
    turns = _list_field(value, "messages")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise Drop(WRONG_TYPE, f"messages[{i}] must be an object")
        if "role" not in turn:
            raise Drop(MISSING_FIELD, f"messages[{i}] has no 'role'")
        role = turn["role"]
        if role not in ROLES:
            raise Drop(UNKNOWN_ROLE, f"messages[{i}] has unknown role {role!r}")
        calls = turn.get("tool_calls")
        content = turn.get("content")
        if content is None and calls:
            content = ""  # OpenAI sends content null on pure tool-call turns
        if not isinstance(content, str):
            raise Drop(
                WRONG_TYPE if "content" in turn else MISSING_FIELD,
                f"messages[{i}].content must be a string",
            )
        message: dict[str, Any] = {"role": role, "content": content}
        _add_reasoning(message, _turn_reasoning(turn, f"messages[{i}]"), f"messages[{i}]")
        if calls:
            if role != "assistant":
                raise Drop(BAD_TOOL_CALL, f"messages[{i}] has tool_calls but is {role!r}")
            if not isinstance(calls, list):
                raise Drop(BAD_TOOL_CALL, f"messages[{i}].tool_calls must be a list")
            message["tool_calls"] = [_openai_tool_call(call, i) for call in calls]
        messages.append(message)
    return messages, _tools(value)


def _from_sharegpt(value: dict) -> tuple[list[dict], tuple[dict, ...] | None]:
    turns = _list_field(value, "conversations")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise Drop(WRONG_TYPE, f"conversations[{i}] must be an object")
        for key in ("from", "value"):
            if key not in turn:
                raise Drop(MISSING_FIELD, f"conversations[{i}] has no {key!r}")
        speaker, text = turn["from"], turn["value"]
        if not isinstance(text, str):
            raise Drop(WRONG_TYPE, f"conversations[{i}].value must be a string")
        if speaker == FUNCTION_CALL:
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": _sharegpt_calls(text, i)}
            )
        elif isinstance(speaker, str) and speaker in SHAREGPT_ROLES:
            message = {"role": SHAREGPT_ROLES[speaker], "content": text}
            where = f"conversations[{i}]"
            _add_reasoning(message, _turn_reasoning(turn, where), where)
            messages.append(message)
        else:
            raise Drop(UNKNOWN_ROLE, f"conversations[{i}] has unknown speaker {speaker!r}")
    return messages, _tools(value)


def _from_prompt_response(value: dict) -> tuple[list[dict], None]:
    answer_field = "response" if "response" in value else "completion"
    return [
        {"role": "user", "content": _str_field(value, "prompt")},
        _reply(value, _str_field(value, answer_field)),
    ], None


def _from_alpaca(value: dict) -> tuple[list[dict], None]:
    """User turn is ``instruction``, plus a blank line and ``input`` when input has text."""
    prompt = _str_field(value, "instruction")
    extra = _optional_str(value, "input")
    if extra and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    return [
        {"role": "user", "content": prompt},
        _reply(value, _str_field(value, "output")),
    ], None


def _from_transcript(value: dict) -> tuple[list[dict], None]:
    field = _transcript_field(value)
    if field is None:
        raise Drop(
            MISSING_FIELD, f"no {' or '.join(TRANSCRIPT_FIELDS)} string in the Human/Assistant form"
        )
    parts = _TRANSCRIPT_TURN.split("\n\n" + value[field].lstrip())
    # parts = ["", speaker, text, speaker, text, ...]; the text keeps the space after the colon.
    return [
        {"role": _TRANSCRIPT_ROLES[speaker], "content": text.strip()}
        for speaker, text in zip(parts[1::2], parts[2::2], strict=True)
    ], None


_ADAPTERS = {
    "messages": _from_messages,
    "sharegpt": _from_sharegpt,
    "prompt_response": _from_prompt_response,
    "alpaca": _from_alpaca,
    "transcript": _from_transcript,
}


def _reply(value: dict, content: str) -> dict:
    """The assistant message of a single-reply record, with its record-level reasoning."""
    message = {"role": "assistant", "content": content}
    _add_reasoning(message, value.get(REASONING), repr(REASONING))
    return message


def _turn_reasoning(turn: dict, where: str) -> Any:
    """A turn's reasoning under whichever name its source gave it (``TURN_REASONING_FIELDS``:
    OpenAI-style ``reasoning_content``, harmony's ``thinking``, ``reasoning``); two that
    disagree are refused rather than one kept silently."""
    if turn.keys().isdisjoint(TURN_REASONING_FIELDS):  # most turns: no reasoning at all
        return None
    given = {name: turn[name] for name in TURN_REASONING_FIELDS if turn.get(name)}
    if len({str(v) for v in given.values()}) > 1:
        raise Drop(DUPLICATE_REASONING, f"{where}: reasoning given twice, as "
                   f"{' and '.join(given)}")
    return next(iter(given.values()), None)


def _add_reasoning(message: dict, reasoning: Any, where: str) -> None:
    """Sets an assistant message's ``reasoning_content`` from ``reasoning`` or from a
    ``<think>`` block opening its content; a reply may not carry both."""
    if message["role"] != "assistant":
        return
    if reasoning is not None and not isinstance(reasoning, str):
        raise Drop(WRONG_TYPE, f"{where}: the reasoning must be a string")
    think = _THINK.match(message["content"])
    if think is not None:
        if reasoning and reasoning.strip():
            raise Drop(DUPLICATE_REASONING, f"{where}: both a reasoning field and a "
                             "<think> block in the reply")
        reasoning = think.group(1)
        message["content"] = message["content"][think.end():].lstrip("\n")
    if reasoning and reasoning.strip("\n"):
        message[REASONING_CONTENT] = reasoning.strip("\n")


def _transcript_field(value: dict) -> str | None:
    for field in TRANSCRIPT_FIELDS:
        text = value.get(field)
        if (
            isinstance(text, str)
            and text.lstrip().startswith("Human:")
            and "\n\nAssistant:" in text
        ):
            return field
    return None


def _with_system(messages: list[dict], system: str | None) -> list[dict]:
    if not system:
        return messages
    if any(m["role"] == "system" for m in messages):
        raise Drop(DUPLICATE_SYSTEM, "both a 'system' field and a system turn are present")
    return [{"role": "system", "content": system}, *messages]


def _list_field(value: dict, field: str) -> list:
    items = value[field]
    if not isinstance(items, list):
        raise Drop(WRONG_TYPE, f"{field!r} must be a list, got {type(items).__name__}")
    return items


def _str_field(value: dict, field: str) -> str:
    if field not in value or value[field] is None:
        raise Drop(MISSING_FIELD, f"missing {field!r}")
    text = value[field]
    if not isinstance(text, str):
        raise Drop(WRONG_TYPE, f"{field!r} must be a string, got {type(text).__name__}")
    return text


def _optional_str(value: dict, field: str) -> str | None:
    return _str_field(value, field) if value.get(field) is not None else None


def _arguments(arguments: Any, where: str) -> dict:
    """Tool-call arguments as an object; JSON strings (the OpenAI wire form) are parsed."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise Drop(BAD_TOOL_CALL, f"{where}: arguments are not valid JSON: {e}") from e
    if not isinstance(arguments, dict):
        raise Drop(BAD_TOOL_CALL, f"{where}: arguments must be a JSON object")
    return arguments


def _tool_call(name: Any, arguments: Any, where: str) -> dict:
    if not isinstance(name, str) or not name:
        raise Drop(BAD_TOOL_CALL, f"{where}: the function name must be a non-empty string")
    function = {"name": name, "arguments": _arguments(arguments, where)}
    return {"type": "function", "function": function}


def _openai_tool_call(call: Any, i: int) -> dict:
    where = f"messages[{i}].tool_calls"
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise Drop(BAD_TOOL_CALL, f"{where}: each call needs a 'function' object")
    return _tool_call(function.get("name"), function.get("arguments", {}), where)


def _sharegpt_calls(text: str, i: int) -> list[dict]:
    """A function_call turn: a JSON object ``{"name", "arguments"}`` or a list of them."""
    where = f"conversations[{i}] (function_call)"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise Drop(BAD_TOOL_CALL, f"{where}: not valid JSON: {e}") from e
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls or not all(isinstance(call, dict) for call in calls):
        raise Drop(BAD_TOOL_CALL, f"{where}: expected an object or a list of objects")
    return [_tool_call(call.get("name"), call.get("arguments", {}), where) for call in calls]


def _tools(value: dict) -> tuple[dict, ...] | None:
    """Tool definitions from a list or a JSON string; bare function schemas are wrapped."""
    tools = value.get("tools")
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise Drop(BAD_TOOLS, f"'tools' is not valid JSON: {e}") from e
    if not tools:
        return None
    if not isinstance(tools, list):
        raise Drop(BAD_TOOLS, f"'tools' must be a list, got {type(tools).__name__}")
    normalized = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            function = tool["function"]
        elif isinstance(tool, dict):
            function = tool
        else:
            raise Drop(BAD_TOOLS, f"tools[{i}] must be an object")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise Drop(BAD_TOOLS, f"tools[{i}] has no function name")
        normalized.append({"type": "function", "function": function})
    return tuple(normalized)
