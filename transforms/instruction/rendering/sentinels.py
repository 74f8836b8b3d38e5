"""The general mask method: the conversation rendered once more with each message's content and
reasoning replaced by a unique sentinel, so that every message can be found in the template's
text however the template rewrites history (drops earlier reasoning, changes an earlier reply's
end token, leaves out a tool call's preamble). docs/masking.md, "The sentinel method".

A trained turn runs from the end of its generation prompt to its end token, whatever that token
is in the full rendering. The real rendering must then be the sentinel rendering with each
sentinel replaced by its value: a template that transforms a trained reply's content (beyond
trimming whitespace) is refused, never guessed at.
"""

from __future__ import annotations

import dataclasses
import itertools

from transforms.core.fields import TURN_REASONING_FIELDS
from transforms.core.vocabulary import TOOLS_NOT_RENDERED, TURN_NOT_LOCATED, Drop
from transforms.instruction.rendering.renderer import Renderer

_REASONING_KINDS = frozenset(TURN_REASONING_FIELDS)
SENTINEL_START = "Sx"


@dataclasses.dataclass
class _Piece:
    """One sentinel found in the sentinel rendering, and where its value lies in the real one."""

    start: int
    end: int
    message: int
    kind: str  # "content" or the reasoning field's name
    value: str
    real: tuple[int, int] = (0, 0)


@dataclasses.dataclass(frozen=True)
class SentinelSpans:
    """Trained character spans of the real rendering, and each trained turn's reasoning."""

    spans: list[tuple[int, int]]
    reasoning: list[tuple[int, int]]


def sentinel_spans(renderer: Renderer, messages: list[dict], tools: list[dict] | None,
                   turns: list[int], full: str) -> SentinelSpans:
    """The spans to train in ``full`` (the real rendering of ``messages``) for the assistant
    messages ``turns``, found in a rendering with sentinels; ``Drop`` where that cannot be
    done exactly."""
    stand_ins = _with_sentinels(messages, full, renderer)
    sentinel_text = renderer.render_text(stand_ins, tools)
    pieces = _find_pieces(sentinel_text, stand_ins, messages)
    segments = _align(sentinel_text, full, pieces, set(turns), renderer, messages, tools)
    spans, reasoning = [], []
    for i in turns:
        start, end = _turn_span(renderer, stand_ins, tools, i, sentinel_text)
        spans.append((_to_real(start, segments, pieces), _to_real(end, segments, pieces)))
        reasoning += [p.real for p in pieces if p.message == i and p.kind in _REASONING_KINDS]
    return SentinelSpans(spans, reasoning)


def _with_sentinels(messages: list[dict], full: str, renderer: Renderer) -> list[dict]:
    """``messages`` with each non-empty content and reasoning replaced by a sentinel: ASCII
    (tojson leaves it as it is), no whitespace (strip leaves it), found nowhere else."""
    sources = "\0".join(renderer.sandbox.sources.values())
    nonce = next(n for n in itertools.count(7) if f"{SENTINEL_START}{n}q" not in full + sources)
    out = []
    for k, message in enumerate(messages):
        stand_in = dict(message)
        for kind in ("content", *TURN_REASONING_FIELDS):
            if isinstance(stand_in.get(kind), str) and stand_in[kind]:
                stand_in[kind] = f"{SENTINEL_START}{nonce}q{k}{kind[0]}Z"
        out.append(stand_in)
    return out


def _find_pieces(text: str, stand_ins: list[dict], messages: list[dict]) -> list[_Piece]:
    """Every sentinel the template rendered, in order of position; one rendered twice is
    refused (its turn could not be placed once)."""
    pieces = []
    for k, message in enumerate(stand_ins):
        for kind in ("content", *TURN_REASONING_FIELDS):
            sentinel = message.get(kind)
            if not (isinstance(sentinel, str) and sentinel.startswith(SENTINEL_START)):
                continue
            at = text.find(sentinel)
            if at < 0:
                continue  # history the template leaves out
            if text.find(sentinel, at + 1) >= 0:
                raise Drop(TURN_NOT_LOCATED, f"the template renders the {kind} of message {k} "
                           "twice, so its turn cannot be placed once")
            pieces.append(_Piece(at, at + len(sentinel), k, kind, messages[k][kind]))
    return sorted(pieces, key=lambda p: p.start)


def _align(text: str, full: str, pieces: list[_Piece], trained: set[int], renderer: Renderer,
           messages: list[dict], tools: list[dict] | None) -> list[tuple[int, int, int]]:
    """Checks that ``full`` is ``text`` with each sentinel replaced by its value and sets each
    piece's ``real`` span; returns the text between sentinels as (start, end, real start).

    A trained value must stand as it is (or trimmed of whitespace, as templates do). An
    untrained one may be transformed (a tool result written as JSON) only where the text after
    it holds a control token and no content holds control-token text: then nothing else can
    match it."""
    unambiguous = not renderer.control.held_in(messages, tools)
    segments, at, before = [], 0, 0
    for n, piece in enumerate(pieces):
        glue = text[before:piece.start]
        if not full.startswith(glue, at):
            raise _not_aligned(piece.message, at)
        segments.append((before, piece.start, at))
        at += len(glue)
        after = text[piece.end:pieces[n + 1].start] if n + 1 < len(pieces) else text[piece.end:]
        length = _value_length(full, at, piece.value, after)
        if length is None and piece.message not in trained and unambiguous \
                and renderer.control.pattern.search(after):
            found = full.find(after, at)
            length = None if found < 0 else found - at
        if length is None:
            raise Drop(TURN_NOT_LOCATED, f"the template transforms the {piece.kind} of message "
                       f"{piece.message}, so what it renders cannot be matched to the record")
        piece.real = (at, at + length)
        at += length
        before = piece.end
    if full[at:] != text[before:]:
        raise _not_aligned(len(messages) - 1, at)
    segments.append((before, len(text), at))
    return segments


def _value_length(full: str, at: int, value: str, after: str) -> int | None:
    """How long ``value`` stands in ``full`` at ``at``, followed by ``after``: as it is, or
    trimmed of whitespace."""
    for candidate in dict.fromkeys((value, value.strip(), value.rstrip(), value.lstrip())):
        if full.startswith(candidate, at) and full.startswith(after, at + len(candidate)):
            return len(candidate)
    return None


def _not_aligned(message: int, at: int) -> Drop:
    return Drop(TURN_NOT_LOCATED, f"the template renders the text around message {message} "
                f"differently once its contents are in (at character {at})")


def _turn_span(renderer: Renderer, stand_ins: list[dict], tools: list[dict] | None, i: int,
               text: str) -> tuple[int, int]:
    """Assistant message ``i``'s trained span in the sentinel rendering ``text``: from the end
    of its generation prompt to its end token there.

    What the model generates for the turn is its rendering as the last message, from the end of
    the generation prompt on. That text is in ``text`` as it is, or without a leading part the
    template drops from earlier replies (reasoning, a tool call's preamble); its end token is
    the one ``text`` holds there (an earlier harmony reply ends with ``<|end|>``, the last with
    ``<|return|>``)."""
    prompt = renderer.render_text(stand_ins[:i], tools, generation_prompt=True)
    last = i + 1 == len(stand_ins)
    alone = text if last else renderer.render_text(stand_ins[: i + 1], tools)
    generated = alone[_turn_start(alone, prompt, stand_ins, i):].rstrip()
    start = _turn_start(text, prompt, stand_ins, i)
    ending = _end_token(generated, renderer)
    body = generated[: len(generated) - len(ending)]
    kept = body if text.startswith(body, start) else _longest_tail_at(text, start, body)
    if not _holds_reply(kept, stand_ins[i]):
        if not _holds_reply(generated, stand_ins[i]):  # a template without tool support
            raise Drop(TOOLS_NOT_RENDERED, "the chat template does not render the assistant's "
                       "tool calls in its reply")
        raise Drop(TURN_NOT_LOCATED, f"assistant message {i} renders differently alone and in "
                   "the full conversation, beyond a dropped leading part")
    after = start + len(kept)
    if text.startswith(ending, after):
        return start, after + len(ending)
    other = renderer.control.pattern.match(text, after)
    if ending and other is not None:
        return start, other.end()
    raise Drop(TURN_NOT_LOCATED, f"the end of assistant message {i} cannot be found in the full "
               "rendering")


def _turn_start(text: str, prompt: str, stand_ins: list[dict], i: int) -> int:
    """Where assistant message ``i``'s generated text starts in ``text``: after the part of its
    generation prompt ``prompt`` that follows the last sentinel of an earlier message (the end
    of the message before and the turn's header), which must stand there as it is."""
    end, sentinel = _last_sentinel(text, stand_ins[:i])
    at = prompt.find(sentinel) if sentinel else 0
    tail = prompt[at + len(sentinel):] if at >= 0 else None
    if tail is None or not text.startswith(tail, end):
        raise Drop(TURN_NOT_LOCATED, f"the template writes the text before assistant message "
                   f"{i} (the end of the message before, the turn's header) differently in its "
                   "generation prompt")
    return end + len(tail)


def _last_sentinel(text: str, stand_ins: list[dict]) -> tuple[int, str]:
    """The end in ``text`` of the last sentinel of ``stand_ins`` it holds, and that sentinel;
    (0, '') for none. Templates write messages in order, so the messages are searched from the
    last one back (where one is out of order, the caller's check fails: a refusal)."""
    for message in reversed(stand_ins):
        found = [(at + len(s), s) for s in _sentinels(message) if (at := text.find(s)) >= 0]
        if found:
            return max(found)
    return 0, ""


def _sentinels(stand_in: dict) -> list[str]:
    return [stand_in[kind] for kind in ("content", *TURN_REASONING_FIELDS)
            if isinstance(stand_in.get(kind), str) and stand_in[kind].startswith(SENTINEL_START)]


def _longest_tail_at(text: str, start: int, body: str) -> str:
    """The longest tail of ``body`` that ``text`` holds at ``start``, in linear time (a reply's
    tool-call arguments may be long): the longest prefix of that window of ``text`` matched at
    the end of ``body``, by Knuth-Morris-Pratt."""
    window = text[start : start + len(body)]
    if not window:
        return ""
    fail = [0] * len(window)
    k = 0
    for i in range(1, len(window)):
        while k and window[i] != window[k]:
            k = fail[k - 1]
        k += window[i] == window[k]
        fail[i] = k
    k = 0
    for char in body:
        while k and (k == len(window) or char != window[k]):
            k = fail[k - 1]
        k += k < len(window) and char == window[k]
    return body[len(body) - k :]


def _end_token(generated: str, renderer: Renderer) -> str:
    """The control token that closes a generated turn, or '' where it ends with none."""
    for match in renderer.control.pattern.finditer(generated):
        if match.end() == len(generated):
            return match.group()
    return ""


def _holds_reply(kept: str, message: dict) -> bool:
    """Whether the located text still holds the reply: its content, else its tool calls."""
    content = message["content"]
    if content and content in kept:
        return True
    calls = [c["function"]["name"] for c in message.get("tool_calls") or ()]
    return bool(calls) and all(name in kept for name in calls)


def _to_real(position: int, segments: list[tuple[int, int, int]], pieces: list[_Piece]) -> int:
    """A position of the sentinel rendering in the real one: inside text between sentinels it
    moves with that text; at a sentinel's edge it is the value's edge."""
    for piece in pieces:
        if position == piece.start:
            return piece.real[0]
        if position == piece.end:
            return piece.real[1]
    for start, end, real in segments:
        if start <= position <= end:
            return real + position - start
    raise AssertionError(f"position {position} lies inside a sentinel")
