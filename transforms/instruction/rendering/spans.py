"""Where the trained text lies in a conversation's full rendering: each trained reply's
character span, found by one of three methods, less its reasoning under
``train_reasoning=False`` (docs/masking.md, "How each method finds the spans"). A conversation
whose turns, tools or control-token text the template does not render as they are is dropped
with its reason, never trained on a guess.
"""

from __future__ import annotations

from transforms.core.fields import REASONING_CONTENT
from transforms.core.vocabulary import (
    CONTROL_TOKEN_TEXT,
    FULL_RENDER,
    GENERATION_MARKERS,
    NO_TRAINED_TOKENS,
    PREFIX,
    SENTINELS,
    TEMPLATE_ERROR,
    TOOLS_NOT_RENDERED,
    TURN_NOT_LOCATED,
    Drop,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.rendering.renderer import PROBE, Renderer
from transforms.instruction.rendering.sandbox import RenderTimeout
from transforms.instruction.rendering.sentinels import sentinel_spans
from transforms.instruction.rendering.values import MaskOptions, Rendered


class SpanFinder:
    """Renders conversations and finds the spans to train in them; ``stage`` names what is being
    rendered, for error messages."""

    def __init__(self, renderer: Renderer, options: MaskOptions) -> None:
        self.renderer = renderer
        self.options = options
        self.stage = ""

    def render(self, conversation: Conversation) -> Rendered:
        """The full text and the character spans to train, or ``Drop`` naming the option that
        would avoid it."""
        try:
            return self._render(conversation)
        except Drop as drop:
            raise self.renderer.with_fix(drop) from None

    def _render(self, conversation: Conversation) -> Rendered:
        messages = self.renderer.messages(conversation)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if self.options.last_turn_only:
            turns = turns[-1:]
        # A turn with nothing to say teaches the model to stop at once; it is not trained.
        turns = [i for i in turns if trainable(messages[i])]
        if not turns:
            raise Drop(NO_TRAINED_TOKENS, "no assistant turn with content to train")

        tools = list(conversation.tools) if conversation.tools else None
        self.stage = "the conversation"
        try:
            blocks = [] if self.renderer.has_markers[tools is not None] else None
            full = self.renderer.render_text(messages, tools, blocks=blocks)
            reasoning = None  # the reasoning regions, where the method found them itself
            if blocks is not None:
                spans = self._marked_spans(messages, tools, turns, full, blocks)
                method = GENERATION_MARKERS
            else:
                spans, method, reasoning = self._unmarked_spans(messages, tools, turns, full)
            if not self.options.train_reasoning:
                if reasoning is None:
                    self.stage = "the conversation with a reasoning probe"
                    spans = self._without_reasoning(conversation, tools, turns, full, spans)
                else:
                    for region in reasoning:
                        spans = _subtract(spans, region)
            marked = None
            control = self.renderer.control
            if control.held_in(messages, tools):
                self.stage = "the conversation with control-token text marked"
                marked = self.renderer.render_text(control.mark(messages), control.mark(tools))
        except Drop:
            raise
        except RenderTimeout:
            message = (f"chat template exceeded the time limit on {self.stage}: one render took "
                       f"more than {self.renderer.sandbox.watchdog.limit:g} s of CPU time")
            raise Drop(TEMPLATE_ERROR, message) from None
        except Exception as e:  # templates are arbitrary code: any failure rejects the record
            message = f"chat template failed on {self.stage}: {type(e).__name__}: {e}"
            raise Drop(TEMPLATE_ERROR, message) from e
        _check_tools_rendered(full, spans, tools, [messages[i] for i in turns])
        if marked is not None and control.unmark(marked) != full:
            raise Drop(CONTROL_TOKEN_TEXT, "the template alters content that holds "
                                "control-token text, so it cannot be kept as plain text")
        return Rendered(full, spans, marked, method)

    def _unmarked_spans(self, messages: list[dict], tools: list[dict] | None, turns: list[int],
                        full: str) -> tuple[list[tuple[int, int]], str, list | None]:
        """The spans of a template without markers: located turn by turn (``prefix``,
        ``full_render``), else, where the template rewrites a turn beyond a dropped leading
        part, by the general method (``sentinels``), which also gives the reasoning regions."""
        if not self.options.sentinels_only:
            try:
                return (*self._located_spans(messages, tools, turns, full), None)
            except Drop as drop:
                if drop.reason != TURN_NOT_LOCATED:
                    raise
        self.stage = "the conversation with sentinels"
        found = sentinel_spans(self.renderer, messages, tools, turns, full)
        return found.spans, SENTINELS, found.reasoning

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
        control = self.renderer.control
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
            messages = self.renderer.messages(Conversation(tuple(probed), conversation.tools))
            text = self.renderer.render_text(messages, tools)
            region = _probed_region(full, text, i)
            if region is not None:
                spans = _subtract(spans, region)
        return spans


def trainable(message: dict) -> bool:
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


def _holds_reply(tail: str, message: dict) -> bool:
    """Whether a located tail still holds the reply's content (its tool calls are checked for
    every turn by ``_check_tools_rendered``)."""
    return message["content"].strip() in tail


def _first_difference(a: str, b: str) -> int:
    """Index of the first differing character (error messages only)."""
    pairs = zip(a, b, strict=False)  # the shorter string may be a prefix of the longer
    return next((k for k, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def _check_tools_rendered(full: str, spans: list[tuple[int, int]], tools: list[dict] | None,
                          trained: list[dict]) -> None:
    """Rejects a conversation whose tool definitions or trained tool calls the template drops
    (a stock template without tool support): training the turn would teach an empty reply, or
    calls to tools the model was never shown. Definitions must appear outside the trained
    spans, where the calls themselves name the tools."""
    calls = [c["function"]["name"] for m in trained for c in m.get("tool_calls") or ()]
    if not tools and not calls:  # most conversations: nothing to look for
        return
    untrained = "\0".join(full[a:b] for a, b in zip([0, *(b for _, b in spans)],
                                                   [*(a for a, _ in spans), len(full)],
                                                   strict=True))
    missing = [t["function"]["name"] for t in tools or ()
               if t["function"]["name"] not in untrained]
    if missing:
        raise Drop(TOOLS_NOT_RENDERED, f"the chat template does not render the tool "
                            f"definitions ({', '.join(missing)})")
    trained_text = "\0".join(full[a:b] for a, b in spans)
    if any(name not in trained_text for name in calls):
        raise Drop(TOOLS_NOT_RENDERED, "the chat template does not render the assistant's "
                            "tool calls in its reply")


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

