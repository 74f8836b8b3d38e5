"""Chat-template rendering and assistant-only loss masks that work with any template.

Stock chat templates carry no ``{% generation %}`` markers, so transformers'
``return_assistant_tokens_mask`` cannot be relied on. Instead every conversation is rendered
prefix by prefix and the text each assistant turn adds is located by character offsets:

* ``prompt_i``: ``messages[:i]`` rendered with ``add_generation_prompt=True``, i.e. everything
  the model has seen when it starts to write turn ``i``;
* ``turn_i``: ``messages[:i + 1]`` rendered without a generation prompt.

Both must be prefixes of the full rendering, otherwise the template rewrites history and no
per-turn mask can be read off it (``template_not_prefix_stable``). The trained span of turn
``i`` is ``turn_i[len(prompt_i):]`` with trailing whitespace trimmed: exactly what the model
must generate after the generation prompt, up to and including its end-of-turn token. The
whitespace after the end-of-turn token (ChatML's ``"\\n"``, Gemma's ``"\\n"``) is glue that the
template writes between turns; the model stops at the end-of-turn token and never generates it,
and the ``{% generation %}`` blocks of stock templates end before it too. Spans become token
positions through the tokenizer's character offsets: a token is trained when it overlaps the
span, the rule transformers applies to generation blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from transforms.adapters import Conversation
from transforms.records import NO_TRAINED_TOKENS, TEMPLATE_ERROR

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEMPLATE_NOT_PREFIX_STABLE = "template_not_prefix_stable"
IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class MaskOptions:
    """Which assistant tokens carry loss."""

    last_turn_only: bool = False  # train only the conversation's final assistant message
    train_end_of_turn: bool = True  # train the end-of-turn token(s) that close each turn


@dataclasses.dataclass(frozen=True)
class EncodedExample:
    """One rendered conversation; ``labels`` is ``input_ids`` with -100 where no loss."""

    input_ids: np.ndarray  # int32
    labels: np.ndarray  # int32


@dataclasses.dataclass(frozen=True)
class RenderError:
    """A conversation that yields no example, with a reason code for rejected/."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class _Rendered:
    text: str
    spans: list[tuple[int, int]]  # character spans [start, end) of trained text


class _Unrenderable(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def encode_conversations(
    tok: PreTrainedTokenizerBase,
    conversations: Sequence[Conversation],
    options: MaskOptions,
    system_prompt: str | None = None,
) -> list[EncodedExample | RenderError]:
    """Render, tokenize and mask a batch of conversations; one result per input, in order.

    ``system_prompt`` is prepended as a system message to conversations that have none.
    Rendering is per conversation (so one bad record cannot fail the batch); tokenization is a
    single batched call over all rendered texts.
    """
    results: list[EncodedExample | RenderError | None] = []
    rendered: list[_Rendered] = []
    for conversation in conversations:
        try:
            rendered.append(_render(tok, conversation, options, system_prompt))
            results.append(None)
        except _Unrenderable as e:
            results.append(RenderError(e.reason, e.message))
    if not rendered:
        return results  # type: ignore[return-value]  # all RenderError
    encoded = tok(
        [r.text for r in rendered],
        add_special_tokens=False,  # chat templates write their own special tokens
        return_offsets_mapping=True,
        return_attention_mask=False,
    )
    special_ids = None if options.train_end_of_turn else _special_ids(tok)
    examples = iter(
        _example(ids, offsets, r.spans, special_ids)
        for ids, offsets, r in zip(
            encoded["input_ids"], encoded["offset_mapping"], rendered, strict=True
        )
    )
    return [result if result is not None else next(examples) for result in results]


def _render(
    tok: PreTrainedTokenizerBase,
    conversation: Conversation,
    options: MaskOptions,
    system_prompt: str | None,
) -> _Rendered:
    """The full text and the character spans to train, or ``_Unrenderable``."""
    messages = list(conversation.messages)
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if options.last_turn_only:
        turns = turns[-1:]
    # A turn with nothing to say teaches the model to stop at once; it is not trained.
    turns = [i for i in turns if messages[i]["content"].strip() or messages[i].get("tool_calls")]
    if not turns:
        raise _Unrenderable(NO_TRAINED_TOKENS, "no assistant turn with content to train")

    tools = list(conversation.tools) if conversation.tools else None
    # Two template calls per conversation: one batch with and one without a generation prompt.
    closed = [messages[: i + 1] for i in turns if i + 1 < len(messages)]
    stage = "the conversation"
    try:
        full, *turn_texts = tok.apply_chat_template(
            [messages, *closed], tools=tools, tokenize=False
        )
        # An assistant turn first in the conversation needs the template to render an empty one.
        stage = "the generation prompts before the assistant turns"
        prompts = tok.apply_chat_template(
            [messages[:i] for i in turns], tools=tools, tokenize=False, add_generation_prompt=True
        )
    except Exception as e:  # templates are arbitrary code: any failure rejects the record
        message = f"chat template failed on {stage}: {type(e).__name__}: {e}"
        raise _Unrenderable(TEMPLATE_ERROR, message) from e
    if turns[-1] + 1 == len(messages):
        turn_texts.append(full)

    spans = []
    for i, prompt, turn in zip(turns, prompts, turn_texts, strict=True):
        for name, prefix in (("prompt", prompt), ("turn", turn)):
            if not full.startswith(prefix):
                at = _first_difference(full, prefix)
                raise _Unrenderable(
                    TEMPLATE_NOT_PREFIX_STABLE,
                    f"the {name} rendering up to assistant message {i} is not a prefix of the "
                    f"full rendering (they differ at character {at}: {prefix[at : at + 40]!r} vs "
                    f"{full[at : at + 40]!r})",
                )
        if len(prompt) > len(turn):
            raise _Unrenderable(
                TEMPLATE_NOT_PREFIX_STABLE,
                f"the generation prompt before assistant message {i} is not a prefix of the turn",
            )
        spans.append((len(prompt), max(len(prompt), len(turn.rstrip()))))
    return _Rendered(full, spans)


def _example(
    ids: list[int],
    offsets: list[tuple[int, int]],
    spans: list[tuple[int, int]],
    special_ids: frozenset[int] | None,
) -> EncodedExample | RenderError:
    input_ids = np.asarray(ids, dtype=np.int32)
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int32)
    if len(input_ids):
        bounds = np.asarray(offsets, dtype=np.int64)
        for first, stop in _token_ranges(bounds[:, 0], bounds[:, 1], spans):
            end = stop
            if special_ids is not None:
                while end > first and int(input_ids[end - 1]) in special_ids:
                    end -= 1
            labels[first:end] = input_ids[first:end]
    if not (labels != IGNORE_INDEX).any():
        return RenderError(NO_TRAINED_TOKENS, "no token of the rendered text is trained")
    return EncodedExample(input_ids, labels)


def _token_ranges(
    starts: np.ndarray, ends: np.ndarray, spans: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Token index ranges [first, stop) of the tokens overlapping each character span.

    Offsets of a tokenization are non-decreasing, so the first token ending after the span's
    start and the last token starting before its end are found by binary search.
    """
    span_array = np.asarray([s for s in spans if s[1] > s[0]], dtype=np.int64).reshape(-1, 2)
    firsts = np.searchsorted(ends, span_array[:, 0], side="right")
    stops = np.searchsorted(starts, span_array[:, 1], side="left")
    return [(int(a), int(b)) for a, b in zip(firsts, stops, strict=True) if b > a]


def _first_difference(a: str, b: str) -> int:
    """Index of the first differing character (error messages only)."""
    pairs = zip(a, b, strict=False)  # the shorter string may be a prefix of the longer
    return next((k for k, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def _special_ids(tok: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of special tokens: the end-of-turn markers that close a trained span."""
    added = (i for i, token in tok.added_tokens_decoder.items() if token.special)
    return frozenset((*added, *tok.all_special_ids))
