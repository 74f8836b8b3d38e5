"""Marked copies of real stock chat templates, built at test time, and the shared conversations.

The vendors' templates are not stored in the repository: each marked copy is the stock template
of a tokenizer in ``shared/tokenizers`` (or the project's ``CHATML_TEMPLATE``) with a few string
replacements that put ``{% generation %}`` / ``{% endgeneration %}`` around what the project's
convention trains in an assistant turn: everything after the role header, up to and including
the end-of-turn token, without the whitespace glue the template writes after it. Every
replacement must match exactly once in the stock text (``patch`` asserts it), so a changed
vendor template fails loudly instead of yielding a silently different reference.

Jinja blocks must nest, and stock templates often write a role header and the reply in one
expression, or close the turn in another branch than the one that opened it; the patches
therefore split such expressions, or capture the reply with ``{% set body %}...{% endset %}``
and write the capture inside the generation block. The rendered text never changes, which the
tests check on every shared conversation.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Iterator

import pytest

from tests.conftest import SHARED_DATA, require_shared_data

require_shared_data()

GENERATION_TAG = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
TOKENIZERS = SHARED_DATA.parent / "tokenizers"
REAL_FAMILIES = ("qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss")
DEFAULT_FAMILY = "chatml"  # the project's default tokenizer and its CHATML_TEMPLATE
FAMILIES = (*REAL_FAMILIES, DEFAULT_FAMILY)

# DeepSeek's control tokens use FULLWIDTH VERTICAL LINE and LOWER ONE EIGHTH BLOCK.
_BAR, _SPACE = "\uff5c", "\u2581"
DS_ASSISTANT = f"<{_BAR}Assistant{_BAR}>"
DS_USER = f"<{_BAR}User{_BAR}>"
DS_EOS = f"<{_BAR}end{_SPACE}of{_SPACE}sentence{_BAR}>"
DS_TOOL_OUTPUTS_END = f"<{_BAR}tool{_SPACE}outputs{_SPACE}end{_BAR}>"

END_OF_TURN = {
    "qwen3": "<|im_end|>",
    "chatml": "<|im_end|>",
    "llama3_1": "<|eot_id|>",
    "gemma3": "<end_of_turn>",
    "deepseek_v3": DS_EOS,
    "gptoss": "<|return|>",  # the last reply's; an earlier one ends with <|end|>, a call <|call|>
}
HARMONY_HEADER = "<|start|>assistant"  # the generation prompt: the model writes what follows

# (what the stock template holds, what the marked copy holds instead, why). In the Python
# strings below "\n" is a newline of the template's source and "\\n" the two characters of a
# Jinja string escape.
PATCHES: dict[str, list[tuple[str, str, str]]] = {
    "qwen3": [
        (
            "{%- if loop.index0 > ns.last_query_index %}",
            "{{- '<|im_start|>' + message.role + '\\n' }}\n"
            "        {%- generation %}\n"
            "        {%- if loop.index0 > ns.last_query_index %}",
            "the assistant branch writes its role header once, before the three ways of writing "
            "the reply, and opens the generation block after it",
        ),
        (
            "'<|im_start|>' + message.role + '\\n<think>\\n' + ",
            "'<think>\\n' + ",
            "the reply with a think block no longer writes the header itself",
        ),
        (
            "{%- else %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}",
            "{%- else %}\n                {{- content }}",
            "nor does the reply after the last query without reasoning (16-space indent)",
        ),
        (
            "{%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}",
            "{%- else %}\n            {{- content }}",
            "nor the reply before the last query (12-space indent)",
        ),
        (
            "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
            "{{- '<|im_end|>' }}\n        {%- endgeneration %}\n        {{- '\\n' }}\n"
            "    {%- elif message.role == \"tool\" %}",
            "the block closes after <|im_end|>, before the newline glue",
        ),
    ],
    "chatml": [
        (
            "{{- '<|im_start|>assistant' }}\n        {%- if message.content %}",
            "{{- '<|im_start|>assistant' }}\n        {%- set body %}\n"
            "        {%- if message.content %}",
            "a reply with tool calls is captured: its header's newline is written by the reply "
            "('\\n' + content or '\\n<tool_call>')",
        ),
        (
            "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == 'tool' %}",
            "{{- '<|im_end|>' }}\n        {%- endset %}\n        {{- body[:1] }}\n"
            "        {%- generation %}{{- body[1:] }}{%- endgeneration %}\n        {{- '\\n' }}\n"
            "    {%- elif message.role == 'tool' %}",
            "its first character (that newline) is written before the block, the rest inside",
        ),
        (
            "    {%- else %}\n        {{- '<|im_start|>' + message.role",
            "    {%- elif message.role == 'assistant' %}\n"
            "        {{- '<|im_start|>assistant\\n' }}{%- generation %}"
            "{{- message.content + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n"
            "    {%- else %}\n        {{- '<|im_start|>' + message.role",
            "a plain reply gets its own branch that splits header, reply and glue",
        ),
    ],
    "llama3_1": [
        (
            "{{ content }}",
            "{% if message['role'] == 'assistant' %}"
            "{% set body = message['content'] | trim + '<|eot_id|>' %}"
            "{{ content[:content|length - body|length] }}"
            "{% generation %}{{ body }}{% endgeneration %}"
            "{% else %}{{ content }}{% endif %}",
            "content is bos + header + reply + <|eot_id|> in one string: an assistant's is cut "
            "where its reply starts (no glue follows <|eot_id|>)",
        ),
    ],
    "gemma3": [
        (
            "(first_user_prefix if loop.first else \"\") }}\n",
            "(first_user_prefix if loop.first else \"\") }}\n    {%- set body -%}\n",
            "the turn's text after '<start_of_turn>ROLE\\n' is captured",
        ),
        (
            "{{ '<end_of_turn>\n' }}\n{%- endfor -%}",
            "{{ '<end_of_turn>' }}\n    {%- endset -%}\n"
            "    {%- if role == 'model' -%}{%- generation -%}{{ body }}{%- endgeneration -%}\n"
            "    {%- else -%}{{ body }}{%- endif -%}\n"
            "    {{ '\n' }}\n{%- endfor -%}",
            "up to <end_of_turn>; a model turn's capture is written inside the block, the "
            "newline glue after it",
        ),
    ],
    "deepseek_v3": [
        (
            f"{{{{'{DS_ASSISTANT}' + message['content'] + '{DS_EOS}'}}}}",
            f"{{{{'{DS_ASSISTANT}'}}}}{{% generation %}}"
            f"{{{{message['content'] + '{DS_EOS}'}}}}{{% endgeneration %}}",
            "a reply after a user turn: the block opens after <|Assistant|>",
        ),
        (
            f"{{{{'{DS_TOOL_OUTPUTS_END}' + message['content'] + '{DS_EOS}'}}}}",
            f"{{{{'{DS_TOOL_OUTPUTS_END}'}}}}{{% generation %}}"
            f"{{{{message['content'] + '{DS_EOS}'}}}}{{% endgeneration %}}",
            "a reply after tool outputs: the generation prompt there ends with "
            "<|tool_outputs_end|>, so the block opens after it",
        ),
        # The branch for ``content is none`` (tool calls) is left unmarked: canonical messages
        # always have string content, so it is never taken (the tests assert it).
    ],
    "gptoss": [
        (
            "{%- if \"tool_calls\" in message %}\n            {#- We need",
            "{%- set body %}\n        {%- if \"tool_calls\" in message %}\n            {#- We need",
            "an assistant message's whole text is captured: a tool call's kept preamble, or the "
            "last reply's analysis message, is a message of its own before it",
        ),
        (
            "{%- endif %}\n    {%- elif message.role == 'tool' -%}",
            "{%- endif %}\n        {%- endset %}\n"
            f"        {{{{- body[:{len(HARMONY_HEADER)}] }}}}"
            f"{{%- generation %}}{{{{- body[{len(HARMONY_HEADER)}:] }}}}{{%- endgeneration %}}\n"
            "    {%- elif message.role == 'tool' -%}",
            "its first <|start|>assistant (the generation prompt) is written before the block, "
            "all the rest inside: the model writes the later headers, channels and end tokens",
        ),
    ],
}


# The field under which a family's stock template reads a reply's reasoning, where it reads one.
REASONING_FIELD = {"qwen3": "reasoning_content", "gptoss": "thinking"}


def with_reasoning_as(message: dict, field: str) -> dict:
    """A canonical message with its ``reasoning_content`` under the name ``field``."""
    if "reasoning_content" not in message or field == "reasoning_content":
        return message
    message = dict(message)
    message[field] = message.pop("reasoning_content")
    return message


class _TemplateDay(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        from transforms.instruction.rendering.sandbox import TEMPLATE_DATE

        return TEMPLATE_DATE


@contextlib.contextmanager
def template_day() -> Iterator[None]:
    """transformers' ``strftime_now`` (harmony prints the date) gives the fixed day ours
    renders with."""
    from transformers.utils import chat_template_utils

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(chat_template_utils, "datetime", _TemplateDay)
        yield


def patch(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must occur exactly once."""
    count = text.count(old)
    assert count == 1, f"{old!r} occurs {count} times in the stock template, not once"
    return text.replace(old, new)


def marked(family: str, stock: str) -> str:
    """The marked copy of ``family``'s stock template ``stock``."""
    assert not GENERATION_TAG.search(stock), "the stock template already carries markers"
    for old, new, _why in PATCHES[family]:
        stock = patch(stock, old, new)
    return stock


def stock_template(tok) -> str:
    """The tokenizer's own (default) chat template."""
    return tok.get_chat_template()
