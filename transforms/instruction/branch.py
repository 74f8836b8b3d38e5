"""The instruction branch: records to packed SFT sequences with assistant-only loss.

Each chunk is checked against its format's schema (the record as the user stores it), adapted
to canonical conversations and held to the conversation rules, rendered with the chat template
and masked (one batched tokenizer call), held to ``seq_len`` by the overflow policy, and packed
best-fit-decreasing within the chunk; the under-filled packs of all chunks are packed again
together in a few ordered groups. Packed rows depend only on the input.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from transforms.core import helpers
from transforms.core.chunks import Chunk
from transforms.core.fields import REASONING_CONTENT
from transforms.core.lengths import source_example_counts, source_length_counts
from transforms.core.packing import build_packed_rows, pack_best_fit_decreasing, pad_packs
from transforms.core.records import (
    Origin,
    Record,
    RecordChunk,
    Rejection,
)
from transforms.core.steps import (
    PARTS,
    TAILS,
    BranchOutput,
    ChunkStep,
    GatherTails,
    OverlappedStep,
    Part,
    Started,
    StepChain,
    TailGroup,
    TailPlan,
    apply_step,
    output_kind,
)
from transforms.core.tokenizer import load_tokenizer, pad_token_id
from transforms.core.vocabulary import (
    IGNORE_INDEX,
    INSTRUCTION,
    REASONS,
    Drop,
)
from transforms.curation.decontam import Decontaminate
from transforms.curation.mixing import MixSources
from transforms.curation.options import BranchCuration
from transforms.curation.pii import MessageRedactor, PiiConfig, count_found
from transforms.curation.scores import FilterByScore, InstructionText, ScoreRecords
from transforms.curation.splits import SplitOff, content_digest
from transforms.instruction.adapters import Conversation, to_conversation
from transforms.instruction.chat_template import reasoning_placements, start_encoding
from transforms.instruction.dedup import ConversationDedup, drop_duplicates, index_step
from transforms.instruction.options import InstructionConfig
from transforms.instruction.rendering.values import EncodedExample
from transforms.instruction.schema import (
    ConversationLimits,
    RecordSchema,
    check_conversation,
)
from transforms.knowledge.dedup.first_pass import SecondRead

SFT = "sft"
SFT_EXAMPLES = "sft_examples"  # --write_examples: the packed examples, one per row, unpacked
UNSELECTED = "instruction.examples_unselected"  # left out by mixing: not kept after all
FULL_PACK = 0.99  # packs filled at least this much are final; the rest are packed again


@dataclasses.dataclass(frozen=True)
class ConversationChunk(Chunk):
    chunk_id: str
    records: tuple[Record, ...]
    conversations: tuple[Conversation, ...]

    def take(self, indices: Sequence[int]) -> ConversationChunk:
        return ConversationChunk(self.chunk_id, tuple(self.records[i] for i in indices),
                                 tuple(self.conversations[i] for i in indices))


@dataclasses.dataclass(frozen=True)
class EncodedChunk(Chunk):
    chunk_id: str
    examples: tuple[EncodedExample, ...]
    origins: tuple[Origin, ...] = ()  # per example: mixing's accounting, packs' sources
    scores: tuple[tuple[tuple[str, float], ...], ...] = ()  # per example, with --quality_model

    def record_tokens(self) -> np.ndarray:
        return np.fromiter((len(e.input_ids) for e in self.examples), np.int64,
                           len(self.examples))

    def record_digests(self, salt: str) -> np.ndarray:
        return np.array([content_digest(e.input_ids.tobytes() + e.labels.tobytes(), salt)
                         for e in self.examples], dtype=np.uint64)

    def take(self, indices: Sequence[int]) -> EncodedChunk:
        return EncodedChunk(self.chunk_id, tuple(self.examples[i] for i in indices),
                            tuple(self.origins[i] for i in indices),
                            tuple(self.scores[i] for i in indices) if self.scores else ())

    def sources(self) -> np.ndarray:
        """Each example's input index: what the packed rows' ``sources`` say."""
        return np.fromiter((origin[2] for origin in self.origins), np.int32, len(self.origins))

    def counts(self) -> dict[str, int]:
        return {"instruction.examples": len(self.examples),
                "instruction.tokens": sum(len(e.input_ids) for e in self.examples),
                "instruction.trained_tokens": sum(int(np.count_nonzero(e.labels != IGNORE_INDEX))
                                                  for e in self.examples)}


def conversation_texts(chunk: ConversationChunk) -> list[str]:
    """What decontamination compares: every message's text content."""
    return ["\n".join(m["content"] for m in c.messages if isinstance(m.get("content"), str))
            for c in chunk.conversations]




class ValidateRecords(ChunkStep):
    """Checks every record, as the user stores it, against the schema of its format."""

    step_name = "validate"

    def __init__(self, schemas: dict[str, RecordSchema]):
        self.schemas = schemas

    def run(self, chunk: RecordChunk) -> Iterator[RecordChunk]:
        kept = []
        for record in chunk.records:
            try:
                self.schemas[record.format].check(record.value)
            except Drop as error:
                self.drop(Rejection.of(record, error.reason, error.message))
                continue
            kept.append(record)
        if kept:
            yield RecordChunk(chunk.chunk_id, tuple(kept))


class AdaptConversations(ChunkStep):
    """Turns every instruction format into the canonical ``messages`` form and holds it to the
    conversation rules (an assistant turn, role order, no empty reply, size limits)."""

    step_name = "adapt"

    def __init__(self, limits: ConversationLimits):
        self.limits = limits

    def run(self, chunk: RecordChunk) -> Iterator[ConversationChunk]:
        kept, conversations = [], []
        for record in chunk.records:
            try:
                conversation = to_conversation(record.value, record.format)
                check_conversation(conversation, self.limits)
            except Drop as error:
                self.drop(Rejection.of(record, error.reason, error.message))
                continue
            kept.append(record)
            conversations.append(conversation)
        if kept:
            yield ConversationChunk(chunk.chunk_id, tuple(kept), tuple(conversations))


class RedactConversations(OverlappedStep):
    """Replaces (or, with ``tag``, only counts) personal data and secrets in every message's
    text: content, reasoning and tool-call arguments, of every role. It runs on the canonical
    messages before the chat template renders them, so the template's markup is never
    touched; tool definitions are left as they are. A large chunk is searched in helper
    processes (``transforms.core.helpers``) while the steps before prepare the next chunk
    (``OverlappedStep``); the result is the same as in this process."""

    step_name = "pii"

    def __init__(self, config: PiiConfig):
        self.config = config

    def start(self, chunk: ConversationChunk) -> Callable[[], list]:
        batch = [conversation.messages for conversation in chunk.conversations]
        return helpers.start_split(MessageRedactor(self.config), batch,
                                   sum(map(len, conversation_texts(chunk))))

    def run(self, started: Started) -> Iterator[ConversationChunk]:
        chunk: ConversationChunk = started.chunk
        found: collections.Counter = collections.Counter()
        conversations = []
        for conversation, redacted in zip(chunk.conversations, started.handle(), strict=True):
            if redacted is None:
                conversations.append(conversation)
                continue
            messages, spans = redacted
            found.update(spans)
            found["examples"] += 1
            conversations.append(dataclasses.replace(conversation, messages=messages))
        for name, count in count_found(INSTRUCTION, found).items():
            self.count(name, count)
        yield ConversationChunk(chunk.chunk_id, chunk.records, tuple(conversations))


class EncodeConversations(OverlappedStep):
    """Renders with the chat template, masks the loss to assistant tokens, applies the overflow
    policy at ``seq_len``. A chunk's tokens are encoded in the background while the next chunk
    is rendered (``OverlappedStep``)."""

    step_name = "encode"

    def __init__(self, tokenizer: str, config: InstructionConfig):
        self.tokenizer_spec = tokenizer
        self.config = config

    def setup(self) -> None:
        # The process's shared tokenizer: encoding only reads it (no private copy needed).
        self.tokenizer = load_tokenizer(self.tokenizer_spec, self.config.chat_template)
        self.placement = reasoning_placements(self.tokenizer)

    def start(self, chunk: ConversationChunk) -> Callable[[], list[EncodedExample | Drop]]:
        config = self.config
        return start_encoding(self.tokenizer, chunk.conversations, config.mask_options,
                              config.system_prompt, config.seq_len, config.overflow)

    def run(self, started: Started) -> Iterator[EncodedChunk]:
        chunk: ConversationChunk = started.chunk
        results = started.handle()
        kept, origins, scores = [], [], []
        for record, conversation, result in zip(chunk.records, chunk.conversations, results,
                                                strict=True):
            if isinstance(result, Drop):
                kind = REASONS[result.reason].kind
                self.drop(Rejection.of(record, result.reason, result.message), kind=kind)
                continue
            kept.append(result)
            origins.append(record.origin)
            scores.append(record.scores)
            self.count(f"instruction.mask_method.{result.mask_method}")
            if any(REASONING_CONTENT in m for m in conversation.messages):
                placement = self.placement[bool(conversation.tools)]
                self.count(f"instruction.reasoning_placement.{placement}")
            if result.tokens_cut:
                self.count("instruction.truncated")
                self.count("instruction.truncated_tokens", result.tokens_cut)
        self.count("instruction.examples", len(kept))
        lengths = np.fromiter((len(e.input_ids) for e in kept), np.int64, len(kept))
        self.count("instruction.tokens", int(lengths.sum()))
        trained = trained_counts(kept)
        self.count("instruction.trained_tokens", int(trained.sum()))
        indices = [origin[2] for origin in origins]
        for name, count in source_length_counts(INSTRUCTION, lengths, indices).items():
            self.count(name, count)
        cut = np.fromiter((e.tokens_cut for e in kept), np.int64, len(kept))
        for name, count in source_example_counts(trained, cut, indices).items():
            self.count(name, count)
        if kept:
            yield EncodedChunk(chunk.chunk_id, tuple(kept), tuple(origins),
                               tuple(scores) if any(scores) else ())


def trained_counts(examples: Sequence[EncodedExample]) -> np.ndarray:
    """Each example's trained tokens (labels other than ``IGNORE_INDEX``), from one comparison
    over the chunk's labels instead of one per example."""
    sizes = np.fromiter((len(e.labels) for e in examples), np.int64, len(examples))
    if not examples:
        return sizes
    trained = np.concatenate([e.labels for e in examples]) != IGNORE_INDEX
    running = np.concatenate(([0], np.cumsum(trained, dtype=np.int64)))
    ends = np.cumsum(sizes)
    return running[ends] - running[ends - sizes]


class WriteExamples(ChunkStep):
    """Passes a chunk on and writes its examples unpacked (``input_ids``, ``labels``, and
    ``sources`` holding the one segment's input index, as in packed rows), the rows a loader
    packs anew each epoch: exactly the examples the next step packs. With ``--quality_model``,
    a ``scores`` struct holds each model's score of the example."""

    step_name = "write_examples"

    def __init__(self, score_names: tuple[str, ...] = ()):
        self.score_names = score_names

    def run(self, chunk: EncodedChunk) -> Iterator[EncodedChunk | beam.pvalue.TaggedOutput]:
        columns = {
            "input_ids": pa.array([e.input_ids for e in chunk.examples], pa.list_(pa.int32())),
            "labels": pa.array([e.labels for e in chunk.examples], pa.list_(pa.int32())),
            "sources": pa.array([[source] for source in chunk.sources().tolist()],
                                pa.list_(pa.int32())),
        }
        if self.score_names:
            columns["scores"] = pa.array(
                [dict(scores) for scores in chunk.scores],
                pa.struct([(name, pa.float32()) for name in self.score_names]))
        table = pa.table(columns)
        self.count("instruction.examples_written", table.num_rows)
        yield beam.pvalue.TaggedOutput(PARTS, Part(output_kind(SFT_EXAMPLES, chunk.chunk_id),
                                                   chunk.chunk_id, self.step_name, table))
        yield chunk


class PackSequences(ChunkStep):
    """Packs a chunk's examples best-fit-decreasing into rows of at most ``seq_len`` tokens.

    Packs filled below ``FULL_PACK`` (the last few that best-fit-decreasing opens) go on as the
    chunk's tail, origins and all, and are packed again with other chunks' tails, unless
    ``final``. With a ``pad_id``, each row's free room becomes one more segment of pad tokens
    with no loss and no source (``NO_SOURCE``).
    """

    step_name = "pack"

    def __init__(self, seq_len: int, max_segments: int | None, pad_id: int | None = None,
                 final: bool = False):
        self.seq_len = seq_len
        self.max_segments = max_segments
        self.pad_id = pad_id
        self.final = final

    def run(self, chunk: EncodedChunk) -> Iterator[beam.pvalue.TaggedOutput]:
        examples = chunk.examples
        lengths = np.array([len(e.input_ids) for e in examples], dtype=np.int64)
        bins = pack_best_fit_decreasing(lengths, self.seq_len, self.max_segments)
        full = [b for b in bins if self.final or self._is_full(b, lengths)]
        if full:
            table = self._rows(examples, chunk.sources(), lengths, full)
            self.count("instruction.packs", table.num_rows)
            self.count("instruction.packed_tokens", int(sum(lengths[b].sum() for b in full)))
            yield beam.pvalue.TaggedOutput(PARTS, Part(output_kind(SFT, chunk.chunk_id),
                                                       chunk.chunk_id, self.step_name, table))
        if len(full) < len(bins):
            leftover = np.sort(np.concatenate([b for b in bins if not self._is_full(b, lengths)]))
            yield beam.pvalue.TaggedOutput(TAILS, (chunk.chunk_id, chunk.take(leftover.tolist())))

    def _is_full(self, members: np.ndarray, lengths: np.ndarray) -> bool:
        return (lengths[members].sum() >= FULL_PACK * self.seq_len
                or len(members) == self.max_segments)

    def _rows(self, examples: Sequence[EncodedExample], sources: np.ndarray,
              lengths: np.ndarray, bins: list[np.ndarray]) -> pa.Table:
        ids = [e.input_ids for e in examples]
        labels = [e.labels for e in examples]
        if self.pad_id is not None:
            ids, labels, bins, sources, pad_tokens = pad_packs(
                ids, labels, bins, sources, lengths, self.seq_len, self.pad_id)
            self.count("instruction.pad_tokens", pad_tokens)
        return build_packed_rows(ids, labels, bins, sources)


def join_tails(group: TailGroup) -> EncodedChunk:
    """The leftover examples of a group's chunks, in chunk order, with their origins."""
    return EncodedChunk(
        group.chunk_id,
        tuple(itertools.chain.from_iterable(chunk.examples for chunk in group.items)),
        tuple(itertools.chain.from_iterable(chunk.origins for chunk in group.items)))


class InstructionBranch(beam.PTransform):
    """Instruction chunks in; each step's parts (packed SFT rows, dropped records) and stats
    out. The parts stay apart so that each is staged where it is made (see build_graph)."""

    def __init__(self, tokenizer: str, config: InstructionConfig, tails: TailPlan,
                 curation: BranchCuration | None = None, second_read: SecondRead | None = None,
                 dedup: ConversationDedup | None = None):
        super().__init__()
        self.second_read = second_read  # for deduplication's pass one
        self.dedup = (dedup if second_read is not None and dedup is not None
                      and dedup.config.active else None)
        self.config = config
        self.curation = curation or BranchCuration()
        self.schemas = config.load_schemas()
        self.limits = config.limits
        self.encode = EncodeConversations(tokenizer, config)
        self.seq_len = config.seq_len
        self.max_segments = config.max_segments_per_pack or None
        self.pad_id = (pad_token_id(load_tokenizer(tokenizer, config.chat_template))
                       if config.pad_to_seq_len else None)
        self.tails = tails
        self.write_examples = config.write_examples

    def expand(self, chunks: beam.PCollection) -> BranchOutput:
        curation = self.curation
        steps = StepChain(chunks)
        steps.then("Validate", ValidateRecords(self.schemas))
        steps.then("Adapt", AdaptConversations(self.limits))
        if curation.pii.active:
            steps.then("RedactPersonalData", RedactConversations(curation.pii))
        dedup = self.dedup
        if dedup is not None:
            drop_duplicates(steps, self.second_read, self.config, curation.pii, dedup)
        if curation.decontam is not None:
            steps.then("Decontaminate",
                       Decontaminate(curation.decontam, INSTRUCTION, conversation_texts))
        scores = curation.scores
        if scores.models:
            steps.map("ScoreConversations", ScoreRecords(
                scores.models, InstructionText(scores.instruction_text)))
            steps.then("FilterByScore", FilterByScore(INSTRUCTION, scores.thresholds))
        steps.then("RenderAndMask", self.encode)
        if curation.validation:
            steps.add(steps.main | "SplitValidation" >> SplitOff(curation.validation,
                                                                  curation.seed))
        if curation.mix is not None:
            steps.add(steps.main | "MixSources" >> MixSources(curation.mix, UNSELECTED))
        if dedup is not None and dedup.index:
            steps.then("IndexConversations", index_step(self.second_read))
        if self.write_examples:
            steps.then("WriteExamples", WriteExamples(curation.scores.names))
        packed = steps.then("Pack", PackSequences(self.seq_len, self.max_segments, self.pad_id),
                            TAILS)
        tails = (packed[TAILS]
                 | "GatherTails" >> GatherTails(self.tails)
                 | "JoinTails" >> beam.Map(join_tails))
        steps.add(apply_step(tails, "PackTails", PackSequences(
            self.seq_len, self.max_segments, self.pad_id, final=True)))
        return steps.output("InstructionStats")
