"""The instruction branch: records to packed SFT sequences with assistant-only loss.

Each chunk is checked against its format's schema (the record as the user stores it), adapted
to canonical conversations and held to the conversation rules, rendered with the chat template
and masked (one batched tokenizer call), held to ``seq_len`` by the overflow policy, and packed
best-fit-decreasing within the chunk; the under-filled packs of all chunks are packed again
together in a few ordered groups. Packed rows depend only on the input.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from transforms import records as R
from transforms.adapters import FORMATS, AdaptError, Conversation, to_conversation
from transforms.chat_template import (
    OVERFLOW_POLICIES,
    EncodedExample,
    MaskOptions,
    RenderError,
    start_encoding,
)
from transforms.chunks import Chunk
from transforms.curation import BranchCuration
from transforms.decontam import Decontaminate
from transforms.mixing import MixSources
from transforms.option_types import boolean, non_negative_int, positive_int
from transforms.packing import IGNORE_INDEX, build_packed_rows, pack_best_fit_decreasing
from transforms.records import INSTRUCTION, Origin, Record, RecordChunk, Rejection
from transforms.schema import (
    ConversationLimits,
    Invalid,
    RecordSchema,
    check_conversation,
    load_schemas,
)
from transforms.splits import SplitOff, content_digest
from transforms.steps import (
    PARTS,
    STATS,
    TAILS,
    ChunkStep,
    GatherTails,
    OverlappedStep,
    Part,
    Started,
    TailPlan,
    apply_step,
    output_kind,
)
from transforms.tokenizer import end_of_text_id, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SFT = "sft"
UNSELECTED = "instruction.examples_unselected"  # left out by mixing: not kept after all
GROUP = "instruction branch"
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
    origins: tuple[Origin, ...] = ()  # per example, for mixing's accounting

    def record_tokens(self) -> np.ndarray:
        return np.fromiter((len(e.input_ids) for e in self.examples), np.int64,
                           len(self.examples))

    def record_digests(self, salt: str) -> np.ndarray:
        return np.array([content_digest(e.input_ids.tobytes() + e.labels.tobytes(), salt)
                         for e in self.examples], dtype=np.uint64)

    def take(self, indices: Sequence[int]) -> EncodedChunk:
        return EncodedChunk(self.chunk_id, tuple(self.examples[i] for i in indices),
                            tuple(self.origins[i] for i in indices))

    def counts(self) -> dict[str, int]:
        return {"instruction.examples": len(self.examples),
                "instruction.tokens": sum(len(e.input_ids) for e in self.examples),
                "instruction.trained_tokens": sum(int(np.count_nonzero(e.labels != IGNORE_INDEX))
                                                  for e in self.examples)}


def conversation_texts(chunk: ConversationChunk) -> list[str]:
    """What decontamination compares: every message's text content."""
    return ["\n".join(m["content"] for m in c.messages if isinstance(m.get("content"), str))
            for c in chunk.conversations]




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
            help="A Jinja chat template that overrides the tokenizer's: a path (local or gs://) or "
            "a built-in name (chatml, deepseekv3, gemma3, llama3, mistral, qwen3).")
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
            "--train_reasoning", type=boolean, default=True,
            help="Whether the reasoning a reply carries (reasoning_content, a <think> block, or "
            "#reasoning=FIELD), where the chat template renders it, carries loss (default true).")
        group.add_argument(
            "--max_segments_per_pack", type=non_negative_int, default=0,
            help="Cap on examples per packed sequence; 0 means no cap (default).")
        group.add_argument(
            "--schema", action="append", default=None, metavar="FORMAT=PATH",
            help="A tensorflow-metadata Schema (.pbtxt, local or gs://) that replaces the "
            f"built-in one of an instruction format ({', '.join(FORMATS)}); repeat the option "
            "or give a comma-separated list.")
        group.add_argument(
            "--max_turns", type=non_negative_int, default=0,
            help="Reject conversations with more messages than this (too_many_turns); 0 means "
            "no limit (default).")
        group.add_argument(
            "--max_chars", type=non_negative_int, default=0,
            help="Reject conversations with more characters of message content than this "
            "(too_many_chars); 0 means no limit (default).")
        group.add_argument(
            "--overflow", choices=OVERFLOW_POLICIES, default="truncate",
            help="Conversations longer than --seq_len: truncate them to the earliest turns that "
            "fit, ending with a complete assistant turn (default), or drop them; either way one "
            "with nothing left to train is filtered as too_long.")
        group.add_argument(
            "--pad_to_seq_len", type=boolean, default=False,
            help="Pad every packed sequence to exactly --seq_len tokens for trainers that need "
            "fixed shapes: the pad run is one more segment of pad tokens with no loss "
            "(default false: no padding).")


def parse_schema_options(values: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``FORMAT=PATH`` values (repeated or comma-separated) as sorted ``(format, path)`` pairs."""
    pairs: dict[str, str] = {}
    for item in (part.strip() for value in values or () for part in value.split(",")):
        if not item:
            continue
        fmt, sep, path = item.partition("=")
        if not sep or not path:
            raise ValueError(f"--schema {item!r}: expected FORMAT=PATH, e.g. alpaca=my.pbtxt")
        if fmt in pairs:
            raise ValueError(f"--schema gives format {fmt!r} twice")
        pairs[fmt] = path
    return tuple(sorted(pairs.items()))


@dataclasses.dataclass(frozen=True)
class InstructionConfig:
    seq_len: int
    chat_template: str | None
    system_prompt: str | None
    assistant_turns: str
    train_end_of_turn: bool
    max_segments_per_pack: int
    train_reasoning: bool = True
    schemas: tuple[tuple[str, str], ...] = ()  # (format, path) of user schemas
    max_turns: int = 0
    max_chars: int = 0
    overflow: str = "truncate"
    pad_to_seq_len: bool = False

    @classmethod
    def from_options(cls, options: PipelineOptions) -> InstructionConfig:
        """Reads the options; a bad or unreadable ``--schema`` is a ValueError here, early."""
        view = options.view_as(InstructionOptions)
        config = cls(seq_len=view.seq_len, chat_template=view.chat_template,
                     system_prompt=view.system_prompt, assistant_turns=view.assistant_turns,
                     train_end_of_turn=view.train_end_of_turn,
                     train_reasoning=view.train_reasoning,
                     max_segments_per_pack=view.max_segments_per_pack,
                     schemas=parse_schema_options(view.schema), max_turns=view.max_turns,
                     max_chars=view.max_chars, overflow=view.overflow,
                     pad_to_seq_len=view.pad_to_seq_len)
        config.load_schemas()
        return config

    def load_schemas(self) -> dict[str, RecordSchema]:
        return load_schemas(dict(self.schemas))

    @property
    def mask_options(self) -> MaskOptions:
        return MaskOptions(last_turn_only=self.assistant_turns == "last",
                           train_end_of_turn=self.train_end_of_turn,
                           train_reasoning=self.train_reasoning)

    @property
    def limits(self) -> ConversationLimits:
        return ConversationLimits(max_turns=self.max_turns, max_chars=self.max_chars)


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
            except Invalid as error:
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
            except (AdaptError, Invalid) as error:
                self.drop(Rejection.of(record, error.reason, error.message))
                continue
            kept.append(record)
            conversations.append(conversation)
        if kept:
            yield ConversationChunk(chunk.chunk_id, tuple(kept), tuple(conversations))


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

    def start(self, chunk: ConversationChunk) -> Callable[[], list[EncodedExample | RenderError]]:
        config = self.config
        return start_encoding(self.tokenizer, chunk.conversations, config.mask_options,
                              config.system_prompt, config.seq_len, config.overflow)

    def run(self, started: Started) -> Iterator[EncodedChunk]:
        chunk: ConversationChunk = started.chunk
        results = started.handle()
        kept, origins = [], []
        for record, result in zip(chunk.records, results, strict=True):
            if isinstance(result, RenderError):
                kind = "filtered" if result.reason == R.TOO_LONG else "rejected"
                self.drop(Rejection.of(record, result.reason, result.message), kind=kind)
                continue
            kept.append(result)
            origins.append(record.origin)
            self.count(f"instruction.mask_method.{result.mask_method}")
            if result.tokens_cut:
                self.count("instruction.truncated")
                self.count("instruction.truncated_tokens", result.tokens_cut)
        self.count("instruction.examples", len(kept))
        self.count("instruction.tokens", sum(len(e.input_ids) for e in kept))
        self.count("instruction.trained_tokens", sum(int(np.count_nonzero(e.labels != -100))
                                                     for e in kept))
        if kept:
            yield EncodedChunk(chunk.chunk_id, tuple(kept), tuple(origins))


class PackSequences(ChunkStep):
    """Packs a chunk's examples best-fit-decreasing into rows of at most ``seq_len`` tokens.

    Packs filled below ``FULL_PACK`` (the last few that best-fit-decreasing opens) go on as the
    chunk's tail and are packed again with other chunks' tails, unless ``final``. With a
    ``pad_id``, each row's free room becomes one more segment of pad tokens with no loss.
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
            table = self._rows(examples, lengths, full)
            self.count("instruction.packs", table.num_rows)
            self.count("instruction.packed_tokens", int(sum(lengths[b].sum() for b in full)))
            yield beam.pvalue.TaggedOutput(PARTS, Part(output_kind(SFT, chunk.chunk_id),
                                                       chunk.chunk_id, self.step_name, table))
        if len(full) < len(bins):
            leftover = np.sort(np.concatenate([b for b in bins if not self._is_full(b, lengths)]))
            yield beam.pvalue.TaggedOutput(
                TAILS, (chunk.chunk_id, tuple(examples[i] for i in leftover)))

    def _is_full(self, members: np.ndarray, lengths: np.ndarray) -> bool:
        return (lengths[members].sum() >= FULL_PACK * self.seq_len
                or len(members) == self.max_segments)

    def _rows(self, examples: Sequence[EncodedExample], lengths: np.ndarray,
              bins: list[np.ndarray]) -> pa.Table:
        ids = [e.input_ids for e in examples]
        labels = [e.labels for e in examples]
        if self.pad_id is not None:
            rooms = [self.seq_len - int(lengths[b].sum()) for b in bins]
            self.count("instruction.pad_tokens", sum(rooms))
            bins = [np.append(b, len(ids) + k) if room else b
                    for k, (b, room) in enumerate(zip(bins, rooms, strict=True))]
            ids += [np.full(room, self.pad_id, np.int32) for room in rooms]
            labels += [np.full(room, IGNORE_INDEX, np.int32) for room in rooms]
        return build_packed_rows(ids, labels, bins)


def pad_token_id(tok: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad token, else its end-of-text token (Qwen: ``<|endoftext|>``)."""
    return tok.pad_token_id if tok.pad_token_id is not None else end_of_text_id(tok)


class InstructionBranch(beam.PTransform):
    """Instruction chunks in; each step's parts (packed SFT rows, dropped records) and stats
    out. The parts stay apart so that each is staged where it is made (see build_graph)."""

    def __init__(self, tokenizer: str, config: InstructionConfig, tails: TailPlan,
                 curation: BranchCuration | None = None):
        super().__init__()
        self.curation = curation or BranchCuration()
        self.schemas = config.load_schemas()
        self.limits = config.limits
        self.encode = EncodeConversations(tokenizer, config)
        self.seq_len = config.seq_len
        self.max_segments = config.max_segments_per_pack or None
        self.pad_id = (pad_token_id(load_tokenizer(tokenizer, config.chat_template))
                       if config.pad_to_seq_len else None)
        self.tails = tails

    def expand(self, chunks):
        validated = apply_step(chunks, "Validate", ValidateRecords(self.schemas))
        adapted = apply_step(validated.main, "Adapt", AdaptConversations(self.limits))
        steps = [validated, adapted]
        curation = self.curation
        if curation.decontam is not None:
            steps.append(apply_step(
                steps[-1].main, "Decontaminate",
                Decontaminate(curation.decontam, INSTRUCTION, conversation_texts)))
        steps.append(apply_step(steps[-1].main, "RenderAndMask", self.encode))
        if curation.validation:
            steps.append(steps[-1].main | "SplitValidation" >> SplitOff(curation.validation,
                                                                        curation.seed))
        if curation.mix is not None:
            steps.append(steps[-1].main | "MixSources" >> MixSources(curation.mix, UNSELECTED))
        packed = apply_step(steps[-1].main, "Pack",
                            PackSequences(self.seq_len, self.max_segments, self.pad_id), TAILS)
        tails = (packed[TAILS]
                 | "GatherTails" >> GatherTails(self.tails)
                 | "JoinTails" >> beam.Map(lambda group: EncodedChunk(
                     group.chunk_id, tuple(itertools.chain.from_iterable(group.items)))))
        repacked = apply_step(tails, "PackTails",
                              PackSequences(self.seq_len, self.max_segments, self.pad_id,
                                            final=True))
        steps += (packed, repacked)
        parts = tuple(s[PARTS] for s in steps)
        stats = tuple(s[STATS] for s in steps) | "InstructionStats" >> beam.Flatten()
        return parts, stats
