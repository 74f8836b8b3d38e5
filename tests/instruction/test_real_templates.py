"""Loss masks on real tokenizers with their stock chat templates, proven against transformers.

The tokenizers are the vendors' own (``shared/tokenizers``: Qwen3, Llama 3.1, Gemma 3, DeepSeek
V3) and the project's default (Qwen2 vocabulary with ``CHATML_TEMPLATE``). Stock templates carry
no ``{% generation %}`` markers, so each gets a marked copy, built at test time by a few string
replacements (``tests/support/marked_templates.py``) that put the markers around what the
project trains: the reply after its role header, up to and including the end-of-turn token,
without the glue after it. Then, over the shared chat, instruction and GSM8K files:

1. the marked copy renders exactly the stock text (or fails where the stock template fails), on
   every conversation;
2. our labels equal transformers' ``return_assistant_tokens_mask`` from the marked copy, with
   equal ids; what the stock template cannot render is ``template_error`` and what it renders
   without its tools ``tools_not_rendered``, in counts fixed below. The default run takes every
   chat conversation and 300 of each other file (2,600 a family); ``-m slow`` all 12,191.

Further: reasoning (``reasoning_content``, rendered by Qwen3's template, written inline for
ChatML) trained or left out; Qwen3's tool calls decoded turn by turn; and TRL's prefix-stable
training templates as a second, independent reference.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import importlib.util
import json
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from tests.conftest import require_shared_data
from tests.support.marked_templates import (
    DEFAULT_FAMILY,
    DS_ASSISTANT,
    DS_TOOL_OUTPUTS_END,
    FAMILIES,
    GENERATION_TAG,
    REAL_FAMILIES,
    REASONING_FIELD,
    TOKENIZERS,
    marked,
    patch,
    template_day,
    with_reasoning_as,
)
from tests.support.shared_chats import adapted, gsm8k_rows, sweep_conversations
from transforms.core.tokenizer import builtin_template
from transforms.core.vocabulary import (
    FULL_RENDER,
    GENERATION_MARKERS,
    IGNORE_INDEX,
    NO_TRAINED_TOKENS,
    PREFIX,
    SENTINELS,
    TEMPLATE_ERROR,
    TOOLS_NOT_RENDERED,
    TURN_NOT_LOCATED,
    Drop,
)
from transforms.instruction.adapters import Conversation
from transforms.instruction.chat_template import encode_conversations
from transforms.instruction.rendering.values import EncodedExample, MaskOptions

require_shared_data()

if not TOKENIZERS.is_dir():
    pytest.skip(f"the real tokenizers are not in {TOKENIZERS} (shared/tokenizers)",
                allow_module_level=True)

DEFAULT = MaskOptions()
# Stock templates that drop tool definitions and tool calls: a conversation with tools gets
# tools_not_rendered there (Gemma 3's raises on the tool turns of most of them first), two of
# them although a reply mentions a tool's name (definitions must be outside the replies).
NO_TOOL_SUPPORT = frozenset({"llama3_1", "gemma3", "deepseek_v3"})
# What every shared conversation (12,191 of them) becomes, per family: its mask method, or the
# reason it was rejected. Qwen3's full_render: the conversations with a reply that is not the
# last message (the template drops its think block later on). Gemma 3's template_error: tool
# turns break its user/assistant alternation check (raise_exception).
EXPECTED_OUTCOMES = {
    "qwen3": {PREFIX: 11262, FULL_RENDER: 929},
    "llama3_1": {PREFIX: 11800, TOOLS_NOT_RENDERED: 391},
    "gemma3": {PREFIX: 11800, TEMPLATE_ERROR: 312, TOOLS_NOT_RENDERED: 79},
    "deepseek_v3": {PREFIX: 11800, TOOLS_NOT_RENDERED: 391},
    DEFAULT_FAMILY: {PREFIX: 12191},
    # GPT-OSS: every conversation with an earlier reply or a tool call is placed by sentinels
    # (an earlier reply ends with <|end|>, not <|return|>; a call's preamble goes once a final
    # answer follows). Two raise in the stock template: a tool result with no call before it.
    "gptoss": {PREFIX: 11335, SENTINELS: 854, TEMPLATE_ERROR: 2},
}


# --- helpers ------------------------------------------------------------------------------------


def segments(labels: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [start, stop) of trained positions."""
    trained = np.concatenate([[False], labels != IGNORE_INDEX, [False]])
    edges = np.flatnonzero(np.diff(trained.astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def decode(tok, ids) -> str:
    return tok.decode(list(map(int, ids)), skip_special_tokens=False,
                      clean_up_tokenization_spaces=False)


def trained_texts(tok, example: EncodedExample) -> list[str]:
    return [decode(tok, example.input_ids[a:b]) for a, b in segments(example.labels)]


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def has_tools(conversation: Conversation) -> bool:
    return bool(conversation.tools) or any(m.get("tool_calls") for m in conversation.messages)


def trainable_turns(conversation: Conversation) -> list[int]:
    return [i for i, m in enumerate(conversation.messages) if m["role"] == "assistant"
            and (m["content"].strip() or m.get("tool_calls"))]


def _strings(value, out: list[str]) -> list[str]:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _strings(item, out)
    return out


@dataclasses.dataclass(frozen=True)
class Reference:
    """What transformers makes of a conversation with a marked template."""

    ids: np.ndarray
    mask: np.ndarray | None  # None where sanitizing control-token text changed the ids
    block_texts: list[str]  # the text of every generation block (where mask is None)


def reference(tok, template: str, conversation: Conversation, added: re.Pattern,
              reasoning_field: str = "reasoning_content") -> Reference | None:
    """transformers' ids and assistant mask from ``template``; None where it raises.

    Its mask comes with ids in which control-token text in content becomes control tokens,
    while ours keep such text as text (``sanitize_control_tokens=True``, which cannot be
    combined with the mask). Where a string of the conversation holds an added token's text,
    the sanitized ids are fetched too; where they differ, the reference for the mask is the text
    of each generation block instead. (Sanitizing is slow, ~50 ms a call with Gemma 3's
    tokenizer. No shared conversation holds a control token's text; nine hold the text of
    another Gemma 3 added token, and only they make the second call.)
    """
    messages = [with_reasoning_as(m, reasoning_field) for m in conversation.messages]
    tools = list(conversation.tools) if conversation.tools else None
    call = functools.partial(tok.apply_chat_template, messages, tools=tools,
                             chat_template=template, tokenize=True, return_dict=True)
    try:
        plain = call(return_assistant_tokens_mask=True)
        ids = np.asarray(plain["input_ids"])
        if any(added.search(s) for s in _strings((messages, tools), [])):
            sanitized = np.asarray(call(sanitize_control_tokens=True)["input_ids"])
            if not np.array_equal(sanitized, ids):
                (text,), (blocks,) = render_jinja_template(
                    [messages], tools=tools, chat_template=template,
                    return_assistant_tokens_mask=True, **tok.special_tokens_map)
                return Reference(sanitized, None, [nfc(text[a:b]) for a, b in blocks])
    except Exception:
        return None
    return Reference(ids, np.asarray(plain["assistant_masks"], dtype=bool), [])


def added_tokens_pattern(tok) -> re.Pattern:
    """Any added token's text (whitespace tokens aside): a superset of the control tokens that
    sanitizing treats."""
    contents = sorted((t.content for t in tok.added_tokens_decoder.values()
                       if not t.content.isspace()), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, contents)) or "(?!)")


def compare(tok, ours: EncodedExample | Drop, theirs: Reference | None) -> str | None:
    """Why ``ours`` differs from the reference, or None. A Drop is judged by the caller,
    except no_trained_tokens where the reference trains nothing either."""
    if theirs is None:
        return None if isinstance(ours, Drop) and ours.reason == TEMPLATE_ERROR else (
            f"transformers raised, we gave {ours!r:.200}")
    if isinstance(ours, Drop):
        if ours.reason == NO_TRAINED_TOKENS and theirs.mask is not None and not theirs.mask.any():
            return None
        return f"{ours.reason}: {ours.message:.300}"
    if not np.array_equal(ours.input_ids, theirs.ids):
        n = min(len(ours.input_ids), len(theirs.ids))
        at = np.flatnonzero(ours.input_ids[:n] != theirs.ids[:n])[:1].tolist() or [n]
        return f"input_ids differ from position {at[0]} (lengths {len(ours.input_ids)}, " \
               f"{len(theirs.ids)})"
    if theirs.mask is None:
        # A token that straddles the start of a block is trained, as in the mask; only such
        # whitespace may come before a block's text.
        found = trained_texts(tok, ours)
        expected = theirs.block_texts
        if len(found) != len(expected) or not all(
                f.endswith(e) and not f[: len(f) - len(e)].strip()
                for f, e in zip(found, expected, strict=False)):
            return f"trained {found!r:.300} != blocks {expected!r:.300}"
        return None
    trained = ours.labels != IGNORE_INDEX
    if not np.array_equal(trained, theirs.mask):
        diff = np.flatnonzero(trained != theirs.mask)[:8].tolist()
        ids = ours.input_ids
        shown = [(p, decode(tok, ids[p : p + 1]), bool(trained[p])) for p in diff]
        return f"mask differs at (position, token, ours): {shown}"
    if not np.array_equal(ours.labels[trained], ours.input_ids[trained]):
        return "labels are not the ids where trained"
    return None


# --- one family: tokenizer, templates and the sweep, computed once ----------------------------

# The default run sweeps every conversation of the chat files (1,400: all the multi-turn, tool and
# rejected conversations are there) and an evenly spread SAMPLE_PER_FILE of each instruction and
# GSM8K file (single Q/A pairs); the slow run sweeps all 12,191.
SAMPLE_PER_FILE = 300


def spread(items: tuple, cap: int | None) -> list:
    """``cap`` items evenly spread over ``items`` (all of them when ``cap`` is None or more)."""
    n = len(items)
    if cap is None or n <= cap:
        return list(items)
    return [items[k * n // cap] for k in range(cap)]


def swept(cap: int | None, cap_chats: bool = False) -> list[tuple[str, list[int]]]:
    """Each adaptable shared file and the indices of its conversations that are swept: all of
    a chat file's (``cap`` of them too with ``cap_chats``), ``cap`` of another's."""
    return [(relative, spread(tuple(range(len(conversations))),
                              None if relative.startswith("chat/") and not cap_chats else cap))
            for relative, conversations in sweep_conversations()]


@dataclasses.dataclass(frozen=True)
class Swept:
    """One conversation's sweep: where it is, it, our result and the stock template's text."""

    where: str
    conversation: Conversation
    ours: EncodedExample | Drop
    stock: str | None  # None: the stock template raises


@dataclasses.dataclass(frozen=True)
class Sweep:
    outcomes: collections.Counter  # mask method or rejection reason -> conversations
    problems: list[str]
    rows: list[Swept]


class Family:
    def __init__(self, name: str, tok) -> None:
        self.name = name
        self.tok = tok
        self.stock = tok.get_chat_template()
        self.marked = marked(name, self.stock)
        self.added = added_tokens_pattern(tok)

    def render(self, template: str, conversation: Conversation) -> str | None:
        try:
            return self.tok.apply_chat_template(
                list(conversation.messages), chat_template=template, tokenize=False,
                tools=list(conversation.tools) if conversation.tools else None)
        except Exception:
            return None

    @functools.cached_property
    def stock_renders(self) -> dict[str, list[str | None]]:
        """The stock template's text of every shared conversation (None: it raises)."""
        return {relative: [self.render(self.stock, c) for c in conversations]
                for relative, conversations in sweep_conversations()}

    @functools.cache  # noqa: B019 (one Family per family, alive for the module)
    def sweep(self, cap: int | None, options: MaskOptions = DEFAULT, cap_chats: bool = False
              ) -> Sweep:
        """Our encoding of the swept conversations, each checked against the marked copy."""
        files = dict(sweep_conversations())
        outcomes: collections.Counter = collections.Counter()
        problems, rows = [], []
        for relative, indices in swept(cap, cap_chats):
            conversations = [files[relative][k] for k in indices]
            results = encode_conversations(self.tok, conversations, options)
            stocks = [self.stock_renders[relative][k] for k in indices]
            for k, conversation, ours, stock in zip(indices, conversations, results, stocks,
                                                    strict=True):
                row = Swept(f"{relative} #{k}", conversation, ours, stock)
                rows.append(row)
                outcome = ours.mask_method if isinstance(ours, EncodedExample) else ours.reason
                outcomes[outcome] += 1
                problem = self.check(row)
                if problem:
                    problems.append(f"{row.where}: {problem}")
        return Sweep(outcomes, problems, rows)

    def check(self, row: Swept) -> str | None:
        ours = row.ours
        if row.stock is None:
            if not (isinstance(ours, Drop) and ours.reason == TEMPLATE_ERROR):
                return f"the stock template raises, we gave {ours!r:.200}"
            return None
        if isinstance(ours, Drop) and ours.reason == TOOLS_NOT_RENDERED:
            if self.name not in NO_TOOL_SUPPORT or not has_tools(row.conversation):
                return f"tools_not_rendered: {ours.message:.200}"
            return None
        return compare(self.tok, ours, reference(self.tok, self.marked, row.conversation,
                                                 self.added, REASONING_FIELD.get(self.name,
                                                                                 "reasoning_content")))


@pytest.fixture(scope="module")
def families(qwen_tokenizer) -> Iterator[dict[str, Family]]:
    from transformers import AutoTokenizer

    toks = {name: AutoTokenizer.from_pretrained(TOKENIZERS / name) for name in REAL_FAMILIES}
    toks[DEFAULT_FAMILY] = qwen_tokenizer
    with template_day():  # harmony's system message prints the date
        yield {name: Family(name, tok) for name, tok in toks.items()}


# --- 1. the marked copies render the stock text ---------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_marked_copy_renders_exactly_the_stock_text(families, family):
    """On every shared conversation (rendering is cheap), where the stock template renders
    and where it raises."""
    f = families[family]
    assert GENERATION_TAG.search(f.marked) and not GENERATION_TAG.search(f.stock)
    compared = failing = 0
    for relative, conversations in sweep_conversations():
        for n, (conversation, stock) in enumerate(
                zip(conversations, f.stock_renders[relative], strict=True)):
            rendered = f.render(f.marked, conversation)
            assert rendered == stock, f"{relative} #{n}"
            compared += stock is not None
            failing += stock is None
    assert compared + failing == 12191
    assert failing == EXPECTED_OUTCOMES[family].get(TEMPLATE_ERROR, 0)


# --- 2. equality with transformers' mask from the marked copy ---------------------------------


def check_sweep(sweep: Sweep, family: str) -> None:
    assert not sweep.problems, (f"{len(sweep.problems)} of {len(sweep.rows)} conversations "
                                "differ:\n" + "\n".join(sweep.problems[:20]))
    expected = dict(EXPECTED_OUTCOMES[family])
    # Every conversation that is not trained prefix by prefix is in a chat file, swept whole.
    expected[PREFIX] += len(sweep.rows) - sum(expected.values())
    assert dict(sweep.outcomes) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_mask_equals_the_marked_copy(families, family):
    """Every chat conversation and SAMPLE_PER_FILE of each other file."""
    sweep = families[family].sweep(SAMPLE_PER_FILE)
    assert len(sweep.rows) == 1400 + 4 * SAMPLE_PER_FILE
    check_sweep(sweep, family)


SENTINEL_SAMPLE = 40  # conversations of each file, chat files too


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sentinel_method_alone_equals_the_marked_copy(families, family):
    """The general method finds every family's masks by itself, prefix-stable or not: the same
    masks as the marked copy, and the same rejections as the other methods."""
    f = families[family]
    sweep = f.sweep(SENTINEL_SAMPLE, MaskOptions(sentinels_only=True), cap_chats=True)
    assert not sweep.problems, "\n".join(sweep.problems[:20])
    assert sweep.outcomes[SENTINELS] > 0.8 * len(sweep.rows)
    assert set(sweep.outcomes) <= {SENTINELS, TEMPLATE_ERROR, TOOLS_NOT_RENDERED}
    others = f.sweep(SENTINEL_SAMPLE, DEFAULT, cap_chats=True)
    assert [row.ours.reason for row in sweep.rows if isinstance(row.ours, Drop)] == \
        [row.ours.reason for row in others.rows if isinstance(row.ours, Drop)]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_mask_equals_the_marked_copy_on_every_shared_conversation(families, family):
    sweep = families[family].sweep(None)
    assert len(sweep.rows) == 12191
    check_sweep(sweep, family)


def test_qwen3_locates_every_turn_and_multi_turn_chats_take_the_full_render(families):
    """Qwen3's stock template drops the think block of a reply that is not the last message:
    such conversations are located in the full rendering, every other one prefix by prefix."""
    sweep = families["qwen3"].sweep(SAMPLE_PER_FILE)
    assert sweep.outcomes[TURN_NOT_LOCATED] == 0
    multi_turn = 0
    for row in sweep.rows:
        turns = trainable_turns(row.conversation)
        rewritten = any(i + 1 < len(row.conversation.messages) for i in turns)
        assert row.ours.mask_method == (FULL_RENDER if rewritten else PREFIX), row.where
        multi_turn += len(turns) > 1
    assert multi_turn > 700


def test_stock_templates_without_tool_support_reject_only_conversations_with_tools(families):
    """No conversation without tools or tool calls is rejected as tools_not_rendered, by any
    family; those with tools are rendered where the stock template supports tools."""
    for name, f in families.items():
        for row in f.sweep(SAMPLE_PER_FILE).rows:
            ours = row.ours
            if isinstance(ours, Drop) and ours.reason == TOOLS_NOT_RENDERED:
                assert name in NO_TOOL_SUPPORT and has_tools(row.conversation), row.where
            if row.conversation.tools and name not in NO_TOOL_SUPPORT and row.stock is not None:
                assert isinstance(ours, EncodedExample), row.where


def test_deepseek_tool_call_branch_is_never_taken():
    """The DeepSeek V3 marked copy leaves its ``content is none`` branch unmarked: canonical
    messages always hold string content."""
    for _, conversations in sweep_conversations():
        for conversation in conversations:
            assert all(isinstance(m["content"], str) for m in conversation.messages)


# --- 3. reasoning ------------------------------------------------------------------------------


@functools.cache
def gsm8k_reasoning() -> tuple[tuple[str, str, str], ...]:
    """(question, reasoning, final answer) of every GSM8K test row: the answer text before its
    final "#### N" line is the reasoning, N the reply."""
    rows = []
    for row in gsm8k_rows():
        reasoning, _, answer = row["answer"].rpartition("\n#### ")
        assert reasoning and answer.strip()
        rows.append((row["question"], reasoning.strip(), answer.strip()))
    return tuple(rows)


def reasoning_turns(question: str, reasoning: str, answer: str) -> tuple[dict, dict]:
    return ({"role": "user", "content": question},
            {"role": "assistant", "content": answer, "reasoning_content": reasoning})


@functools.cache
def reasoning_conversations() -> tuple[Conversation, ...]:
    """One single-turn conversation per row, and a two-turn one per pair of rows."""
    rows = gsm8k_reasoning()
    single = [Conversation(reasoning_turns(*row)) for row in rows]
    double = [Conversation((*reasoning_turns(*a), *reasoning_turns(*b)))
              for a, b in zip(rows[::2], rows[1::2], strict=False)]
    return (*single, *double)


@functools.cache
def reasoning_results(tok, options: MaskOptions) -> list[EncodedExample | Drop]:
    return encode_conversations(tok, list(reasoning_conversations()), options)


def replies(conversation: Conversation) -> list[dict]:
    return [m for m in conversation.messages if m["role"] == "assistant"]


def without_reasoning_segments(tok, example: EncodedExample, reasoning: str, answer: str,
                               end: str, first: int) -> tuple[str, str, str]:
    """The two trained segments of a reply whose reasoning is not trained, starting at segment
    ``first``: "<think>\\n" and "\\n</think>\\n\\n" + answer + end, the latter possibly behind the
    tail of the reasoning that shares the first token with the "\\n" (".\\n" is one token).
    Returns (first segment, second segment, that tail)."""
    spans = segments(example.labels)
    opening, closing = (decode(tok, example.input_ids[a:b]) for a, b in spans[first:first + 2])
    tail = f"\n</think>\n\n{answer}{end}"
    assert closing.endswith(tail), closing
    straddle = closing[: len(closing) - len(tail)]
    assert reasoning.endswith(straddle)
    if straddle:  # one token holds both the reasoning's last characters and the "\n"
        a = spans[first + 1][0]
        assert decode(tok, example.input_ids[a : a + 1]) == straddle + "\n"
    return opening, closing, straddle


def test_qwen3_reasoning_is_trained_as_its_template_renders_it(families):
    """Default options: the mask equals the marked copy's; the stock template renders the
    reasoning of the last reply only, so an earlier reply's reasoning is not in the ids."""
    f = families["qwen3"]
    conversations = reasoning_conversations()
    results = reasoning_results(f.tok, DEFAULT)
    problems, earlier = [], 0
    for n, (conversation, ours) in enumerate(zip(conversations, results, strict=True)):
        problem = compare(f.tok, ours, reference(f.tok, f.marked, conversation, f.added))
        if problem:
            problems.append(f"#{n}: {problem}")
            continue
        text = decode(f.tok, ours.input_ids)
        *before, last = replies(conversation)
        trained = trained_texts(f.tok, ours)
        assert trained[-1] == nfc(f"<think>\n{last['reasoning_content']}\n</think>\n\n"
                                  f"{last['content']}<|im_end|>")
        for reply in before:
            assert nfc(reply["reasoning_content"]) not in text
            earlier += 1
        assert trained[:-1] == [nfc(r["content"]) + "<|im_end|>" for r in before]
        expected = FULL_RENDER if before else PREFIX
        assert ours.mask_method == expected, n
    assert not problems, "\n".join(problems[:20])
    assert earlier == len(gsm8k_reasoning()) // 2


def test_qwen3_reasoning_left_out_under_train_reasoning_false(families):
    tok = families["qwen3"].tok
    conversations = reasoning_conversations()
    trained_all = reasoning_results(tok, DEFAULT)
    results = reasoning_results(tok, MaskOptions(train_reasoning=False))
    straddles = 0
    for n, (conversation, full, ours) in enumerate(
            zip(conversations, trained_all, results, strict=True)):
        assert np.array_equal(full.input_ids, ours.input_ids), n
        trained = ours.labels != IGNORE_INDEX
        assert not (trained & (full.labels == IGNORE_INDEX)).any(), n  # only fewer tokens
        *before, last = replies(conversation)
        texts = trained_texts(tok, ours)
        assert len(texts) == len(before) + 2, n
        assert texts[: len(before)] == [nfc(r["content"]) + "<|im_end|>" for r in before]
        opening, _, straddle = without_reasoning_segments(
            tok, ours, nfc(last["reasoning_content"]), last["content"], "<|im_end|>",
            len(before))
        assert opening == "<think>\n", n
        straddles += bool(straddle)
    # A reasoning that ends with ".", "%" or "$" ends in one token with the "\n" (".\n"): so
    # do 1,138 of the 1,978 last replies here, whose closing segment then starts with it.
    assert 0 < straddles < len(conversations)


HARMONY_FINAL = "<|channel|>final<|message|>"
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"


@pytest.mark.parametrize("train_reasoning", [True, False])
def test_harmony_reasoning_goes_to_the_analysis_channel(families, train_reasoning):
    """GPT-OSS reads reasoning as ``thinking`` and writes the last reply's to its analysis
    channel (an earlier reply's is not rendered); the mask equals the marked copy's, and
    without --train_reasoning only the reasoning text leaves the loss."""
    f = families["gptoss"]
    conversations = reasoning_conversations()
    results = encode_conversations(f.tok, list(conversations),
                                   MaskOptions(train_reasoning=train_reasoning))
    problems = []
    for n, (conversation, ours) in enumerate(zip(conversations, results, strict=True)):
        if train_reasoning:
            problem = compare(f.tok, ours, reference(f.tok, f.marked, conversation, f.added,
                                                     "thinking"))
            if problem:
                problems.append(f"#{n}: {problem}")
                continue
        *before, last = replies(conversation)
        text = decode(f.tok, ours.input_ids)
        assert "<think>" not in text
        assert all(nfc(r["reasoning_content"]) not in text for r in before), n
        earlier = [f"{HARMONY_FINAL}{nfc(r['content'])}<|end|>" for r in before]
        thought, answer = nfc(last["reasoning_content"]), nfc(last["content"])
        reply = f"<|end|><|start|>assistant{HARMONY_FINAL}{answer}<|return|>"
        expected = ([f"{HARMONY_ANALYSIS}{thought}{reply}"] if train_reasoning
                    else [HARMONY_ANALYSIS, reply])
        assert trained_texts(f.tok, ours) == [*earlier, *expected], n
        assert ours.mask_method == (SENTINELS if before else PREFIX), n
    assert not problems, "\n".join(problems[:20])


def test_a_rejection_names_the_option_that_avoids_it(families):
    """Llama 3.1's stock template drops tool calls: the message names the built-in template of
    its family that renders them, and that template trains the calls."""
    f = families["llama3_1"]
    conversation = next(row.conversation for row in f.sweep(SAMPLE_PER_FILE).rows
                        if isinstance(row.ours, Drop) and row.ours.reason == TOOLS_NOT_RENDERED)
    (drop,) = encode_conversations(f.tok, [conversation], DEFAULT)
    assert "pass --chat_template llama3," in drop.message
    llama3 = with_template(f.tok, builtin_template("llama3"))
    (example,) = encode_conversations(llama3, [conversation], DEFAULT)
    assert isinstance(example, EncodedExample)


@pytest.mark.parametrize("train_reasoning", [True, False])
def test_chatml_writes_reasoning_inline_and_trains_it_or_not(families, train_reasoning):
    """The default tokenizer's ChatML template does not render ``reasoning_content``: every
    reply's reasoning is written into its content as "<think>\\n{reasoning}\\n</think>\\n\\n"."""
    tok = families[DEFAULT_FAMILY].tok
    conversations = reasoning_conversations()
    results = encode_conversations(tok, list(conversations),
                                   MaskOptions(train_reasoning=train_reasoning))
    for n, (conversation, ours) in enumerate(zip(conversations, results, strict=True)):
        assert isinstance(ours, EncodedExample) and ours.mask_method == PREFIX, n
        text = decode(tok, ours.input_ids)
        texts = trained_texts(tok, ours)
        for k, reply in enumerate(replies(conversation)):
            reasoning, answer = nfc(reply["reasoning_content"]), nfc(reply["content"])
            inline = f"<think>\n{reasoning}\n</think>\n\n{answer}"
            assert f"<|im_start|>assistant\n{inline}<|im_end|>" in text
            if train_reasoning:
                assert texts[k] == inline + "<|im_end|>", n
            else:
                opening, _, _ = without_reasoning_segments(tok, ours, reasoning, answer,
                                                           "<|im_end|>", 2 * k)
                assert opening == "<think>\n", n
        assert len(texts) == len(replies(conversation)) * (1 if train_reasoning else 2)


# --- 4. Qwen3 tool calls -----------------------------------------------------------------------


def qwen3_reply(conversation: Conversation, i: int) -> str:
    """What Qwen3's stock template writes for assistant message ``i`` after its header, through
    <|im_end|> (written here from the template's rules, not by rendering it)."""
    messages = conversation.messages
    message = messages[i]
    last_query = max(k for k, m in enumerate(messages) if m["role"] == "user"
                     and not (m["content"].startswith("<tool_response>")
                              and m["content"].endswith("</tool_response>")))
    content = message["content"]
    think = i > last_query and (i + 1 == len(messages) or message.get("reasoning_content"))
    text = f"<think>\n\n</think>\n\n{content.lstrip(chr(10))}" if think else content
    for k, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        text += "\n" if (k == 0 and content) or k else ""
        arguments = json.dumps(function["arguments"], ensure_ascii=False)
        text += f'<tool_call>\n{{"name": "{function["name"]}", "arguments": {arguments}}}\n' \
                "</tool_call>"
    return nfc(text + "<|im_end|>")


@pytest.mark.parametrize("relative", ["chat/glaive_toolcall_en_demo.json",
                                      "chat/glaive_toolcall_zh_demo.json"])
def test_qwen3_tool_calls_decode_to_exactly_the_replies(families, relative):
    f = families["qwen3"]
    conversations = adapted(relative)[0]
    rows = [r for r in f.sweep(SAMPLE_PER_FILE).rows if r.where.startswith(f"{relative} #")]
    assert [r.conversation for r in rows] == list(conversations)  # swept whole
    results = [r.ours for r in rows]
    tok = f.tok
    response_open, response_close = tok.convert_tokens_to_ids(
        ["<tool_response>", "</tool_response>"])
    calls = responses = multi_turn = 0
    for n, (conversation, ours) in enumerate(zip(conversations, results, strict=True)):
        assert isinstance(ours, EncodedExample), n
        turns = trainable_turns(conversation)
        expected = [qwen3_reply(conversation, i) for i in turns]
        assert trained_texts(tok, ours) == expected, n
        calls += sum(len(conversation.messages[i].get("tool_calls") or ()) for i in turns)
        # Only the last message, a reply, has the empty think block: no reply carries reasoning.
        assert turns[-1] == len(conversation.messages) - 1, n
        assert [e.startswith("<think>\n\n</think>\n\n") for e in expected] == [
            k + 1 == len(expected) for k in range(len(expected))], n
        multi_turn += len(turns) > 1
        # Nothing from <tool_response> through </tool_response> is trained.
        ids, trained = ours.input_ids, ours.labels != IGNORE_INDEX
        opens = np.flatnonzero(ids == response_open)
        closes = np.flatnonzero(ids == response_close)
        assert len(opens) == len(closes) == sum(m["role"] == "tool"
                                                for m in conversation.messages)
        for a, b in zip(opens, closes, strict=True):
            assert not trained[a : b + 1].any(), n
        responses += len(opens)
    assert calls > 150 and responses > 150 and multi_turn > 200


# --- 5. TRL's training templates as a second reference -------------------------------------

TRL_TEMPLATES = {
    "qwen3": "qwen3_training.jinja",
    "llama3_1": "llama3_training.jinja",
    "gemma3": "gemma3_training.jinja",
    "deepseek_v3": "deepseekv3_training.jinja",
}


@functools.cache
def trl_template(name: str) -> str:
    """A template shipped with TRL, read without importing TRL (which imports torch)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("TRL is not installed")
    return (Path(spec.submodule_search_locations[0]) / "chat_templates" / name).read_text()


def with_template(tok, template: str):
    """A shallow copy of ``tok`` whose chat template is ``template`` (the original is shared)."""
    copied = copy.copy(tok)
    copied.chat_template = template
    return copied


# TRL's conventions differ from ours by one token per trained turn: Qwen3's and Gemma 3's blocks
# also hold the "\n" after the end-of-turn token ("after" each of our segments), DeepSeek V3's
# the token that opens the reply, which the generation prompt ends with ("before": <|Assistant|>,
# or <|tool_outputs_end|> for a reply after tool outputs); Llama 3's are ours.
TRL_EXTRA_TOKEN = {"qwen3": "after", "gemma3": "after", "llama3_1": None, "deepseek_v3": "before"}
TRL_SAMPLE = (200, 50)  # conversations of each chat file, of each other file
# TRL's DeepSeek V3 generation prompt is "<|Assistant|><think>\n", which no rendered reply holds:
# without tags it is not prefix-stable. Its stock V3 form, for the comparison without tags.
DS_TRL_PROMPT = (f"{{{{'{DS_ASSISTANT}<think>\\n'}}}}", f"{{{{'{DS_ASSISTANT}'}}}}")


def trl_conversations(caps: tuple[int, int] | None) -> list[tuple[str, Conversation]]:
    """An evenly spread sample of each file (``caps``: of a chat file, of another), or all."""
    rows = []
    for relative, conversations in sweep_conversations():
        cap = None if caps is None else caps[0] if relative.startswith("chat/") else caps[1]
        rows += [(f"{relative} #{k}", conversations[k])
                 for k in spread(tuple(range(len(conversations))), cap)]
    return rows


@functools.cache
def trl_references(f: Family, caps: tuple[int, int] | None) -> list[Reference | None]:
    """transformers' ids and mask from TRL's template (as shipped) for ``trl_conversations``."""
    template = trl_template(TRL_TEMPLATES[f.name])
    return [reference(f.tok, template, c, f.added) for _, c in trl_conversations(caps)]


def tool_call_replies(conversation: Conversation) -> int:
    return sum(bool(m.get("tool_calls")) for m in conversation.messages)


def trl_generation_markers(families, family: str, caps: tuple[int, int] | None) -> None:
    """(a) With TRL's template as the tokenizer's, our mask is transformers' own."""
    f = families[family]
    template = trl_template(TRL_TEMPLATES[family])
    rows = trl_conversations(caps)
    results = encode_conversations(with_template(f.tok, template), [c for _, c in rows], DEFAULT)
    problems, outcomes = [], collections.Counter()
    for (where, conversation), ours, theirs in zip(rows, results, trl_references(f, caps),
                                                   strict=True):
        outcome = ours.mask_method if isinstance(ours, EncodedExample) else ours.reason
        outcomes[outcome] += 1
        if outcome == TOOLS_NOT_RENDERED:  # TRL's Llama 3, Gemma 3, DeepSeek V3 drop tools
            if family not in NO_TOOL_SUPPORT or not conversation.tools:
                problems.append(f"{where}: {ours.message:.200}")
            continue
        problem = compare(f.tok, ours, theirs)
        if problem is None and isinstance(ours, EncodedExample) and outcome != GENERATION_MARKERS:
            problem = f"mask method {outcome}"
        if problem:
            problems.append(f"{where}: {problem}")
    assert not problems, f"{len(problems)} differ:\n" + "\n".join(problems[:20])
    assert outcomes[GENERATION_MARKERS] > len(rows) // 2, outcomes
    assert f.tok.get_chat_template() == f.stock  # the shared tokenizer is left as it was
    assert family != "qwen3" or outcomes[GENERATION_MARKERS] == len(rows)


def trl_without_tags(families, family: str, caps: tuple[int, int] | None) -> None:
    """(b) With the tags stripped from TRL's template, our prefix method trains what TRL's
    markers do, less exactly one token per turn (TRL_EXTRA_TOKEN), position by position."""
    f = families[family]
    template = trl_template(TRL_TEMPLATES[family])
    stripped = GENERATION_TAG.sub("", template)
    if family == "deepseek_v3":
        stripped = patch(stripped, *DS_TRL_PROMPT)
    rows = trl_conversations(caps)
    results = encode_conversations(with_template(f.tok, stripped), [c for _, c in rows], DEFAULT)
    side = TRL_EXTRA_TOKEN[family]
    allowed = {"after": {"\n"}, "before": {DS_ASSISTANT, DS_TOOL_OUTPUTS_END}, None: set()}[side]
    problems, outcomes, extra_tokens = [], collections.Counter(), collections.Counter()
    # The generation prompt plays no part in the full rendering: the shipped template's mask.
    for (where, conversation), ours, theirs in zip(rows, results, trl_references(f, caps),
                                                   strict=True):
        outcome = ours.mask_method if isinstance(ours, EncodedExample) else ours.reason
        outcomes[outcome] += 1
        if isinstance(ours, Drop):
            expected = (
                theirs is None if ours.reason == TEMPLATE_ERROR
                else family in NO_TOOL_SUPPORT and bool(conversation.tools)
                if ours.reason == TOOLS_NOT_RENDERED
                # TRL's DeepSeek V3 sets ns.is_first once per conversation: a second reply with
                # tool calls is written without its <|Assistant|>, unlike its generation prompt.
                else family == "deepseek_v3" and tool_call_replies(conversation) >= 2
                if ours.reason == TURN_NOT_LOCATED else False)
            if not expected:
                problems.append(f"{where}: {ours.reason}: {ours.message:.200}")
            continue
        assert theirs is not None and theirs.mask is not None, where
        if ours.mask_method != PREFIX or not np.array_equal(ours.input_ids, theirs.ids):
            problems.append(f"{where}: {ours.mask_method}, or the ids differ")
            continue
        trained = ours.labels != IGNORE_INDEX
        spans = segments(ours.labels)
        positions = ([b for _, b in spans] if side == "after" else
                     [a - 1 for a, _ in spans] if side == "before" else [])
        extra = np.flatnonzero(theirs.mask & ~trained).tolist()
        missing = np.flatnonzero(trained & ~theirs.mask).tolist()
        tokens = [decode(f.tok, ours.input_ids[p : p + 1]) for p in extra]
        extra_tokens.update(tokens)
        if missing or extra != positions or not set(tokens) <= allowed:
            shown = list(zip(extra, tokens, strict=True))[:6]
            problems.append(f"{where}: we train {missing} that TRL does not; TRL trains "
                            f"{shown}, expected {positions[:6]}")
    assert not problems, f"{len(problems)} differ:\n" + "\n".join(problems[:20])
    assert outcomes[PREFIX] > len(rows) // 2, outcomes
    assert set(extra_tokens) <= allowed and (side is None) == (not extra_tokens)


@pytest.mark.parametrize("family", list(TRL_TEMPLATES))
def test_trl_template_our_mask_is_transformers_own(families, family):
    trl_generation_markers(families, family, TRL_SAMPLE)


@pytest.mark.parametrize("family", list(TRL_TEMPLATES))
def test_trl_template_without_tags_differs_only_by_trls_convention(families, family):
    trl_without_tags(families, family, TRL_SAMPLE)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(TRL_TEMPLATES))
def test_trl_templates_on_every_shared_conversation(families, family):
    trl_generation_markers(families, family, None)
    trl_without_tags(families, family, None)


def test_trl_deepseek_template_without_tags_is_not_prefix_stable(families):
    """As shipped, its generation prompt "<|Assistant|><think>\\n" is no prefix of any rendered
    reply: without tags, every conversation is turn_not_located (no wrong mask)."""
    f = families["deepseek_v3"]
    stripped = GENERATION_TAG.sub("", trl_template(TRL_TEMPLATES["deepseek_v3"]))
    rows = trl_conversations((20, 20))
    results = encode_conversations(with_template(f.tok, stripped), [c for _, c in rows], DEFAULT)
    assert {r.reason for r in results if isinstance(r, Drop)} == {TURN_NOT_LOCATED}
    assert all(isinstance(r, Drop) for r in results)
