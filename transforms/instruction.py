"""The instruction branch: records to packed SFT sequences with assistant-only loss.

Each chunk is adapted to canonical conversations, rendered with the chat template and masked
(one batched tokenizer call), held to ``seq_len``, and packed best-fit-decreasing within the
chunk; the under-filled packs of all chunks are packed again together in a few ordered groups.
Packed rows depend only on the input.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from transforms import records as R
from transforms.adapters import AdaptError, Conversation, to_conversation
from transforms.chat_template import EncodedExample, MaskOptions, RenderError, encode_conversations
from transforms.packing import build_packed_rows, pack_best_fit_decreasing
from transforms.records import Record, RecordChunk, Rejection
from transforms.steps import PARTS, STATS, TAILS, ChunkStep, GatherTails, Part, apply_step
from transforms.tokenizer import load_tokenizer

SFT = "sft"
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

    def __init__(self, tokenizer: str, chat_template: str | None, options: MaskOptions,
                 system_prompt: str | None, seq_len: int, max_segments: int | None,
                 tail_buckets: int):
        super().__init__()
        self.encode = EncodeConversations(tokenizer, chat_template, options, system_prompt,
                                          seq_len)
        self.seq_len = seq_len
        self.max_segments = max_segments
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
