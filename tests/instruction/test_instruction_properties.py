"""Property test of the instruction path: it never crashes on arbitrary JSON, only rejects it.

Any JSON object, however odd, is classified, validated against its schema, adapted, checked and
rendered with a reason code for every failure; a record that survives gets a mask that trains only
on tokens of its assistant turns.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms.classify import classify
from transforms.core.records import InputSpec, Record, Rejection
from transforms.core.vocabulary import INSTRUCTION, Drop
from transforms.instruction.adapters import to_conversation
from transforms.instruction.chat_template import encode_conversations
from transforms.instruction.rendering.values import EncodedExample, MaskOptions
from transforms.instruction.schema import (
    ConversationLimits,
    builtin_schema,
    check_conversation,
)

KEYS = ["messages", "conversations", "role", "content", "from", "value", "prompt", "response",
        "completion", "instruction", "input", "output", "system", "tools", "tool_calls",
        "function", "name", "arguments", "chosen", "text", "x"]
ROLES = ["user", "assistant", "system", "tool", "human", "gpt", "function_call", "observation"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
                    st.sampled_from(ROLES), st.text(max_size=12))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25)
records = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5)
SPEC = InputSpec(index=0, pattern="p")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=records)
def test_arbitrary_json_is_routed_or_rejected_with_a_reason_never_raised(value, qwen_tokenizer):
    routed = classify(Record("s", 0, 0, value=value), SPEC)
    if isinstance(routed, Rejection):
        assert routed.reason
        return
    branch, record = routed
    if branch != INSTRUCTION:
        assert isinstance(record.value, str)
        return
    try:
        builtin_schema(record.format).check(record.value)
        conversation = to_conversation(record.value, record.format)
        check_conversation(conversation, ConversationLimits())
    except Drop as error:
        assert error.reason
        return
    [result] = encode_conversations(qwen_tokenizer, [conversation], MaskOptions())
    if isinstance(result, Drop):
        assert result.reason
        return
    assert isinstance(result, EncodedExample)
    trained = result.labels != -100
    assert trained.any()
    assert (result.labels[trained] == result.input_ids[trained]).all()
    # Trained tokens form one run per assistant reply at most, each ending its turn.
    edges = np.flatnonzero(np.diff(np.concatenate([[0], trained.astype(int), [0]])))
    runs = list(zip(edges[::2], edges[1::2], strict=True))
    replies = sum(m["role"] == "assistant" for m in conversation.messages)
    assert 1 <= len(runs) <= replies
    for start, end in runs:
        assert qwen_tokenizer.decode(result.input_ids[start:end].tolist()).endswith("<|im_end|>")
