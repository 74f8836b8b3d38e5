"""Deduplication of conversations (``--instruction_dedup``): the same conversation from two
sources, or a prompt copied a thousand times with small edits, is trained once.

It is the knowledge branch's deduplication over a conversation's text: a first pass reads the
instruction inputs again, validates, adapts and redacts each record as the main pass does, and
keys its normalised text (``conversation_text``) with the same text hash, word shingles, MinHash
bands and threshold (``--dedup_ngram`` ... ``--dedup_threshold``); ``FindDuplicates`` resolves the
copies through the shuffle, and each chunk's decisions go to a file of its own in staging. The
main pass's ``DropDuplicateConversations`` reads its chunk's file. The copy with the smallest
(input, source, position) survives, reasons are ``duplicate_exact`` and ``duplicate_near``, and
with ``--dedup_against`` an earlier run's conversation always wins (``duplicate_earlier_run``).

What is normalised: each message becomes ``role: text`` on its own line, its text being its
string content (tool calls' and reasoning fields are left out: two answers that differ only in
how a tool was called are the same conversation to a reader); then Unicode NFKC, case folding and
runs of whitespace collapsed to one space. The system prompt is a message like the others.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.classify import classify
from transforms.core.records import InputSpec, Record, Rejection, ShardSpec
from transforms.core.steps import ChunkStep
from transforms.core.vocabulary import FILTERED, INSTRUCTION, KNOWLEDGE, Drop
from transforms.curation.pii import PiiConfig, redact_value
from transforms.instruction.adapters import Conversation, to_conversation
from transforms.instruction.options import InstructionConfig
from transforms.instruction.schema import check_conversation
from transforms.io.read_inputs import ReadInputs
from transforms.io.writers import BackgroundWriter
from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.dedup.decisions import (
    DROPS,
    ChunkDecisions,
    WriteDecisions,
    decisions_path,
)
from transforms.knowledge.dedup.first_pass import FindCopies, SecondRead
from transforms.knowledge.dedup.index import (
    IndexDocuments,
    keys_path,
    write_chunk_keys,
)
from transforms.knowledge.dedup.minhash import (
    MinHasher,
    chunk_number,
    document_keys,
    file_numbering,
    record_key,
)
from transforms.knowledge.quality import TextStats


@dataclasses.dataclass(frozen=True)
class ConversationDedup:
    """The branch's deduplication: its ``config`` (mode ``--instruction_dedup``, the rest the
    ``--dedup_*`` settings), the earlier runs' indexes, and whether to index the run's own."""

    config: DedupConfig = dataclasses.field(default_factory=lambda: DedupConfig("none"))
    against: tuple[str, ...] = ()
    index: bool = False


DECISIONS = "dedup-decisions-instruction"  # under the staging directory
KEYS = "dedup-keys-instruction"
_SPACE = re.compile(r"\s+")


def conversation_text(conversation: Conversation) -> str:
    """The normalised text deduplication keys (the module's docstring says what is kept)."""
    lines = [f"{m.get('role')}: {m['content']}" for m in conversation.messages
             if isinstance(m.get("content"), str)]
    text = unicodedata.normalize("NFKC", "\n".join(lines)).casefold()
    return _SPACE.sub(" ", text).strip()


def instruction_shards(shards: Sequence[ShardSpec], specs: Sequence[InputSpec]
                       ) -> list[ShardSpec]:
    """The shards that may hold conversations: those of inputs not declared
    ``branch=knowledge``."""
    knowledge_only = {spec.index for spec in specs if spec.branch == KNOWLEDGE}
    return [shard for shard in shards if shard.input_index not in knowledge_only]


def adapted(record: Record, config: InstructionConfig, schemas: dict, pii: PiiConfig
            ) -> Conversation | None:
    """The conversation the main pass makes of ``record`` before deduplication (validated,
    adapted, checked and redacted), or None where it would drop the record first."""
    try:
        schemas[record.format].check(record.value)
        conversation = to_conversation(record.value, record.format)
        check_conversation(conversation, config.limits)
    except Drop:
        return None
    if not pii.active:
        return conversation
    messages = tuple(redact_value(message, pii, collections.Counter())
                     for message in conversation.messages)
    return Conversation(messages, conversation.tools)


class KeyConversations(BackgroundWriter):
    """Pass one: the ``DocumentKeys`` of each conversation the main pass would reach
    deduplication with, a batch per chunk; with ``keys_dir``, also each chunk's keys in a file
    (``--write_dedup_index``)."""

    def __init__(self, specs: Sequence[InputSpec], config: InstructionConfig, pii: PiiConfig,
                 dedup: DedupConfig, files: Sequence[str], keys_dir: str | None):
        self.specs = {spec.index: spec for spec in specs}
        self.config = config
        self.pii = pii
        self.dedup = dedup
        self.file_numbers = {path: number for number, path in enumerate(files)}
        self.keys_dir = keys_dir

    def setup(self) -> None:
        super().setup()
        self.schemas = self.config.load_schemas()
        self.hasher = MinHasher(self.dedup.num_perm) if self.dedup.near else None

    def process(self, chunk: Any) -> Iterator[tuple]:
        number = chunk_number(chunk.chunk_id)
        keys = []
        for record in chunk.records:
            routed = classify(record, self.specs[record.input_index])
            if not isinstance(routed, tuple) or routed[0] != INSTRUCTION:
                continue
            conversation = adapted(routed[1], self.config, self.schemas, self.pii)
            if conversation is not None:
                keys.append(document_keys(record_key(record, self.file_numbers), number,
                                          TextStats(conversation_text(conversation)),
                                          self.dedup, self.hasher))
        if not keys:
            return
        if self.keys_dir is not None:
            self.write(write_chunk_keys, keys_path(self.keys_dir, chunk.chunk_id), keys)
        yield tuple(keys)


class FindDuplicateConversations(beam.PTransform):
    """Pass one for conversations: reads the instruction inputs again and writes each chunk's
    copies to drop to its file under ``decisions``; the files' paths out."""

    def __init__(self, shards: Sequence[ShardSpec], specs: Sequence[InputSpec],
                 chunk_records: int, max_record_bytes: int, config: InstructionConfig,
                 pii: PiiConfig, dedup: DedupConfig, decisions: str,
                 against: Sequence[str] = (), keys_dir: str | None = None):
        super().__init__()
        self.shards = instruction_shards(shards, specs)
        self.specs = tuple(specs)
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes
        self.config = config
        self.pii = pii
        self.dedup = dedup
        self.decisions = decisions
        self.against = tuple(against)
        self.keys_dir = keys_dir

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = file_numbering(shard.source for shard in self.shards)
        keys = (pbegin
                | "ReadInputs" >> ReadInputs(self.shards, self.chunk_records,
                                             self.max_record_bytes)
                | "KeyConversations" >> beam.ParDo(KeyConversations(
                    self.specs, self.config, self.pii, self.dedup, files, self.keys_dir)))
        drops = keys | "FindCopies" >> FindCopies(self.dedup, len(self.shards), INSTRUCTION,
                                                  self.against)
        return {DROPS: drops} | "WriteDecisions" >> WriteDecisions(self.decisions)


class DropDuplicateConversations(ChunkStep):
    """Drops the copies pass one named in the chunk's decision file, each only for the text it
    was found for. The side input, the number of decision files written, makes the chunk wait
    for them."""

    step_name = "dedup"

    def __init__(self, files: Sequence[str], decisions: str, earlier: Sequence[str] = ()):
        self.files = tuple(files)
        self.decisions = decisions
        self.earlier = tuple(earlier)

    def setup(self) -> None:
        self.file_numbers = {path: number for number, path in enumerate(self.files)}

    def run(self, chunk: Any, written: int) -> Iterator[Any]:
        path = decisions_path(self.decisions, chunk_number(chunk.chunk_id))
        decisions = ChunkDecisions.read(path) if written else ChunkDecisions({})
        kept = []
        for index, (record, conversation) in enumerate(zip(chunk.records, chunk.conversations,
                                                           strict=True)):
            dropped = decisions.verdict(record, self.files, self.file_numbers, self.earlier,
                                        conversation_text(conversation))
            if dropped is None:
                kept.append(index)
                continue
            self.count(f"instruction.dropped.{dropped.reason}")
            self.drop(Rejection.of(record, dropped.reason, dropped.message), kind=FILTERED)
        if kept:
            yield chunk.take(kept)


def decision_files(shards: Sequence[ShardSpec], specs: Sequence[InputSpec]) -> tuple[str, ...]:
    """File number -> path of the files pass one reads, as both passes number them."""
    return file_numbering(shard.source for shard in instruction_shards(shards, specs))


def staging_paths(staging_dir: str) -> tuple[str, str]:
    """(decisions, keys) directories under the staging directory."""
    return FileSystems.join(staging_dir, DECISIONS), FileSystems.join(staging_dir, KEYS)


def drop_duplicates(steps: Any, read: SecondRead, config: InstructionConfig, pii: PiiConfig,
                    dedup: ConversationDedup) -> None:
    """Adds pass one (``FindDuplicateConversations``) beside the branch and its
    ``DropDuplicateConversations`` to the branch's ``StepChain``."""
    decisions, keys = staging_paths(read.staging_dir)
    written = (steps.main.pipeline
               | "FindDuplicateConversations" >> FindDuplicateConversations(
                   read.shards, read.specs, read.chunk_records, read.max_record_bytes, config,
                   pii, dedup.config, decisions, dedup.against, keys if dedup.index else None)
               | "CountDecisionFiles" >> beam.combiners.Count.Globally())
    steps.then("DropDuplicates", DropDuplicateConversations(
        decision_files(read.shards, read.specs), decisions, dedup.against),
        side_inputs=[beam.pvalue.AsSingleton(written)])


def index_step(read: SecondRead) -> IndexDocuments:
    """The step that stages the published conversations' index rows."""
    return IndexDocuments(INSTRUCTION, decision_files(read.shards, read.specs),
                          staging_paths(read.staging_dir)[1])
