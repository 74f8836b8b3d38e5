"""The whole pipeline with each real tokenizer of ``../shared/tokenizers`` as ``--tokenizer``.

One in-memory run per tokenizer over the bundled chat, tool-call and reasoning samples. Every
packed segment must be one conversation exactly as transformers encodes it with a marked copy
of the same stock template (``tests/support/marked_templates.py``): its ids, and its labels
where the mask says trained (the first token of a segment is never trained, so no segment
predicts the start of the next). The manifest counts each conversation under its mask method.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from beam_pipeline.running import run
from tests.conftest import EXAMPLES, require_shared_data
from tests.support.marked_templates import (
    REAL_FAMILIES,
    REASONING_FIELD,
    TOKENIZERS,
    marked,
    stock_template,
    template_day,
    with_reasoning_as,
)
from transforms.core.fields import apply_field_map
from transforms.core.vocabulary import (
    Drop,
)
from transforms.instruction.adapters import to_conversation
from transforms.instruction.rendering.renderer import inline_reasoning

require_shared_data()

if not TOKENIZERS.is_dir():
    pytest.skip(f"the real tokenizers are in {TOKENIZERS}, which is absent",
                allow_module_level=True)

REASONING = "gsm8k_reasoning_sample.jsonl"
MAPPING = {"prompt": "question", "response": "answer"}
INPUTS = ("sharegpt_sample.json", "messages_sample.json", "toolcall_sample.json", REASONING)


def records() -> list[dict]:
    rows = []
    for name in INPUTS:
        text = (EXAMPLES / name).read_text(encoding="utf-8")
        if name == REASONING:
            rows += [apply_field_map(json.loads(line), MAPPING) for line in text.splitlines()]
        else:
            rows += json.loads(text)
    return rows


def oracle(tok, family: str, template: str) -> collections.Counter:
    """(ids, labels) of every conversation transformers can render with the marked template,
    reasoning written inline where the template has no place for it, as the pipeline does."""
    found = collections.Counter()
    for row in records():
        try:
            conversation = to_conversation(row)
        except Drop:
            continue
        messages = list(conversation.messages)
        field = REASONING_FIELD.get(family)
        if field is None:  # the pipeline writes reasoning inline there
            messages = [inline_reasoning(m) if "reasoning_content" in m else m for m in messages]
        else:
            messages = [with_reasoning_as(m, field) for m in messages]
        tools = list(conversation.tools) if conversation.tools else None
        try:
            text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
            names = [t["function"]["name"] for t in tools or ()]
            names += [c["function"]["name"] for m in messages for c in m.get("tool_calls", ())]
            if any(name not in text for name in names):
                continue  # a template without tool support: rejected as tools_not_rendered
            encoded = tok.apply_chat_template(messages, tools=tools, chat_template=template,
                                              tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
        except Exception:
            continue  # the template cannot render it: template_error
        ids = np.asarray(encoded["input_ids"], dtype=np.int32)
        labels = np.where(np.asarray(encoded["assistant_masks"], dtype=bool), ids, -100)
        labels[0] = -100
        found[(ids.tobytes(), labels.astype(np.int32).tobytes())] += 1
    return found


def segments(output) -> collections.Counter:
    found = collections.Counter()
    for path in sorted((output / "sft").glob("*.parquet")):
        table = pq.read_table(path).to_pydict()
        for ids, labels, lengths in zip(table["input_ids"], table["labels"], table["seq_lengths"],
                                        strict=True):
            start = 0
            for length in lengths:
                piece = slice(start, start + length)
                found[(np.asarray(ids[piece], np.int32).tobytes(),
                       np.asarray(labels[piece], np.int32).tobytes())] += 1
                start += length
    return found


@pytest.fixture(scope="module", params=REAL_FAMILIES)
def family_run(request, tmp_path_factory):
    family = request.param
    output = tmp_path_factory.mktemp(family)
    inputs = [f"--input={EXAMPLES / name}" for name in INPUTS[:-1]]
    inputs.append(f"--input={EXAMPLES / REASONING}#branch=instruction;prompt=question;"
                  "response=answer")
    run([*inputs, f"--output={output}", f"--tokenizer={TOKENIZERS / family}", "--seq_len=8192",
         "--pii=off",  # the oracle renders the records as written
         "--direct_running_mode=in_memory", "--max_reject_fraction=1"])
    return family, output, json.loads((output / "manifest.json").read_text())


def test_every_packed_segment_is_the_marked_template_oracle(family_run):
    family, output, manifest = family_run
    tok = AutoTokenizer.from_pretrained(TOKENIZERS / family)
    with template_day():
        expected = oracle(tok, family, marked(family, stock_template(tok)))
    found = segments(output)
    assert found == expected
    assert sum(found.values()) == manifest["instruction"]["examples"] > 250


def test_the_manifest_says_where_reasoning_went(family_run):
    """The GSM8K input holds reasoning: under the template's own field, else inline."""
    family, _, manifest = family_run
    field = REASONING_FIELD.get(family)
    placement = f"field:{field}" if field else "inline"
    (counted,) = manifest["instruction"]["reasoning_placement"].items()
    assert counted[0] == placement and counted[1] > 40


def test_the_manifest_counts_each_mask_method(family_run):
    family, _, manifest = family_run
    methods = manifest["instruction"]["mask_methods"]
    rejected = manifest["records"]["rejected"]
    assert sum(methods.values()) == manifest["instruction"]["examples"]
    assert "turn_not_located" not in rejected and manifest["records"]["balanced"]
    if family == "qwen3":  # multi-turn conversations are read off the full rendering
        assert methods["full_render"] > 50 and methods["prefix"] > 200
    elif family == "gptoss":  # and placed by sentinels where harmony rewrites history
        assert methods["sentinels"] > 50 and methods["prefix"] > 200
    else:
        assert methods["prefix"] == manifest["instruction"]["examples"]
