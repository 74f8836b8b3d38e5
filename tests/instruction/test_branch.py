"""InstructionBranch on its own: record chunks in, packed SFT rows and rejected records out.

Each packed segment is one conversation exactly as ``encode_conversations`` encodes it (the first
token of a segment untrained), a record with no assistant turn is rejected with its reason, and
every example lands in a pack once.
"""

import collections

import apache_beam as beam
import numpy as np
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.core.records import Record, RecordChunk
from transforms.core.steps import TailPlan
from transforms.core.tokenizer import DEFAULT_TOKENIZER, load_tokenizer
from transforms.core.vocabulary import IGNORE_INDEX, NO_ASSISTANT_TURN, REJECTED
from transforms.instruction.adapters import to_conversation
from transforms.instruction.branch import SFT, InstructionBranch, trained_counts
from transforms.instruction.chat_template import encode_conversations
from transforms.instruction.options import InstructionConfig
from transforms.instruction.rendering.values import EncodedExample, MaskOptions

SEQ_LEN = 256
VALUES = [
    *({"prompt": f"What is {k} + {k}?", "response": f"It is {2 * k}."} for k in range(30)),
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]},
    {"messages": [{"role": "user", "content": "Nobody answers."}]},
]


def expected_segments() -> collections.Counter:
    tok = load_tokenizer(DEFAULT_TOKENIZER)
    examples = encode_conversations(tok, [to_conversation(v) for v in VALUES[:-1]], MaskOptions())
    segments = collections.Counter()
    for example in examples:
        labels = example.labels.tolist()
        labels[0] = IGNORE_INDEX
        segments[(tuple(example.input_ids.tolist()), tuple(labels))] += 1
    return segments


def segments_of(table) -> list[tuple[tuple, tuple]]:
    found = []
    for ids, labels, lengths in zip(table.column("input_ids").to_pylist(),
                                    table.column("labels").to_pylist(),
                                    table.column("seq_lengths").to_pylist(), strict=True):
        start = 0
        for length in lengths:
            found.append((tuple(ids[start:start + length]), tuple(labels[start:start + length])))
            start += length
    return found


def test_conversations_become_packed_segments_and_the_unanswered_one_is_rejected(tmp_path):
    chunk = RecordChunk("0000-0000", tuple(
        Record(source="s", position=k, input_index=0, value=value,
               format="messages" if "messages" in value else "prompt_response")
        for k, value in enumerate(VALUES)))
    config = InstructionConfig(seq_len=SEQ_LEN, chat_template=None, system_prompt="template",
                               assistant_turns="all", train_end_of_turn=True,
                               max_segments_per_pack=0)
    branch = InstructionBranch(DEFAULT_TOKENIZER, config, TailPlan(1, str(tmp_path / "tails")))
    with test_pipeline.TestPipeline() as p:
        parts, _ = p | beam.Create([chunk]) | branch
        tables = parts | beam.Flatten()
        found = (tables | beam.Filter(lambda part: part.kind == SFT)
                 | beam.FlatMap(lambda part: segments_of(part.table)))
        assert_that(found, equal_to(list(expected_segments().elements())), label="segments")
        rejected = (tables | "Rejected" >> beam.Filter(lambda part: part.kind == REJECTED)
                    | beam.FlatMap(lambda part: part.table.column("reason").to_pylist()))
        assert_that(rejected, equal_to([NO_ASSISTANT_TURN]), label="rejected")


def test_trained_counts_are_each_examples_labels_other_than_ignore_index():
    tok = load_tokenizer(DEFAULT_TOKENIZER)
    conversations = [to_conversation(value) for value in VALUES[:-1]]
    examples = encode_conversations(tok, conversations, MaskOptions())
    silent = EncodedExample(examples[0].input_ids, np.full(len(examples[0].labels), IGNORE_INDEX))
    examples = [*examples, silent]
    assert trained_counts(examples).tolist() == [
        int(np.count_nonzero(e.labels != IGNORE_INDEX)) for e in examples]
    assert trained_counts(examples)[-1] == 0 and min(trained_counts(examples)[:-1]) > 0
    assert trained_counts([]).tolist() == []
