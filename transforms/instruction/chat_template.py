"""Renders conversations with their chat template and masks the tokens that carry loss: the
instruction branch's entry points. What is trained, and why, is in docs/masking.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from transforms.core.fields import REASONING_CONTENT
from transforms.core.vocabulary import (
    CONTROL_TOKEN_TEXT,
    FULL_RENDER,
    GENERATION_MARKERS,
    NO_TRAINED_TOKENS,
    PREFIX,
    TEMPLATE_ERROR,
    TOO_LONG,
    TOOLS_NOT_RENDERED,
    TURN_NOT_LOCATED,
    Drop,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.rendering.labels import Labeller
from transforms.instruction.rendering.renderer import (
    DEFAULT_SYSTEM_VARIABLE,
    PROBE,
    SYSTEM_NONE,
    SYSTEM_TEMPLATE,
    Renderer,
)
from transforms.instruction.rendering.sandbox import RenderTimeout
from transforms.instruction.rendering.values import EncodedExample, MaskOptions, Rendered

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OVERFLOW_POLICIES = ("truncate", "drop")


@dataclasses.dataclass(frozen=True)
class _Started:
    """A batch whose texts are rendered and whose plain texts' tokens are on their way."""

    results: list[EncodedExample | Drop | None]  # None: an example to come
    examples: Callable[[], list[EncodedExample | Drop]]  # the examples to come, in order


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
    """What encoding needs from one tokenizer and template, looked up once per batch."""

    def __init__(self, tok: PreTrainedTokenizerBase, options: MaskOptions,
                 system_prompt: str = SYSTEM_TEMPLATE) -> None:
        self.renderer = Renderer(tok, system_prompt)
        self.options = options
        self.watchdog = self.renderer.sandbox.watchdog
        self.stage = ""  # what is being rendered, for error messages
        self.control = self.renderer.control
        self.labeller = Labeller(tok, options, self.control)

    def encode(self, conversations: Sequence[Conversation]) -> list[EncodedExample | Drop]:
        return self.finish(self.start(conversations))

    def start(self, conversations: Sequence[Conversation]) -> _Started:
        """Renders the conversations and starts encoding the plain ones in the background."""
        results: list[EncodedExample | Drop | None] = []
        rendered: list[Rendered] = []
        for conversation in conversations:
            try:
                rendered.append(self._render(conversation))
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
        ends = [i + 1 for i, m in enumerate(messages[:-1]) if _trainable(m)]
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

    def _render(self, conversation: Conversation) -> Rendered:
        """The full text and the character spans to train, or ``Drop``."""
        messages = self.renderer.messages(conversation)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if self.options.last_turn_only:
            turns = turns[-1:]
        # A turn with nothing to say teaches the model to stop at once; it is not trained.
        turns = [i for i in turns if _trainable(messages[i])]
        if not turns:
            raise Drop(NO_TRAINED_TOKENS, "no assistant turn with content to train")

        tools = list(conversation.tools) if conversation.tools else None
        self.stage = "the conversation"
        try:
            blocks = [] if self.renderer.has_markers[tools is not None] else None
            full = self.renderer.render_text(messages, tools, blocks=blocks)
            if blocks is not None:
                spans = self._marked_spans(messages, tools, turns, full, blocks)
                method = GENERATION_MARKERS
            else:
                spans, method = self._located_spans(messages, tools, turns, full)
            if not self.options.train_reasoning:
                self.stage = "the conversation with a reasoning probe"
                spans = self._without_reasoning(conversation, tools, turns, full, spans)
            marked = None
            control = self.control
            if control.held_in(messages, tools):
                self.stage = "the conversation with control-token text marked"
                marked = self.renderer.render_text(control.mark(messages), control.mark(tools))
        except Drop:
            raise
        except RenderTimeout:
            message = (f"chat template exceeded the time limit on {self.stage}: one render took "
                       f"more than {self.watchdog.limit:g} s of CPU time")
            raise Drop(TEMPLATE_ERROR, message) from None
        except Exception as e:  # templates are arbitrary code: any failure rejects the record
            message = f"chat template failed on {self.stage}: {type(e).__name__}: {e}"
            raise Drop(TEMPLATE_ERROR, message) from e
        _check_tools_rendered(full, spans, tools, [messages[i] for i in turns])
        if marked is not None and control.unmark(marked) != full:
            raise Drop(CONTROL_TOKEN_TEXT, "the template alters content that holds "
                                "control-token text, so it cannot be kept as plain text")
        return Rendered(full, spans, marked, method)

    def _located_spans(self, messages: list[dict], tools: list[dict] | None, turns: list[int],
                       full: str) -> tuple[list[tuple[int, int]], str]:
        """Each turn's span, located by rendering the conversation prefix by prefix
        (``_locate_turn``), and the method that took: ``full_render`` where any turn or the
        history before it renders differently in ``full``."""
        spans, method = [], PREFIX
        for i in turns:
            # An assistant turn first in the conversation needs the template to render an empty
            # history with a generation prompt.
            self.stage = f"the generation prompt before assistant message {i}"
            prompt = self.renderer.render_text(messages[:i], tools, generation_prompt=True)
            start = len(prompt) if full.startswith(prompt) else None
            if start is None:  # the history before the turn is rewritten in ``full``
                self.stage = f"the conversation before assistant message {i}"
                history = self.renderer.render_text(messages[:i], tools)
                after = spans[-1][1] if spans else 0
                start = self._after_header(full, prompt, history, after, messages, tools)
            self.stage = f"the conversation up to assistant message {i}"
            last = i + 1 == len(messages)
            turn = full if last else self.renderer.render_text(messages[: i + 1], tools)
            span, rewritten = _locate_turn(full, start, prompt, turn, messages[i], i)
            spans.append(span)
            method = FULL_RENDER if rewritten else method
        return spans, method

    def _after_header(self, full: str, prompt: str, history: str, after: int,
                      messages: list[dict], tools: list[dict] | None) -> int | None:
        """Where a turn starts in ``full`` when the history before it renders differently there:
        after the first role header (the generation prompt less the history it follows) at or
        after ``after``, the end of the turn before. That is the turn's own header only when no
        content can hold the header's text: the header holds a control token and no content
        holds control-token text. Otherwise None: not located."""
        header = prompt[len(history):] if prompt.startswith(history) else ""
        control = self.control
        if not control.pattern.search(header) or control.held_in(messages, tools):
            return None
        at = full.find(header, after)
        return None if at < 0 else at + len(header)

    def _marked_spans(self, messages: list[dict], tools: list[dict] | None, turns: list[int],
                      full: str, blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The template's own ``{% generation %}`` blocks; under ``last_turn_only`` those that
        follow the generation prompt of the last assistant turn."""
        if not self.options.last_turn_only:
            return list(blocks)
        prompt = self.renderer.render_text(messages[: turns[-1]], tools, generation_prompt=True)
        if not full.startswith(prompt):
            raise Drop(TURN_NOT_LOCATED, "the generation prompt before the last "
                                "assistant message is not a prefix of the full rendering")
        return [(a, b) for a, b in blocks if a >= len(prompt)]

    def _without_reasoning(self, conversation: Conversation, tools: list[dict] | None,
                           turns: list[int], full: str, spans: list[tuple[int, int]]
                           ) -> list[tuple[int, int]]:
        """``spans`` less the reasoning text each trained turn renders (``--train_reasoning``).

        Each turn's reasoning is swapped for a probe and the conversation rendered again; what
        surrounds the probe is what surrounds the reasoning in the full rendering.
        """
        offset = self.renderer.added_in_front(conversation)  # a system prompt
        for i in turns:
            reasoning = conversation.messages[i - offset].get(REASONING_CONTENT)
            if not reasoning:
                continue
            probed = list(conversation.messages)
            probed[i - offset] = {**probed[i - offset], REASONING_CONTENT: PROBE}
            text = self.renderer.render_text(self.renderer.messages(Conversation(tuple(probed),
                                                                  conversation.tools)), tools)
            region = _probed_region(full, text, i)
            if region is not None:
                spans = _subtract(spans, region)
        return spans

def _trainable(message: dict) -> bool:
    """An assistant message with something to say: content or tool calls."""
    return message["role"] == "assistant" and bool(
        message["content"].strip() or message.get("tool_calls"))


def _locate_turn(full: str, start: int | None, prompt: str, turn: str, message: dict, i: int
                 ) -> tuple[tuple[int, int], bool]:
    """The trained character span of assistant message ``i`` in ``full``, and whether the
    template rewrote the turn or the history before it there (docs/masking.md, ``full_render``:
    "Locating a turn").

    ``start`` is where the turn starts in ``full`` (None: not found), ``prompt`` renders the
    messages before the turn with the generation prompt, ``turn`` those up to and including it.
    What the model generates when the turn is the last one, ``turn[len(prompt):]`` less the glue
    after its end-of-turn token, is in ``full`` at ``start`` as it is (prefix-stable), or only
    its tail is, when the template drops a leading part (reasoning) from earlier replies: then
    the longest tail that ``full`` holds at ``start`` is the span, provided it still holds the
    reply's content.
    """
    if start is None or not turn.startswith(prompt):
        raise Drop(TURN_NOT_LOCATED, f"the start of assistant message {i} cannot be "
                            "found in the full rendering: the template rewrites the conversation "
                            "before it")
    generated = turn[len(prompt):].rstrip()
    if full.startswith(generated, start):
        return (start, start + len(generated)), start != len(prompt)
    first = full[start : start + 1]
    k = generated.find(first, 1) if first else -1
    while k > 0:
        tail = generated[k:]
        if full.startswith(tail, start) and _holds_reply(tail, message):
            return (start, start + len(tail)), True
        k = generated.find(first, k + 1)
    at = _first_difference(full[start:], generated)
    alone, within = generated[at : at + 40], full[start + at : start + at + 40]
    raise Drop(TURN_NOT_LOCATED, f"assistant message {i} renders differently alone and "
                        "in the full conversation, beyond a dropped leading part (at character "
                        f"{start + at}: {alone!r} vs {within!r})")


def _check_tools_rendered(full: str, spans: list[tuple[int, int]], tools: list[dict] | None,
                          trained: list[dict]) -> None:
    """Rejects a conversation whose tool definitions or trained tool calls the template drops
    (a stock template without tool support): training the turn would teach an empty reply, or
    calls to tools the model was never shown. Definitions must appear outside the trained
    spans, where the calls themselves name the tools."""
    untrained = "\0".join(full[a:b] for a, b in zip([0, *(b for _, b in spans)],
                                                   [*(a for a, _ in spans), len(full)],
                                                   strict=True))
    missing = [t["function"]["name"] for t in tools or ()
               if t["function"]["name"] not in untrained]
    if missing:
        raise Drop(TOOLS_NOT_RENDERED, f"the chat template does not render the tool "
                            f"definitions ({', '.join(missing)}); use a template with tool support")
    trained_text = "\0".join(full[a:b] for a, b in spans)
    calls = [c["function"]["name"] for m in trained for c in m.get("tool_calls") or ()]
    if any(name not in trained_text for name in calls):
        raise Drop(TOOLS_NOT_RENDERED, "the chat template does not render the assistant's "
                            "tool calls in its reply; use a template with tool support")


def _holds_reply(tail: str, message: dict) -> bool:
    """Whether a located tail still holds the reply's content (its tool calls are checked for
    every turn by ``_check_tools_rendered``)."""
    return message["content"].strip() in tail


def _probed_region(full: str, probed: str, i: int) -> tuple[int, int] | None:
    """Where the text that ``PROBE`` stands for in ``probed`` lies in ``full``, or None when the
    template does not render it: ``probed`` must hold ``full`` but for that text."""
    at = probed.find(PROBE)
    if at < 0:
        return None
    after = probed[at + len(PROBE) :]
    if (PROBE in after or len(probed) - len(PROBE) > len(full)
            or not (full.startswith(probed[:at]) and full.endswith(after))):
        raise Drop(TURN_NOT_LOCATED, f"the reasoning of assistant message {i} cannot be "
                            "located: the template renders the rest of the conversation "
                            "differently around it")
    return at, len(full) - len(after)


def _subtract(spans: list[tuple[int, int]], region: tuple[int, int]) -> list[tuple[int, int]]:
    """``spans`` less the characters of ``region``."""
    x, y = region
    kept = []
    for a, b in spans:
        kept += [(a, min(b, x))] if a < x else []
        kept += [(max(a, y), b)] if b > y else []
    return [(a, b) for a, b in kept if b > a]


def _first_difference(a: str, b: str) -> int:
    """Index of the first differing character (error messages only)."""
    pairs = zip(a, b, strict=False)  # the shorter string may be a prefix of the longer
    return next((k for k, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))
