"""What makes a parsed JSON value unfit to be a record, for the JSON readers: nesting too deep
to pass between Beam stages, a value that is not an object, and text no UTF-8 output can hold.
Each is a record rejected with its reason, never a crash downstream.
"""

from __future__ import annotations

import re

from transforms.core.vocabulary import LONE_SURROGATE, NOT_AN_OBJECT, TOO_DEEPLY_NESTED, Drop

# ValueError: besides JSONDecodeError, an integer of more than 4,300 digits (Python's limit on
# int-string conversion). RecursionError: JSON nested deeper than the parser's stack. Both are
# hostile records, not crashes.
JSON_ERRORS = (ValueError, RecursionError)
# Deeper values parse but cannot be pickled between Beam stages; no real record nests this deep.
MAX_JSON_DEPTH = 64
_DEPTH_MESSAGE = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
# JSON may escape half of a surrogate pair alone ("\ud800"): json.loads gives a str that no
# UTF-8 output can hold, which would fail far downstream. Only text holding such an escape
# (a backslash, u, then D8-DF) is scanned for one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_MESSAGE = ("JSON string escapes a lone surrogate (half of a UTF-16 pair, "
                      "e.g. \\ud800), which is not Unicode text")


def parse_error_message(error: Exception) -> str:
    return "JSON nested too deeply to parse" if isinstance(error, RecursionError) else str(error)


def may_nest_too_deeply(text: str) -> bool:
    """Each level of nesting opens with a bracket: text with few cannot nest too deeply, and
    then the walk is skipped."""
    return text.count("{") + text.count("[") > MAX_JSON_DEPTH


def may_hold_lone_surrogate(text: str) -> bool:
    return _SURROGATE_ESCAPE.search(text) is not None


def unfit_record(value: object, deep: bool, surrogates: bool) -> Drop | None:
    """Why the parsed ``value`` cannot be a record, or None; ``deep`` and ``surrogates`` say
    whether its text may nest too deeply or hold a lone surrogate (the walks are skipped
    otherwise)."""
    if deep and _too_deep(value):
        return Drop(TOO_DEEPLY_NESTED, _DEPTH_MESSAGE)
    if not isinstance(value, dict):
        return Drop(NOT_AN_OBJECT, f"a JSON {type(value).__name__}, not an object")
    if surrogates and _holds_lone_surrogate(value):
        return Drop(LONE_SURROGATE, _SURROGATE_MESSAGE)
    return None


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _too_deep(value: object) -> bool:
    """Whether ``value`` nests lists and objects deeper than MAX_JSON_DEPTH (iteratively)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, dict | list))
    return False


def _holds_lone_surrogate(value: object) -> bool:
    """Whether a string, an object key or a value nested in ``value`` holds a lone surrogate
    (iteratively; the parser joins a valid escaped pair into one character)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and not is_utf8(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False
