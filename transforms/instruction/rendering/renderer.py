"""What a chat template sees of a conversation, and the text it renders: the system prompt
added or left out, reasoning written inline for templates that do not read it, and the checks
made on a template before any work (its default system text, another model family's markup).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from transforms.core.fields import REASONING_CONTENT
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
        self.renders_reasoning = {k: REASONING_CONTENT in t for k, t in sources.items()}
        self.template_kwargs = dict(tok.special_tokens_map)
        if system_prompt == SYSTEM_NONE:
            self.template_kwargs[DEFAULT_SYSTEM_VARIABLE] = ""
        self.control = ControlTokens(tok, tuple(sources.values()))

    def messages(self, conversation: Conversation) -> list[dict]:
        """The messages the template sees: the system prompt added where there is none, and
        reasoning inline in the reply for a template that does not render ``reasoning_content``
        itself (``inline_reasoning``)."""
        messages = list(conversation.messages)
        if self.added_in_front(conversation):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if not self.renders_reasoning[bool(conversation.tools)]:
            messages = [inline_reasoning(m) if REASONING_CONTENT in m else m for m in messages]
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


def inline_reasoning(message: dict) -> dict:
    """``message`` with its ``reasoning_content`` written before its content in the common
    ``<think>`` form, for templates that do not render the field themselves."""
    message = dict(message)
    reasoning = message.pop(REASONING_CONTENT)
    if reasoning:
        message["content"] = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{message['content']}"
    return message
