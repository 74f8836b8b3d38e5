"""Field names that reading, routing and the instruction branch share, and the mapping of a
user's declared source fields (``#prompt=question``) onto them.

They live at the bottom of the tree so that reading can check a mapping before any work and
routing can apply it, without either importing a branch.
"""

from __future__ import annotations

from typing import Any

REASONING_CONTENT = "reasoning_content"  # a turn's reasoning, as chat templates read it
REASONING = "reasoning"  # a record's reasoning, for the single-reply formats
THINKING = "thinking"  # a turn's reasoning, as OpenAI's harmony template (GPT-OSS) reads it
# The names under which a turn's reasoning arrives, and under which templates read it.
TURN_REASONING_FIELDS = (REASONING_CONTENT, THINKING, REASONING)
# Canonical fields a record may lack even when its input maps them: a web page without its URL
# is still a document.
OPTIONAL_FIELDS = frozenset({"url"})


def apply_field_map(value: dict, field_map: dict[str, str]) -> dict:
    """Renames declared source fields to canonical names; a declared field must be present,
    but for ``OPTIONAL_FIELDS``.

    ``reasoning=FIELD`` on a record that holds its turns (``messages``, ``conversations``) names
    a field of each turn instead, which becomes the turn's ``reasoning_content``.
    """
    if not field_map:
        return value
    field_map = dict(field_map)
    turn_field = field_map.pop(REASONING, None) if _holds_turns(value, field_map) else None
    missing = [source for canonical, source in field_map.items()
               if source not in value and canonical not in OPTIONAL_FIELDS]
    if missing:
        raise KeyError(", ".join(missing))
    mapped = {k: v for k, v in value.items() if k not in field_map.values()}
    for canonical, source in field_map.items():
        if source in value:
            mapped[canonical] = value[source]
    if turn_field is not None:
        for key in ("messages", "conversations"):
            if isinstance(mapped.get(key), list):
                mapped[key] = [_renamed(turn, turn_field, REASONING_CONTENT)
                               for turn in mapped[key]]
    return mapped


def _holds_turns(value: dict, field_map: dict[str, str]) -> bool:
    return any(key in field_map or key in value for key in ("messages", "conversations"))


def _renamed(turn: Any, source: str, target: str) -> Any:
    if not isinstance(turn, dict) or source not in turn:
        return turn
    renamed = {k: v for k, v in turn.items() if k != source}
    renamed[target] = turn[source]
    return renamed
