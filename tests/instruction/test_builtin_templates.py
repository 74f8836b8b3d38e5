"""The built-in chat templates (``--chat_template NAME``): each is checked against the stock
template of the real tokenizer of its family on the shared conversations, and the tool-calling
forms that stock templates lack against the conventions of this project's test templates.

A comparison renders each conversation three ways with both templates: whole, and its prefix up
to the last user message with and without the generation prompt; wherever the stock template
renders, the texts must be identical. The default run compares a spread sample; ``-m slow``
compares every shared conversation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
from jinja2 import TemplateError

from tests.conftest import SHARED_DATA, TEST_DATA, require_shared_data
from tests.support.shared_chats import SWEEP_FILES, adapted
from transforms.core import tokenizer as tk
from transforms.instruction.adapters import Conversation
from transforms.instruction.chat_template import check_template_tokens
from transforms.instruction.rendering.renderer import reasoning_field

require_shared_data()

TOKENIZERS = SHARED_DATA.parent / "tokenizers"
TEST_TEMPLATES = TEST_DATA / "templates"
# Built-in template -> the folder of the real tokenizer whose stock template it reproduces.
STOCK = {"qwen3": "qwen3", "llama3": "llama3_1", "gemma3": "gemma3", "deepseekv3": "deepseek_v3",
         "gptoss": "gptoss"}
SYSTEM = "You are a careful assistant. Answer briefly."
GLAIVE_FILES = ("chat/glaive_toolcall_en_demo.json", "chat/glaive_toolcall_zh_demo.json")
GLAIVE = GLAIVE_FILES[0]
GSM8K = ("math/gsm8k_test.jsonl", "math/gsm8k_train.jsonl")


def uses_tools(conversation: Conversation) -> bool:
    return bool(conversation.tools) or any(
        m["role"] == "tool" or m.get("tool_calls") for m in conversation.messages)


def with_messages(conversation: Conversation, messages: list[dict]) -> Conversation:
    return dataclasses.replace(conversation, messages=tuple(messages))


def reasoned(conversation: Conversation, inline: bool = False) -> Conversation:
    """A GSM8K conversation whose reply is its final number, reasoned by the worked answer
    (``reasoning_content``, or a ``<think>`` block in the content when ``inline``)."""
    user, reply = conversation.messages
    reasoning, _, answer = reply["content"].rpartition("\n####")
    assert reasoning and answer.strip(), reply["content"]
    answer = answer.strip()
    if inline:
        reply = {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n{answer}"}
    else:
        reply = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    return with_messages(conversation, [user, reply])


@functools.cache
def conversations(every: bool) -> tuple[Conversation, ...]:
    """The shared conversations (``every``: all of them; else every 2nd chat and every 16th of
    the single-turn instruction and GSM8K rows), and system-prompt and untrimmed variants of
    some."""
    step = 1 if every else 16
    selected = [c for relative in SWEEP_FILES for c in
                adapted(relative)[0][:: min(step, 2) if relative.startswith("chat/") else step]]
    assert len(selected) > (12_000 if every else 1_200)
    some = selected[:: 15 if every else 4]
    with_system = [with_messages(c, [{"role": "system", "content": SYSTEM}, *c.messages])
                   for c in some if c.messages[0]["role"] != "system"]
    untrimmed = [with_messages(c, [{**m, "content": f"\n {m['content']}  \n"} for m in c.messages])
                 for c in some[::3]]
    return (*selected, *with_system, *untrimmed)


@functools.cache
def reasoning_conversations(every: bool) -> tuple[Conversation, ...]:
    """GSM8K with reasoning (single and two-turn, field and inline), and tool-calling chats whose
    replies carry reasoning: earlier replies lose it in Qwen3's history rewriting."""
    gsm8k = [c for relative in GSM8K for c in adapted(relative)[0]][:: 1 if every else 24]
    single = [reasoned(c) for c in gsm8k]
    inline = [reasoned(c, inline=True) for c in gsm8k[::3]]
    pairs = [with_messages(a, [*a.messages, *b.messages])
             for a, b in zip(single[::3], single[1::3], strict=False)]
    tools = [with_messages(c, [{**m, "reasoning_content": f"Step {i}: what does the user need?"}
                               if m["role"] == "assistant" else m
                               for i, m in enumerate(c.messages)])
             for relative in GLAIVE_FILES for c in adapted(relative)[0] if uses_tools(c)]
    return (*single, *inline, *pairs, *tools)


@pytest.fixture(scope="module")
def stock():
    """The real tokenizer in a folder of ``TOKENIZERS``, loaded on first use (a skip where it is
    missing) and dropped after this module: the Gemma 3 one alone is 33 MB of JSON."""
    loaded = {}

    def get(folder: str):
        if folder not in loaded:
            path = TOKENIZERS / folder
            if not (path / "tokenizer_config.json").is_file():
                pytest.skip(f"the real {folder} tokenizer is not in {TOKENIZERS}")
            from transformers import AutoTokenizer

            loaded[folder] = AutoTokenizer.from_pretrained(str(path))
        return loaded[folder]

    yield get
    loaded.clear()


def variants(conversation: Conversation) -> list[tuple[list[dict], bool]]:
    """(messages, add_generation_prompt): the whole conversation, and its prefix up to the last
    user message with and without the generation prompt."""
    messages = list(conversation.messages)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    prefix = messages[: users[-1] + 1] if users else None
    return [(messages, False)] + ([(prefix, True), (prefix, False)] if prefix else [])


def compare(tok, name: str, selected: list[Conversation], **kwargs) -> tuple[int, int]:
    """Renders every variant with ``tok``'s stock template and the built-in one; returns how many
    were compared and how many the stock template could not render. Fails on a difference."""
    ours = tk.builtin_template(name)
    compared = stock_failed = 0
    for conversation in selected:
        tools = list(conversation.tools) if conversation.tools else None
        for messages, generation_prompt in variants(conversation):
            render = functools.partial(tok.apply_chat_template, messages, tools=tools,
                                       tokenize=False, add_generation_prompt=generation_prompt,
                                       **kwargs)
            try:
                expected = render(chat_template=tok.chat_template)
            except Exception:  # the stock template's own limits (roles, content types)
                with pytest.raises(TemplateError):  # and ours keeps them
                    render(chat_template=ours)
                stock_failed += 1
                continue
            assert render(chat_template=ours) == expected, (name, messages, generation_prompt)
            compared += 1
    return compared, stock_failed


def check_qwen3(tok, every: bool) -> None:
    selected = [*conversations(every), *reasoning_conversations(every)]
    compared, failed = compare(tok, "qwen3", selected)
    assert compared > (60_000 if every else 8_000) and failed == 0, (compared, failed)
    # The prompt of a reply without thinking: an empty <think> block after the header.
    prompts, _ = compare(tok, "qwen3", [c for c in conversations(every)[::10]
                                        if c.messages[-1]["role"] == "assistant"],
                         enable_thinking=False)
    assert prompts > (3_000 if every else 500), prompts


def as_thinking(conversation: Conversation) -> Conversation:
    """Reasoning under harmony's name for it, as the pipeline passes it to GPT-OSS."""
    return with_messages(conversation, [
        {("thinking" if k == "reasoning_content" else k): v for k, v in m.items()}
        for m in conversation.messages])


def check_gptoss(tok, every: bool) -> None:
    """Tools included: harmony writes function tools as a TypeScript namespace."""
    selected = [*conversations(every), *map(as_thinking, reasoning_conversations(every))]
    compared, failed = compare(tok, "gptoss", selected)
    # Both raise on a tool result with no call before it (six glaive conversations here).
    assert compared > (60_000 if every else 8_000) and failed < (60 if every else 10), \
        (compared, failed)


def check_without_tools(tok, name: str, every: bool) -> None:
    """The stock templates of these families ignore tool definitions and calls, so conversations
    that use tools are compared only for qwen3."""
    compared, failed = compare(tok, name, [c for c in conversations(every) if not uses_tools(c)])
    assert compared > (38_000 if every else 4_500) and failed == 0, (compared, failed)


def test_qwen3_renders_as_the_stock_template(stock):
    check_qwen3(stock(STOCK["qwen3"]), every=False)


def test_gptoss_renders_as_the_stock_template(stock):
    check_gptoss(stock(STOCK["gptoss"]), every=False)


@pytest.mark.parametrize("name", ["llama3", "gemma3", "deepseekv3"])
def test_renders_as_the_stock_template_without_tools(stock, name):
    check_without_tools(stock(STOCK[name]), name, every=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma3", "deepseekv3", "gptoss"])
def test_every_shared_conversation_renders_as_the_stock_template(stock, name):
    """The sweep above on every shared conversation and every GSM8K row (run with -m slow)."""
    if name == "qwen3":
        check_qwen3(stock(STOCK[name]), every=True)
    elif name == "gptoss":
        check_gptoss(stock(STOCK[name]), every=True)
    else:
        check_without_tools(stock(STOCK[name]), name, every=True)


def test_chatml_is_the_default_tokenizers_template():
    assert tk.builtin_template("chatml") == tk.CHATML_TEMPLATE
    assert tk.load_tokenizer().chat_template == tk.CHATML_TEMPLATE


def test_the_package_holds_exactly_the_builtin_templates():
    folder = Path(tk.__file__).parents[1] / "instruction" / "templates"
    assert sorted(p.stem for p in folder.glob("*.jinja")) == sorted(tk.BUILTIN_TEMPLATES)
    for name in tk.BUILTIN_TEMPLATES:  # where rendering/renderer.py passes the reasoning
        field = reasoning_field(tk.builtin_template(name))
        assert field == {"qwen3": "reasoning_content", "gptoss": "thinking"}.get(name), name


def tool_conversation() -> Conversation:
    """A glaive conversation with tools, a call, its result and a reply, and a system prompt."""
    conversation = next(c for c in adapted(GLAIVE)[0] if c.tools and len(c.messages) >= 5
                        and any(m["role"] == "tool" for m in c.messages))
    return with_messages(conversation, [{"role": "system", "content": SYSTEM},
                                        *conversation.messages])


def dumps(value: object, **kwargs) -> str:
    return json.dumps(value, ensure_ascii=False, **kwargs)


def test_llama3_renders_tools_as_llama31(stock):
    conversation = tool_conversation()
    tok = stock(STOCK["llama3"])
    text = tok.apply_chat_template(list(conversation.messages), tools=list(conversation.tools),
                                   chat_template=tk.builtin_template("llama3"), tokenize=False)
    system = text.split("<|eot_id|>")[0]
    assert system.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert system.endswith(SYSTEM)
    for tool in conversation.tools:
        assert dumps(tool, indent=4) in system
    calls = results = 0
    for message in conversation.messages:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            calls += 1
            assert ("<|start_header_id|>assistant<|end_header_id|>\n\n" + dumps(
                {"name": function["name"], "parameters": function["arguments"]}) + "<|eot_id|>"
                ) in text
        if message["role"] == "tool":
            results += 1
            assert (f"<|start_header_id|>ipython<|end_header_id|>\n\n{message['content'].strip()}"
                    "<|eot_id|>") in text
    assert calls and results and "<|start_header_id|>tool<|end_header_id|>" not in text


def test_mistral_renders_tools_in_v3_control_tokens():
    conversation = tool_conversation()
    tok = tk.load_tokenizer(None, "mistral")
    text = tok.apply_chat_template(list(conversation.messages), tools=list(conversation.tools),
                                   tokenize=False)
    assert text.startswith(f"<s>[AVAILABLE_TOOLS]{dumps(list(conversation.tools))}"
                           f"[/AVAILABLE_TOOLS][INST]{SYSTEM}\n\n")
    calls = results = 0
    for message in conversation.messages:
        if message.get("tool_calls"):
            calls += 1
            functions = [c["function"] for c in message["tool_calls"]]
            assert f"[/INST]{message['content']}[TOOL_CALLS]{dumps(functions)}</s>" in text
        if message["role"] == "tool":
            results += 1
            assert f"</s>[TOOL_RESULTS]{message['content']}[/TOOL_RESULTS]" in text
    assert calls and results


def test_mistral_renders_as_the_projects_test_template():
    from transformers.utils.chat_template_utils import render_jinja_template

    reference = (TEST_TEMPLATES / "mistral.jinja").read_text()
    compared = 0
    for relative in (*GLAIVE_FILES, "chat/fastchat_dummy_conversation.json"):
        for c in adapted(relative)[0]:
            for messages in (list(c.messages), [{"role": "system", "content": SYSTEM},
                                                *c.messages]):
                tools = list(c.tools) if c.tools else None
                texts = [render_jinja_template([messages], tools=tools, chat_template=t)[0]
                         for t in (reference, tk.builtin_template("mistral"))]
                assert texts[0] == texts[1], messages
                compared += 1
    assert compared > 2_000


@pytest.mark.parametrize("name", tk.BUILTIN_TEMPLATES)
def test_tool_conversations_render_in_full_and_prefix_stable(name):
    """Every tool definition, call and result is in the text (gptoss writes results as JSON
    strings); every template but qwen3 and gptoss (which rewrite history, as their models' own
    templates do) renders each prompt and each conversation up to an assistant reply as a prefix
    of the whole."""
    tok = tk.load_tokenizer(None, name)
    checked = 0
    for c in adapted(GLAIVE)[0]:
        if not uses_tools(c):
            continue
        messages, tools = list(c.messages), list(c.tools) if c.tools else None
        render = functools.partial(tok.apply_chat_template, tools=tools, tokenize=False)
        full = render(messages)
        for tool in tools or ():
            assert tool["function"]["name"] in full
        for i, message in enumerate(messages):
            if message["role"] == "tool":
                result = message["content"]
                assert (json.dumps(result, ensure_ascii=False) if name == "gptoss"
                        else result.strip()) in full
            for call in message.get("tool_calls") or []:
                assert call["function"]["name"] in full
                assert dumps(call["function"]["arguments"]) in full
            if message["role"] == "assistant" and name not in ("qwen3", "gptoss"):
                assert full.startswith(render(messages[:i], add_generation_prompt=True))
                assert full.startswith(render(messages[: i + 1]))
        checked += 1
    assert checked > 150


def test_load_tokenizer_takes_a_builtin_name():
    default = tk.load_tokenizer()
    tok = tk.load_tokenizer(None, "qwen3")
    assert tok.chat_template == tk.builtin_template("qwen3")
    assert tok is tk.load_tokenizer(None, "qwen3") and tok.backend_tokenizer is \
        default.backend_tokenizer
    assert default.chat_template == tk.CHATML_TEMPLATE
    identity = tk.tokenizer_identity(tok)
    assert identity["chat_template_sha256"] != tk.tokenizer_identity(default)[
        "chat_template_sha256"]


def test_an_unknown_name_fails_clearly_listing_the_names():
    with pytest.raises(ValueError, match="neither a built-in template") as error:
        tk.load_tokenizer(None, "qwen4")
    assert all(name in str(error.value) for name in tk.BUILTIN_TEMPLATES)
    with pytest.raises(ValueError, match="chatml, deepseekv3"):
        tk.builtin_template("llama2")


def test_an_existing_file_beats_a_builtin_name(tmp_path, monkeypatch):
    (tmp_path / "gemma3").write_text("{{ messages[0].content }}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert tk.read_chat_template("gemma3") == "{{ messages[0].content }}"
    assert tk.read_chat_template(str(tmp_path / "gemma3")) == "{{ messages[0].content }}"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert tk.read_chat_template("gemma3") == tk.builtin_template("gemma3")



@pytest.mark.parametrize("name", [*STOCK, "chatml", "mistral"])
def test_each_builtin_template_fits_its_familys_tokenizer(name):
    folder = STOCK.get(name)
    tok = tk.load_tokenizer(None if folder is None else str(TOKENIZERS / folder), name)
    check_template_tokens(tok, name)  # raises if its markup were not tokens


@pytest.mark.parametrize(("name", "folder", "markup"), [
    ("llama3", None, "<|start_header_id|>, <|end_header_id|>, <|eot_id|>"),
    ("gemma3", None, "<start_of_turn>, <end_of_turn>"),
    ("deepseekv3", "llama3_1", "<\uff5cUser\uff5c>, <\uff5cAssistant\uff5c>, "
                               "<\uff5cend\u2581of\u2581sentence\uff5c>"),
    ("chatml", "gemma3", "<|im_start|>, <|im_end|>"),
])
def test_another_familys_template_is_refused_naming_its_markup(name, folder, markup):
    """Its markup would otherwise be trained as text: with Qwen2's vocabulary, Llama 3's
    <|start_header_id|> is 7 tokens ('<', '|', 'start', '_header', '_id', '|', '>')."""
    spec = None if folder is None else str(TOKENIZERS / folder)
    tok = tk.load_tokenizer(spec, name)
    assert len(tok.encode(markup.split(", ")[0], add_special_tokens=False)) > 1
    with pytest.raises(ValueError) as error:
        check_template_tokens(tok, f"--chat_template {name!r}")
    assert str(error.value) == (
        f"--chat_template {name!r} writes {markup}, which the tokenizer {tok.name_or_path!r} does "
        "not hold as tokens (another model family's template): they would be trained as plain "
        "text; pass the --tokenizer of the template's model, or a template written for this "
        "tokenizer (or --template_markup_as_text=true if it spells its markup as text by "
        "design)")
