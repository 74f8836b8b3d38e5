"""Control tokens in content: the text of a template's control tokens (``<|im_end|>``) inside a
message is found and marked, so that it is encoded as plain text and no message can forge turn
structure (docs/masking.md, "Control-token text in content").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from transforms.core.records import strings_in

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Unicode noncharacters ("for internal use"): they wrap control-token text found in content.
_MARK_START, _MARK_END = "\ufdd0", "\ufdd1"


class ControlTokens:
    """One tokenizer's control tokens for its templates, and how their text is found in content,
    marked there and unmarked again."""

    def __init__(self, tok: PreTrainedTokenizerBase, templates: tuple[str, ...]) -> None:
        controls = _control_tokens(tok, templates)
        self.ids = frozenset(tok.convert_tokens_to_ids(list(controls)))
        self.pattern = alternation(controls)
        self.joiner = "\0" if not any("\0" in token for token in controls) else None
        self.markers = re.compile(
            f"{_MARK_START}({self.pattern.pattern}){_MARK_END}|[{_MARK_START}{_MARK_END}]")

    def held_in(self, messages: list[dict], tools: list[dict] | None) -> bool:
        """Whether any content, tool call or tool definition holds a control token's text."""
        search = self.pattern.search
        contents = [m["content"] for m in messages]
        # One search over all contents where no control token holds the separator (then no
        # match can span two messages).
        if (search(self.joiner.join(contents)) if self.joiner is not None
                else any(map(search, contents))):
            return True
        calls = [m["tool_calls"] for m in messages if "tool_calls" in m]
        return bool(calls or tools) and any(search(text) for text in strings_in((calls, tools)))

    def mark(self, value: Any) -> Any:
        """``value`` with this tokenizer's control-token text marked (``_mark``)."""
        return _mark(value, self.pattern)

    def unmark(self, marked: str) -> str:
        """A marked text as it was before marking."""
        return self.markers.sub(_unmark, marked)


def _control_tokens(tok: PreTrainedTokenizerBase, templates: tuple[str, ...]) -> tuple[str, ...]:
    """The added tokens that structure a chat, as transformers' ``sanitize_control_tokens``
    defines them: special tokens, plus ``tok.chat_control_tokens`` where the tokenizer lists
    them, else the added tokens the template itself writes (whitespace tokens excepted)."""
    listed = getattr(tok, "chat_control_tokens", None)
    text = "\0".join(templates)

    def is_control(token: Any) -> bool:
        if token.special:
            return True
        if listed is not None:
            return token.content in listed
        return token.content in text and not token.content.isspace()

    return tuple(t.content for t in tok.added_tokens_decoder.values() if is_control(t))


def alternation(tokens: tuple[str, ...]) -> re.Pattern:
    """A regex matching any of ``tokens``, longest first. A plain alternation of literals: the
    regex engine scans for their common prefix (or their first characters) itself, 2 to 14
    times faster than with a first-character lookahead in front (measured on the bench's
    conversations with the control tokens of five families)."""
    if not tokens:
        return re.compile("(?!)")  # matches nothing
    ordered = sorted(tokens, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered)))


def _mark(value: Any, pattern: re.Pattern) -> Any:
    """A copy of ``value`` with every control token's text in its strings wrapped in markers."""
    if isinstance(value, str):
        return pattern.sub(lambda m: f"{_MARK_START}{m.group()}{_MARK_END}", value)
    if isinstance(value, dict):
        return {key: _mark(item, pattern) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(item, pattern) for item in value]
    return value


def _unmark(match: re.Match) -> str:
    return match.group(1) or ""

