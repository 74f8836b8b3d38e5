"""Record schemas for the instruction formats, and the conversation rules a schema cannot say.

Each instruction format (``messages``, ``sharegpt``, ``prompt_response``, ``alpaca``,
``transcript``) has a tensorflow-metadata ``Schema`` in text format under
``transforms/instruction/schemas/FORMAT.pbtxt``. It describes the record as the user stores it
(after the
``#canonical=field`` mapping of its input), so its feature names and role domains are the ones
in the user's files: ShareGPT speakers are ``human``/``gpt``, not ``user``/``assistant``. A user
replaces one with ``--schema FORMAT=PATH``. TFDV cannot be installed beside this stack, so
``RecordSchema`` enforces the per-record part of a schema itself, on every record:

* presence: ``presence { min_fraction: 1.0 }`` makes a feature required (absent or null is
  ``schema_missing_feature``); any lower fraction makes it optional. ``min_count`` is a
  dataset-level statistic and is not checked per record.
* type: ``BYTES`` is a string, ``INT`` an integer (not a boolean), ``FLOAT`` a number, ``STRUCT``
  an object (``schema_wrong_type``). A list holds several values of the type.
* ``value_count { min max }``: how many values the feature holds in one record, e.g. the number
  of turns in ``messages`` (``schema_value_count``). JSON tells one value from a list, so a
  feature whose ``max`` is 1 must be a single value and one that allows more must be a list
  (``schema_wrong_type``); without ``value_count`` either is accepted.
* domains: ``string_domain`` (inline or named by ``domain``), ``int_domain`` and
  ``float_domain`` bounds (``schema_domain``).
* ``struct_domain``: the same rules for the fields of every object of a ``STRUCT`` feature.

Features that are deprecated or in a non-production lifecycle stage are not enforced, as in
TFDV; annotations and dataset-level constraints (distribution, skew, drift, uniqueness) are
ignored; anything else that would change the per-record meaning (shape, environments, sparse
features, other domains) is refused when the schema is loaded rather than silently skipped.
Fields a schema does not declare are not checked.

``check_conversation`` holds the rules about the canonical conversation that a schema cannot
express: at least one assistant turn, roles in a valid order, no empty assistant turn, and
optional limits on turns and characters.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
from collections.abc import Iterator, Mapping
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from transforms.core.vocabulary import (
    BAD_ROLE_ORDER,
    EMPTY_ASSISTANT_TURN,
    INSTRUCTION_FORMATS,
    NO_ASSISTANT_TURN,
    SCHEMA_DOMAIN,
    SCHEMA_MISSING_FEATURE,
    SCHEMA_VALUE_COUNT,
    SCHEMA_WRONG_TYPE,
    TOO_MANY_CHARS,
    TOO_MANY_TURNS,
    Drop,
)
from transforms.instruction.adapters import Conversation

# Reason codes (rejected/). Schema violations carry the "schema_" prefix.

_TYPES = {
    schema_pb2.BYTES: "BYTES",
    schema_pb2.INT: "INT",
    schema_pb2.FLOAT: "FLOAT",
    schema_pb2.STRUCT: "STRUCT",
}
_TYPE_HELP = {"BYTES": "a string", "INT": "an integer", "FLOAT": "a number",
              "STRUCT": "an object"}
_ENFORCED_STAGES = (schema_pb2.UNKNOWN_STAGE, schema_pb2.BETA, schema_pb2.PRODUCTION)
# Schema and Feature fields that are enforced, or that describe the dataset rather than a record.
_SCHEMA_FIELDS = {"feature", "string_domain", "int_domain", "float_domain", "annotation"}
_FEATURE_FIELDS = {
    "name", "type", "presence", "value_count", "domain", "string_domain", "int_domain",
    "float_domain", "struct_domain", "deprecated", "lifecycle_stage", "annotation",
    "distribution_constraints", "skew_comparator", "drift_comparator", "unique_constraints",
}




@dataclasses.dataclass(frozen=True)
class FeatureRule:
    """One feature of a schema, compiled to what a per-record check needs."""

    name: str
    type: str  # BYTES, INT, FLOAT or STRUCT
    required: bool
    min_count: int | None
    max_count: int | None
    shape: str = "any"  # "scalar" (value_count max 1), "list" (more allowed) or "any"
    strings: frozenset[str] | None = None  # allowed string values
    domain_name: str = ""  # for messages: the named domain, or the feature's name
    low: float | None = None  # numeric domain bounds, inclusive
    high: float | None = None
    finite: bool = False  # float_domain disallow_nan / disallow_inf
    fields: tuple[FeatureRule, ...] = ()  # struct_domain features

    def check(self, value: Any, path: str) -> None:
        values = self._values(value, path)
        if values is None:
            return
        count = len(values)
        if (self.min_count is not None and count < self.min_count) or (
            self.max_count is not None and count > self.max_count
        ):
            raise Drop(SCHEMA_VALUE_COUNT, f"{path} has {count} value(s); the schema allows "
                          f"{_range_text(self.min_count, self.max_count)}")
        for i, item in enumerate(values):
            where = f"{path}[{i}]" if isinstance(value, list) else path
            self._check_value(item, where)

    def _values(self, value: Any, path: str) -> list | None:
        """The feature's values, or None when it is absent and may be."""
        if value is None:
            if self.required:
                raise Drop(SCHEMA_MISSING_FEATURE, f"required feature {path} is missing")
            return None
        if self.shape == "scalar" and isinstance(value, list):
            raise Drop(SCHEMA_WRONG_TYPE, f"{path} must be one {self.type} value "
                          f"({_TYPE_HELP[self.type]}), got a list")
        if self.shape == "list" and not isinstance(value, list):
            raise Drop(SCHEMA_WRONG_TYPE, f"{path} must be a list of {self.type} values, "
                          f"got {_json_type(value)}")
        return value if isinstance(value, list) else [value]

    def _check_value(self, item: Any, where: str) -> None:
        if not _has_type(item, self.type):
            raise Drop(SCHEMA_WRONG_TYPE, f"{where} must be {self.type} "
                          f"({_TYPE_HELP[self.type]}), got {_json_type(item)}")
        if self.strings is not None and item not in self.strings:
            allowed = ", ".join(sorted(self.strings))
            raise Drop(SCHEMA_DOMAIN, f"{where} is {_short(item)}, not in domain "
                          f"{self.domain_name!r} ({allowed})")
        if self.type in ("INT", "FLOAT"):
            self._check_number(item, where)
        for rule in self.fields:
            rule.check(item.get(rule.name), f"{where}.{rule.name}")

    def _check_number(self, item: float, where: str) -> None:
        if self.finite and not math.isfinite(item):
            raise Drop(SCHEMA_DOMAIN, f"{where} is {item}, not a finite number")
        if (self.low is not None and item < self.low) or (
            self.high is not None and item > self.high
        ):
            raise Drop(SCHEMA_DOMAIN, f"{where} is {item}, outside domain "
                              f"{self.domain_name!r} [{_range_text(self.low, self.high)}]")


@dataclasses.dataclass(frozen=True)
class RecordSchema:
    """A compiled ``Schema``: ``check`` raises ``Drop`` at the first rule a record breaks.

    Features are checked in the order the schema lists them, so a record gets one precise reason.
    """

    source: str  # where it came from, for messages and the manifest
    features: tuple[FeatureRule, ...]

    def check(self, record: Mapping[str, Any]) -> None:
        for rule in self.features:
            rule.check(record.get(rule.name), rule.name)

    @classmethod
    def parse(cls, text: str, source: str) -> RecordSchema:
        """Parses ``.pbtxt`` text; a syntax error or an unsupported construct is a ValueError."""
        try:
            schema = text_format.Parse(text, schema_pb2.Schema())
        except text_format.ParseError as e:
            raise ValueError(f"schema {source}: not a tensorflow-metadata Schema: {e}") from e
        _refuse_unsupported(schema, _SCHEMA_FIELDS, f"schema {source}")
        domains = _named_domains(schema)
        features = tuple(_compile(f, domains, source) for f in schema.feature if _enforced(f))
        if not features:
            raise ValueError(f"schema {source} declares no feature to enforce")
        return cls(source, features)


def load_schema(path: str) -> RecordSchema:
    """Reads a ``.pbtxt`` schema from a local path or any Beam filesystem (``gs://``)."""
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read schema {path}: {e}") from e
    return RecordSchema.parse(text, path)


def builtin_schema(fmt: str) -> RecordSchema:
    """The schema shipped with the package for an instruction format."""
    name = f"{fmt}.pbtxt"
    folder = importlib.resources.files("transforms.instruction").joinpath("schemas")
    text = folder.joinpath(name).read_text("utf-8")
    return RecordSchema.parse(text, f"builtin:{name}")


def load_schemas(overrides: Mapping[str, str]) -> dict[str, RecordSchema]:
    """One schema per format: the user's (``--schema FORMAT=PATH``) or the built-in one."""
    unknown = sorted(set(overrides) - set(INSTRUCTION_FORMATS))
    if unknown:
        raise ValueError(f"--schema names unknown format(s) {unknown}; formats are "
                         f"{INSTRUCTION_FORMATS}")
    return {fmt: load_schema(overrides[fmt]) if fmt in overrides else builtin_schema(fmt)
            for fmt in INSTRUCTION_FORMATS}


def _compile(feature: schema_pb2.Feature, domains: dict, source: str) -> FeatureRule:
    where = f"schema {source}, feature {feature.name!r}"
    if not feature.name:
        raise ValueError(f"schema {source}: a feature has no name")
    _refuse_unsupported(feature, _FEATURE_FIELDS, where)
    if feature.type not in _TYPES:
        raise ValueError(f"{where}: needs a type (BYTES, INT, FLOAT or STRUCT)")
    kind = _TYPES[feature.type]
    domain = _domain(feature, domains, where)
    if feature.HasField("struct_domain") and kind != "STRUCT":
        raise ValueError(f"{where}: struct_domain needs type STRUCT")
    if domain is not None and _DOMAIN_TYPES[type(domain)] != kind:
        raise ValueError(f"{where}: a {type(domain).__name__} does not fit type {kind}")
    count = feature.value_count
    max_count = count.max if count.HasField("max") else None
    shape = "any"
    if feature.HasField("value_count"):
        shape = "scalar" if max_count == 1 else "list"
    rule = FeatureRule(
        name=feature.name,
        type=kind,
        required=feature.presence.min_fraction >= 1.0,
        min_count=count.min if count.HasField("min") else None,
        max_count=max_count,
        shape=shape,
        domain_name=feature.domain or feature.name,
        fields=tuple(_compile(f, domains, source) for f in feature.struct_domain.feature
                     if _enforced(f)),
    )
    if isinstance(domain, schema_pb2.StringDomain):
        return dataclasses.replace(rule, strings=frozenset(domain.value))
    if domain is not None:
        return dataclasses.replace(
            rule,
            low=domain.min if domain.HasField("min") else None,
            high=domain.max if domain.HasField("max") else None,
            finite=isinstance(domain, schema_pb2.FloatDomain)
            and (domain.disallow_nan or domain.disallow_inf),
        )
    return rule


_DOMAIN_TYPES = {schema_pb2.StringDomain: "BYTES", schema_pb2.IntDomain: "INT",
                 schema_pb2.FloatDomain: "FLOAT"}


def _domain(feature: schema_pb2.Feature, domains: dict, where: str):
    """The feature's string, int or float domain (inline or named), or None."""
    kind = feature.WhichOneof("domain_info")
    if kind in (None, "struct_domain"):
        return None
    if kind == "domain":
        if feature.domain not in domains:
            raise ValueError(f"{where}: no top-level domain named {feature.domain!r}")
        return domains[feature.domain]
    return getattr(feature, kind)


def _named_domains(schema: schema_pb2.Schema) -> dict:
    return {d.name: d for d in (*schema.string_domain, *schema.int_domain, *schema.float_domain)}


def _enforced(feature: schema_pb2.Feature) -> bool:
    return not feature.deprecated and feature.lifecycle_stage in _ENFORCED_STAGES


def _refuse_unsupported(message, allowed: set[str], where: str) -> None:
    extra = sorted(f.name for f, _ in message.ListFields() if f.name not in allowed)
    if extra:
        raise ValueError(f"{where}: {', '.join(extra)} cannot be checked per record; "
                         f"supported: {', '.join(sorted(allowed))}")


def _has_type(item: Any, kind: str) -> bool:
    if kind == "BYTES":
        return isinstance(item, str)
    if kind == "STRUCT":
        return isinstance(item, dict)
    if isinstance(item, bool):
        return False
    return isinstance(item, int) or (kind == "FLOAT" and isinstance(item, float))


def _json_type(item: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
             dict: "an object", list: "a list"}
    return names.get(type(item), type(item).__name__)


def _range_text(low: float | None, high: float | None) -> str:
    return f"{'' if low is None else low}..{'' if high is None else high}"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- rules about the canonical conversation ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConversationLimits:
    """Size limits; 0 means no limit."""

    max_turns: int = 0  # messages, after adaptation (a system field counts as one)
    max_chars: int = 0  # characters of message content, summed over the conversation


def check_conversation(conversation: Conversation, limits: ConversationLimits) -> None:
    """Raises ``Drop`` when the conversation cannot be a sound SFT example.

    Checked in this order: size limits, at least one assistant turn, role order, no empty
    assistant turn. The valid role order is: an optional system message first (and nowhere
    else), then a user message, then user and assistant alternating; an assistant message with
    tool calls is followed by one or more tool results, which are followed by an assistant
    message. The conversation may end with any role.
    """
    messages = conversation.messages
    if limits.max_turns and len(messages) > limits.max_turns:
        raise Drop(TOO_MANY_TURNS,
                      f"{len(messages)} messages > --max_turns {limits.max_turns}")
    if limits.max_chars:
        chars = sum(len(m["content"]) for m in messages)
        if chars > limits.max_chars:
            raise Drop(TOO_MANY_CHARS,
                          f"{chars} characters of content > --max_chars {limits.max_chars}")
    if not any(m["role"] == "assistant" for m in messages):
        raise Drop(NO_ASSISTANT_TURN, "the conversation has no assistant message")
    problem = next(_order_problems(messages), None)
    if problem is not None:
        raise Drop(BAD_ROLE_ORDER, f"messages[{problem[0]}]: {problem[1]}")
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and not m["content"].strip() and not m.get("tool_calls"):
            raise Drop(EMPTY_ASSISTANT_TURN,
                          f"messages[{i}] is an assistant message with no content or tool call")


# The roles each role may be followed by; "call" is an assistant message with tool calls.
_NEXT = {
    "system": ("user",),
    "user": ("assistant", "call"),
    "assistant": ("user",),
    "call": ("tool",),
    "tool": ("tool", "assistant", "call"),
}


def _order_problems(messages: tuple[dict, ...]) -> Iterator[tuple[int, str]]:
    kinds = ["call" if m.get("tool_calls") else m["role"] for m in messages]
    first = 1 if kinds[0] == "system" else 0
    if first < len(kinds) and kinds[first] != "user":
        opener = messages[first]["role"]
        yield first, f"the conversation must open with a user message, not {opener}"
    for i in range(1, len(kinds)):
        if kinds[i] == "system":
            yield i, "a system message may only come first"
        if kinds[i] not in _NEXT[kinds[i - 1]]:
            yield i, f"{_role_text(kinds[i])} cannot follow {_role_text(kinds[i - 1])}"


def _role_text(kind: str) -> str:
    return {"call": "an assistant tool call", "assistant": "an assistant message"}.get(
        kind, f"a {kind} message")
