"""What a chat template sees of a conversation, and the text it renders: the system prompt
added or left out, reasoning written inline for templates that do not read it, and the checks
made on a template before any work (its default system text, another model family's markup).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from transforms.core.fields import REASONING_CONTENT, TURN_REASONING_FIELDS
from transforms.core.tokenizer import BUILTIN_TEMPLATES, builtin_template
from transforms.core.vocabulary import (
    CONTROL_TOKEN_TEXT,
    TEMPLATE_ERROR,
    TOOLS_NOT_RENDERED,
    TURN_NOT_LOCATED,
    Drop,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.rendering.control_tokens import ControlTokens
from transforms.instruction.rendering.sandbox import RenderTimeout, Sandbox

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# ``system_prompt`` values that are not a text (docs/masking.md, "System prompt").
SYSTEM_TEMPLATE, SYSTEM_NONE = "template", "none"
# The template variable through which ``SYSTEM_NONE`` asks a template to leave its default out.
DEFAULT_SYSTEM_VARIABLE = "default_system_message"

PROBE = "\ufdd2\ufdd3"  # stands for a reply's reasoning while it is located (no newline: kept
# as it is by the templates' strip('\n'))
# Markup that is a control token in every family that writes it; ``[INST]`` is not checked,
# since older Mistral tokenizers spell it out by design.
_CONTROL_MARKUP = re.compile(r"<\|[^|\s]{1,64}\|>"  # ChatML, Llama 3
                             r"|<\uff5c[^\uff5c\s]{1,64}\uff5c>"  # DeepSeek's full-width bars
                             r"|<(?:start|end)_of_turn>")  # Gemma
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Renderer:
    """What rendering needs from one tokenizer and template, looked up once per batch."""

    def __init__(self, tok: PreTrainedTokenizerBase, system_prompt: str = SYSTEM_TEMPLATE
                 ) -> None:
        # The system message added to conversations without one, if any.
        self.system_prompt = (None if system_prompt in (SYSTEM_TEMPLATE, SYSTEM_NONE)
                              else system_prompt)
        sources = {has_tools: tok.get_chat_template(tools=[{}] if has_tools else None)
                   for has_tools in (False, True)}
        self.sandbox = Sandbox(sources)
        self.has_markers = {k: bool(_GENERATION_TAG.search(t)) for k, t in sources.items()}
        self.reasoning_field = {k: reasoning_field(t) for k, t in sources.items()}
        self.template_kwargs = dict(tok.special_tokens_map)
        if system_prompt == SYSTEM_NONE:
            self.template_kwargs[DEFAULT_SYSTEM_VARIABLE] = ""
        self.control = ControlTokens(tok, tuple(sources.values()))
        self._tok = tok

    def messages(self, conversation: Conversation) -> list[dict]:
        """The messages the template sees: the system prompt added where there is none, and
        reasoning where the template reads it: under its own field name (``thinking`` for
        harmony), or inline in the reply for a template that reads none (``inline_reasoning``)."""
        messages = list(conversation.messages)
        if self.added_in_front(conversation):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        field = self.reasoning_field[bool(conversation.tools)]
        if field is None:
            return [inline_reasoning(m) if REASONING_CONTENT in m else m for m in messages]
        if field != REASONING_CONTENT:
            return [_renamed(m, field) if REASONING_CONTENT in m else m for m in messages]
        return messages

    def added_in_front(self, conversation: Conversation) -> int:
        """How many messages ``messages`` puts before the conversation's own."""
        return int(bool(self.system_prompt)
                   and not any(m["role"] == "system" for m in conversation.messages))

    def render_text(self, messages: Sequence[dict], tools: list[dict] | None,
                    generation_prompt: bool = False,
                    blocks: list[tuple[int, int]] | None = None) -> str:
        """The template's text; ``blocks``, where given, receives the character spans of its
        ``{% generation %}`` blocks (``Sandbox.render``). May raise ``RenderTimeout``."""
        return self.sandbox.render(tools is not None, {
            "messages": messages, "tools": tools, "documents": None,
            "add_generation_prompt": generation_prompt, **self.template_kwargs}, blocks)

    def with_fix(self, drop: Drop) -> Drop:
        """``drop`` with the option that would avoid it, for the reasons about templates."""
        builtin = self._builtin_with_tools
        named = f"--chat_template {builtin}, " if builtin else "a --chat_template "
        fixes = {
            TOOLS_NOT_RENDERED: f"pass {named}" + ("the built-in template of this tokenizer's "
                                                   "family, which renders tools" if builtin
                                                   else "that renders tools"),
            TURN_NOT_LOCATED: "pass --assistant_turns=last to train only the last reply, or a "
            "--chat_template marked with {% generation %} (docs/masking.md)",
            TEMPLATE_ERROR: "if the template cannot render such records, pass "
            + (f"{named}the built-in template of this tokenizer's family" if builtin
               else "a --chat_template that can"),
            CONTROL_TOKEN_TEXT: "pass a --chat_template that writes content as it is",
        }
        fix = fixes.get(drop.reason)
        return drop if fix is None or fix in drop.message else Drop(
            drop.reason, f"{drop.message}; {fix}")

    @functools.cached_property
    def _builtin_with_tools(self) -> str | None:
        """The first built-in template that renders tool calls and whose control markup this
        tokenizer holds as tokens (``llama3`` for a Llama 3.1 tokenizer), if it is not the
        template in use."""
        in_use = set(self.sandbox.sources.values())
        for name in BUILTIN_TEMPLATES:
            source = builtin_template(name)
            markup = set(_CONTROL_MARKUP.findall(source))
            if (source not in in_use and "tool_calls" in source and markup
                    and all(len(self._tok.encode(m, add_special_tokens=False)) == 1
                            for m in markup)):
                return name
        return None

    def default_system(self) -> str | None:
        """The system text the template writes into a conversation that has no system message
        (None: it writes none), found by rendering a short exchange with a probe system message
        and without one: a template that fills in a default renders the same text around it."""
        exchange = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        probed = [{"role": "system", "content": PROBE}, *exchange]
        with self.sandbox.watchdog.watching():
            try:
                bare, full = (self.render_text(m, None) for m in (exchange, probed))
            except (Exception, RenderTimeout):  # a template that cannot say: records will
                return None
        before, found, after = full.partition(PROBE)
        if (not found or len(bare) < len(before) + len(after) or not bare.startswith(before)
                or not bare.endswith(after)):
            return None
        return bare[len(before):len(bare) - len(after)] or None

    def foreign_markup(self, tok: PreTrainedTokenizerBase) -> list[str]:
        """Control markup in a rendered exchange (``<|name|>``, DeepSeek's full-width form,
        Gemma's turn markers) that the tokenizer encodes as more than one token."""
        exchange = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        with self.sandbox.watchdog.watching():
            try:
                text = self.render_text(exchange, None)
            except (Exception, RenderTimeout):
                return []
        found = dict.fromkeys(_CONTROL_MARKUP.findall(text))
        return [markup for markup in found
                if len(tok.encode(markup, add_special_tokens=False)) != 1]


def reasoning_field(source: str) -> str | None:
    """The name under which a template reads a reply's reasoning (the first of
    ``TURN_REASONING_FIELDS`` it reads as a message's attribute or key), or None."""
    for name in TURN_REASONING_FIELDS:
        if re.search(rf"\.{name}\b|\[\s*['\"]{name}['\"]\s*\]|['\"]{name}['\"]\s+(?:not\s+)?in\s",
                     source):
            return name
    return None


def _renamed(message: dict, field: str) -> dict:
    message = dict(message)
    message[field] = message.pop(REASONING_CONTENT)
    return message


def inline_reasoning(message: dict) -> dict:
    """``message`` with its ``reasoning_content`` written before its content in the common
    ``<think>`` form, for templates that do not render the field themselves."""
    message = dict(message)
    reasoning = message.pop(REASONING_CONTENT)
    if reasoning:
        message["content"] = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{message['content']}"
    return message
