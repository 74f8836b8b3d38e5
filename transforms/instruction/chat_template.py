"""Renders conversations with their chat template and masks the tokens that carry loss: the
instruction branch's entry points, over the modules of ``rendering/``. What is trained, and why,
is in docs/masking.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from transforms.core.vocabulary import TEMPLATE_ERROR, TOO_LONG, Drop
from transforms.instruction.adapters import Conversation
from transforms.instruction.rendering.labels import Labeller
from transforms.instruction.rendering.renderer import (
    DEFAULT_SYSTEM_VARIABLE,
    SYSTEM_NONE,
    SYSTEM_TEMPLATE,
    Renderer,
    reasoning_field,
)
from transforms.instruction.rendering.spans import SpanFinder, trainable
from transforms.instruction.rendering.values import EncodedExample, MaskOptions

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OVERFLOW_POLICIES = ("truncate", "drop")


def encode_conversations(*args: Any, **kwargs: Any) -> list[EncodedExample | Drop]:
    """``start_encoding``'s results, waited for: one per conversation, in order."""
    return start_encoding(*args, **kwargs)()


def start_encoding(
    tok: PreTrainedTokenizerBase,
    conversations: Sequence[Conversation],
    options: MaskOptions,
    system_prompt: str = SYSTEM_TEMPLATE,
    max_tokens: int | None = None,
    overflow: str = "drop",
) -> Callable[[], list[EncodedExample | Drop]]:
    """Render, tokenize and mask a batch of conversations; the returned function gives one
    result per input, in order.

    The conversations are rendered now and their tokens encoded in the background (where the
    tokenizer allows), so between the two the caller's thread is free for other work, such as
    rendering the next batch, while the encoder's threads run outside the GIL.

    ``system_prompt`` is ``"template"``, ``"none"`` or a text, and conversations longer than
    ``max_tokens`` meet the ``overflow`` policy (docs/masking.md, "System prompt", "Overflow").
    One bad record cannot fail the batch: rendering is per conversation and each failure is a
    ``Drop``. The tokenizer is only read: control-token text in content is encoded as plain text
    by a private copy of its backend.
    """
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
    try:
        encoder = _Encoder(tok, options, system_prompt)
    except Exception as e:  # no chat template, or one that does not compile: every record says why
        message = f"chat template unusable: {type(e).__name__}: {e}"
        errors = [Drop(TEMPLATE_ERROR, message) for _ in conversations]
        return lambda: errors
    with encoder.watchdog.watching():  # one watchdog thread for the batch's renders
        started = encoder.start(conversations)

    def finish() -> list[EncodedExample | Drop]:
        with encoder.watchdog.watching():  # overflow renders prefixes again
            results = encoder.finish(started)
            if max_tokens is not None:
                for k, result in enumerate(results):
                    if isinstance(result, EncodedExample) and len(result.input_ids) > max_tokens:
                        results[k] = encoder.fit(conversations[k], result, max_tokens, overflow)
        return results

    return finish


def reasoning_placements(tok: PreTrainedTokenizerBase) -> dict[bool, str]:
    """Where replies' reasoning goes with the tokenizer's template, without and with tools:
    ``field:NAME`` (the template reads it under that name) or ``inline`` (``<think>``)."""
    placements = {}
    for has_tools in (False, True):
        try:
            source = tok.get_chat_template(tools=[{}] if has_tools else None)
        except ValueError:  # no template: its records are rejected anyway
            source = ""
        field = reasoning_field(source)
        placements[has_tools] = f"field:{field}" if field else "inline"
    return placements


def template_default_system(tok: PreTrainedTokenizerBase,
                            system_prompt: str = SYSTEM_TEMPLATE) -> str | None:
    """The system text the tokenizer's chat template writes, under ``system_prompt``, into a
    conversation that has no system message; None where it writes none, or where the template
    cannot render a plain exchange (its records then fail with their own reason)."""
    try:
        renderer = Renderer(tok, system_prompt)
    except Exception:
        return None
    return renderer.default_system()


def check_system_prompt(tok: PreTrainedTokenizerBase, system_prompt: str) -> None:
    """ValueError, before any work, where ``--system_prompt none`` cannot be honoured: the
    template writes its own system text whatever it is passed."""
    if system_prompt != SYSTEM_NONE:
        return
    default = template_default_system(tok, SYSTEM_NONE)
    if default is not None:
        raise ValueError(
            f"--system_prompt none: the chat template writes its own system prompt {default!r} "
            f"into conversations that have none and has no way to leave it out (the built-in "
            f"templates read {DEFAULT_SYSTEM_VARIABLE}=''); use --system_prompt template to keep "
            "it, give a text, or pass a --chat_template without a default")


def check_template_tokens(tok: PreTrainedTokenizerBase, label: str) -> None:
    """ValueError, before any work, where the chat template (``label`` names it in the message)
    writes control markup that the tokenizer does not hold as tokens: another model family's
    template, whose markup every record would be trained on spelled out as text. A template
    that cannot render a plain exchange passes: its records fail with their own reason."""
    try:
        renderer = Renderer(tok)
    except Exception:  # as in template_default_system: the records will say what is wrong
        return
    foreign = renderer.foreign_markup(tok)
    if foreign:
        raise ValueError(
            f"{label} writes {', '.join(foreign)}, which the tokenizer {tok.name_or_path!r} "
            "does not hold as tokens (another model family's template): they would be trained "
            "as plain text; pass the --tokenizer of the template's model, or a template written "
            "for this tokenizer (or --template_markup_as_text=true if it spells its markup as "
            "text by design)")



class _Encoder:
    """A batch's encoding: each conversation rendered and its spans found (``SpanFinder``), then
    labelled (``Labeller``), and held to ``max_tokens`` (``fit``)."""

    def __init__(self, tok: PreTrainedTokenizerBase, options: MaskOptions,
                 system_prompt: str = SYSTEM_TEMPLATE) -> None:
        self.renderer = Renderer(tok, system_prompt)
        self.spans = SpanFinder(self.renderer, options)
        self.labeller = Labeller(tok, options, self.renderer.control)
        self.watchdog = self.renderer.sandbox.watchdog

    def encode(self, conversations: Sequence[Conversation]) -> list[EncodedExample | Drop]:
        return self.finish(self.start(conversations))

    def start(self, conversations: Sequence[Conversation]) -> _Started:
        """Renders the conversations and starts encoding the plain ones in the background."""
        results: list[EncodedExample | Drop | None] = []
        rendered = []
        for conversation in conversations:
            try:
                rendered.append(self.spans.render(conversation))
                results.append(None)
            except Drop as e:
                results.append(e)
        return _Started(results, self.labeller.start(rendered))

    def finish(self, started: _Started) -> list[EncodedExample | Drop]:
        """Each conversation's example or drop, in order, once its tokens are in."""
        examples = iter(started.examples())
        return [result if result is not None else next(examples) for result in started.results]

    def fit(self, conversation: Conversation, example: EncodedExample, max_tokens: int,
            overflow: str) -> EncodedExample | Drop:
        """The overflow policy for one conversation longer than ``max_tokens``."""
        too_long = f"{len(example.input_ids)} tokens > seq_len {max_tokens}"
        if overflow == "drop":
            return Drop(TOO_LONG, too_long)
        messages = self.renderer.messages(conversation)
        ends = [i + 1 for i, m in enumerate(messages[:-1]) if trainable(m)]
        # Longer prefixes render to more tokens: binary search for the longest that fits.
        best, low, high = None, 0, len(ends) - 1
        while low <= high:
            middle = (low + high) // 2
            prefix = Conversation(tuple(messages[: ends[middle]]), conversation.tools)
            (result,) = self.encode([prefix])
            if isinstance(result, EncodedExample) and len(result.input_ids) <= max_tokens:
                best, low = result, middle + 1
            else:
                high = middle - 1
        if best is None:
            return Drop(TOO_LONG, f"{too_long}, and no prefix of it that ends with an "
                        "assistant turn fits")
        return dataclasses.replace(best, tokens_cut=len(example.input_ids) - len(best.input_ids))


@dataclasses.dataclass(frozen=True)
class _Started:
    """A batch whose texts are rendered and whose plain texts' tokens are on their way."""

    results: list[EncodedExample | Drop | None]  # None: an example to come
    examples: Callable[[], list[EncodedExample | Drop]]  # the examples to come, in order
