"""The instruction branch: records to packed SFT sequences with assistant-only loss.

Each chunk is adapted to canonical conversations, rendered with the chat template and masked
(one batched tokenizer call), held to ``seq_len``, and packed best-fit-decreasing within the
chunk; the under-filled packs of all chunks are packed again together in a few ordered groups.
Packed rows depend only on the input.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from transforms import records as R
from transforms.adapters import AdaptError, Conversation, to_conversation
from transforms.chat_template import EncodedExample, MaskOptions, RenderError, encode_conversations
from transforms.option_types import boolean, non_negative_int, positive_int
from transforms.packing import build_packed_rows, pack_best_fit_decreasing
from transforms.records import Record, RecordChunk, Rejection
from transforms.steps import PARTS, STATS, TAILS, ChunkStep, GatherTails, Part, apply_step
from transforms.tokenizer import load_tokenizer

SFT = "sft"
GROUP = "instruction branch"
FULL_PACK = 0.99  # packs filled at least this much are final; the rest are packed again


@dataclasses.dataclass(frozen=True)
class ConversationChunk:
    chunk_id: str
    records: tuple[Record, ...]
    conversations: tuple[Conversation, ...]


@dataclasses.dataclass(frozen=True)
class EncodedChunk:
    chunk_id: str
    examples: tuple[EncodedExample, ...]


class InstructionOptions(PipelineOptions):
    """Options of the instruction branch."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(GROUP)
        group.add_argument(
            "--seq_len", type=positive_int, default=2048,
            help="Maximum tokens per packed SFT sequence (default 2048).")
        group.add_argument(
            "--chat_template", default=None,
            help="Path (local or gs://) to a Jinja chat template that overrides the tokenizer's.")
        group.add_argument(
            "--system_prompt", default=None,
            help="System message added to conversations that have none.")
        group.add_argument(
            "--assistant_turns", choices=("all", "last"), default="all",
            help="Which assistant turns carry loss: all of them (default) or only the last.")
        group.add_argument(
            "--train_end_of_turn", type=boolean, default=True,
            help="Whether the end-of-turn token after each trained assistant turn carries loss "
            "(default true).")
        group.add_argument(
            "--max_segments_per_pack", type=non_negative_int, default=0,
            help="Cap on examples per packed sequence; 0 means no cap (default).")


@dataclasses.dataclass(frozen=True)
class InstructionConfig:
    seq_len: int
    chat_template: str | None
    system_prompt: str | None
    assistant_turns: str
    train_end_of_turn: bool
    max_segments_per_pack: int

    @classmethod
    def from_options(cls, options: PipelineOptions) -> InstructionConfig:
        view = options.view_as(InstructionOptions)
        return cls(seq_len=view.seq_len, chat_template=view.chat_template,
                   system_prompt=view.system_prompt, assistant_turns=view.assistant_turns,
                   train_end_of_turn=view.train_end_of_turn,
                   max_segments_per_pack=view.max_segments_per_pack)

    @property
    def mask_options(self) -> MaskOptions:
        return MaskOptions(last_turn_only=self.assistant_turns == "last",
                           train_end_of_turn=self.train_end_of_turn)


class AdaptConversations(ChunkStep):
    """Turns every instruction format into the canonical ``messages`` form."""

    step_name = "adapt"

    def run(self, chunk: RecordChunk) -> Iterator[ConversationChunk]:
        kept, conversations = [], []
        for record in chunk.records:
            try:
                conversations.append(to_conversation(record.value, record.format))
            except AdaptError as error:
                self.drop(Rejection.of(record, error.reason, str(error)))
                continue
            kept.append(record)
        if kept:
            yield ConversationChunk(chunk.chunk_id, tuple(kept), tuple(conversations))


class EncodeConversations(ChunkStep):
    """Renders with the chat template, masks the loss to assistant tokens, enforces seq_len."""

    step_name = "encode"

    def __init__(self, tokenizer: str, chat_template: str | None, options: MaskOptions,
                 system_prompt: str | None, seq_len: int):
        self.tokenizer_spec = tokenizer
        self.chat_template = chat_template
        self.options = options
        self.system_prompt = system_prompt
        self.seq_len = seq_len

    def setup(self) -> None:
        self.tokenizer = load_tokenizer(self.tokenizer_spec, self.chat_template)

    def run(self, chunk: ConversationChunk) -> Iterator[EncodedChunk]:
        results = encode_conversations(self.tokenizer, chunk.conversations, self.options,
                                       self.system_prompt)
        kept = []
        for record, result in zip(chunk.records, results, strict=True):
            if isinstance(result, RenderError):
                self.drop(Rejection.of(record, result.reason, result.message))
            elif len(result.input_ids) > self.seq_len:
                self.drop(Rejection.of(record, R.TOO_LONG,
                                       f"{len(result.input_ids)} tokens > seq_len {self.seq_len}"),
                          kind="filtered")
            else:
                kept.append(result)
        self.count("instruction.examples", len(kept))
        self.count("instruction.tokens", sum(len(e.input_ids) for e in kept))
        self.count("instruction.trained_tokens", sum(int(np.count_nonzero(e.labels != -100))
                                                     for e in kept))
        if kept:
            yield EncodedChunk(chunk.chunk_id, tuple(kept))


class PackSequences(ChunkStep):
    """Packs a chunk's examples best-fit-decreasing into rows of at most ``seq_len`` tokens.

    Packs filled below ``FULL_PACK`` (the last few that best-fit-decreasing opens) go on as the
    chunk's tail and are packed again with other chunks' tails, unless ``final``.
    """

    step_name = "pack"

    def __init__(self, seq_len: int, max_segments: int | None, final: bool = False):
        self.seq_len = seq_len
        self.max_segments = max_segments
        self.final = final

    def run(self, chunk: EncodedChunk) -> Iterator[beam.pvalue.TaggedOutput]:
        examples = chunk.examples
        lengths = np.array([len(e.input_ids) for e in examples], dtype=np.int64)
        bins = pack_best_fit_decreasing(lengths, self.seq_len, self.max_segments)
        full = [b for b in bins if self.final or self._is_full(b, lengths)]
        if full:
            table = build_packed_rows([e.input_ids for e in examples],
                                      [e.labels for e in examples], full)
            self.count("instruction.packs", table.num_rows)
            yield beam.pvalue.TaggedOutput(PARTS, Part(SFT, chunk.chunk_id, self.step_name, table))
        if len(full) < len(bins):
            leftover = np.sort(np.concatenate([b for b in bins if not self._is_full(b, lengths)]))
            yield beam.pvalue.TaggedOutput(
                TAILS, (chunk.chunk_id, tuple(examples[i] for i in leftover)))

    def _is_full(self, members: np.ndarray, lengths: np.ndarray) -> bool:
        return (lengths[members].sum() >= FULL_PACK * self.seq_len
                or len(members) == self.max_segments)


class InstructionBranch(beam.PTransform):
    """Instruction chunks in; packed SFT parts, dropped-record parts and stats out."""

    def __init__(self, tokenizer: str, config: InstructionConfig, tail_buckets: int):
        super().__init__()
        self.encode = EncodeConversations(tokenizer, config.chat_template, config.mask_options,
                                          config.system_prompt, config.seq_len)
        self.seq_len = config.seq_len
        self.max_segments = config.max_segments_per_pack or None
        self.tail_buckets = tail_buckets

    def expand(self, chunks):
        adapted = apply_step(chunks, "Adapt", AdaptConversations())
        encoded = apply_step(adapted.main, "RenderAndMask", self.encode)
        packed = apply_step(encoded.main, "Pack", PackSequences(self.seq_len, self.max_segments),
                            TAILS)
        tails = (packed[TAILS]
                 | "GatherTails" >> GatherTails(self.tail_buckets)
                 | "JoinTails" >> beam.Map(lambda group: EncodedChunk(
                     group.chunk_id, tuple(itertools.chain.from_iterable(group.items)))))
        repacked = apply_step(tails, "PackTails",
                              PackSequences(self.seq_len, self.max_segments, final=True))
        steps = (adapted, encoded, packed, repacked)
        parts = tuple(s[PARTS] for s in steps) | "InstructionParts" >> beam.Flatten()
        stats = tuple(s[STATS] for s in steps) | "InstructionStats" >> beam.Flatten()
        return parts, stats
