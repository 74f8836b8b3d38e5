"""The graph of one run or curriculum phase: read -> classify -> the two branches -> staged
parts -> sharded files and manifest; a phased run is this graph once per phase."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import apache_beam as beam
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.options import PrepConfig
from beam_pipeline.planning import Phase
from transforms.classify import ClassifyRecords
from transforms.core import progress
from transforms.core.records import RecordChunk, ShardSpec
from transforms.core.steps import FILE_STATS, PARTS, STATS, Part, TailPlan, tail_group_ids
from transforms.core.tokenizer import load_tokenizer, tokenizer_identity
from transforms.core.vocabulary import FILTERED, INSTRUCTION, KNOWLEDGE
from transforms.instruction.branch import InstructionBranch
from transforms.instruction.dedup import ConversationDedup
from transforms.io.formats import stages_documents
from transforms.io.manifest import KeepTopDomains, KeepWorstFiles, sum_counters
from transforms.io.read_inputs import ReadInputs
from transforms.io.writers import (
    STAGING_DIR,
    StagePart,
    WriteOutputs,
    is_parquet,
    output_kinds,
    shard_of,
)
from transforms.knowledge.branch import KnowledgeBranch
from transforms.knowledge.dedup.first_pass import SecondRead

MIB = 1024 * 1024
TAILS_DIR = "tails"  # under the staging directory
SHARDS_PER_TAIL_BUCKET = 64  # a shard leaves at most a few leftovers per chunk


def tail_plan(cfg: PrepConfig, shards: Sequence[ShardSpec], branch: str) -> TailPlan:
    """A branch's leftovers are joined in groups bounded in size and few in number, through
    files in the staging directory (which goes at the end of the run)."""
    return TailPlan(tail_buckets(shards),
                    FileSystems.join(cfg.output, STAGING_DIR, TAILS_DIR, branch))


def tail_buckets(shards: Sequence[ShardSpec]) -> int:
    return max(1, math.ceil(len(shards) / SHARDS_PER_TAIL_BUCKET))


def build_graph(p: beam.Pipeline | beam.pvalue.PBegin, cfg: PrepConfig,
                shards: Sequence[ShardSpec], facts: dict, started: beam.PCollection,
                shard_bytes: Sequence[int] | None = None) -> beam.PCollection:
    """Read -> classify -> the two branches -> sharded files and manifest.json (whose path is
    the returned PCollection's one element). ``started`` is the job's first step
    (``ClearPreviousRun``): output files are written only once it is done."""
    fields = started | "CheckTokenizer" >> beam.Map(
        _manifest_fields, cfg.tokenizer, cfg.instruction.chat_template,
        {"config": cfg.as_dict(), **facts})
    chunks = p | "ReadInputs" >> ReadInputs(shards, cfg.chunk_records, cfg.max_record_mb * MIB,
                                            shard_bytes)
    routed = chunks | "ClassifyRecords" >> ClassifyRecords(cfg.inputs)
    file_reads = chunks | "CountFileReads" >> beam.Map(_file_reads)
    second_read = SecondRead(tuple(shards), tuple(cfg.inputs), cfg.chunk_records,
                             cfg.max_record_mb * MIB, FileSystems.join(cfg.output, STAGING_DIR))
    knowledge_parts, knowledge_stats = routed[KNOWLEDGE] | "KnowledgeBranch" >> KnowledgeBranch(
        cfg.tokenizer, cfg.knowledge, tail_plan(cfg, shards, KNOWLEDGE), second_read,
        cfg.curation.for_branch(KNOWLEDGE, cfg.inputs), stages_documents(cfg.output_format))
    instruction_parts, instruction_stats = (
        routed[INSTRUCTION]
        | "InstructionBranch" >> InstructionBranch(
            cfg.tokenizer, cfg.instruction, tail_plan(cfg, shards, INSTRUCTION),
            cfg.curation.for_branch(INSTRUCTION, cfg.inputs), second_read,
            ConversationDedup(dataclasses.replace(cfg.knowledge.dedup, mode=cfg.instruction.dedup),
                              cfg.knowledge.dedup_against, cfg.knowledge.dedup_index)))
    # Each step's tables are written to staging by a DoFn fused with the step, and only the
    # small StagedFile notes are flattened: the DirectRunner materialises a flatten of several
    # stages' outputs, which would hold every output row in memory at once.
    stage = StagePart(FileSystems.join(cfg.output, STAGING_DIR),
                      skip=() if cfg.write_filtered else (FILTERED,))
    staged = [parts
              | f"Count {_step_label(parts)}" >> beam.Map(_count_tokens)
              | f"Stage {_step_label(parts)}" >> beam.ParDo(stage)
              for parts in (routed[PARTS], *knowledge_parts, *instruction_parts)]
    stats = ((routed[STATS], knowledge_stats, instruction_stats, file_reads)
             | "AllStats" >> beam.Flatten()
             | "KeepWorstFiles" >> KeepWorstFiles(cfg.max_reject_fraction)
             | "KeepTopDomains" >> KeepTopDomains()
             | "SumStats" >> beam.CombineGlobally(sum_counters))
    after_start = (staged
                   | "AllStaged" >> beam.Flatten()
                   | "AfterJobStart" >> beam.Map(_after, beam.pvalue.AsSingleton(fields)))
    # Every input shard and tail group that may have staged files, for WriteOutputs to look in.
    shard_names = (
        (chunks
         | "ShardNames" >> beam.Map(lambda chunk: shard_of(chunk.chunk_id))
         | "DistinctShards" >> beam.Distinct()),
        p | "TailGroups" >> beam.Create(tail_group_ids(tail_buckets(shards),
                                                       cfg.curation.partitions))
    ) | "StagingShards" >> beam.Flatten()
    return (after_start, stats, shard_names) | "WriteOutputs" >> WriteOutputs(
        cfg.output, cfg.num_shards, cfg.target_shard_mb, cfg.row_group_rows,
        beam.pvalue.AsSingleton(fields), cfg.output_format,
        output_kinds(cfg.curation.partitions, cfg.knowledge.write_documents,
                     cfg.knowledge.dedup_index))


def _manifest_fields(_: int, tokenizer: str | None, chat_template: str | None,
                     fields: dict) -> dict:
    """The manifest's facts with the tokenizer's identity, found inside the job: the launcher
    only checks ``--tokenizer`` cheaply (``check_tokenizer``)."""
    return {**fields, "tokenizer": tokenizer_identity(load_tokenizer(tokenizer, chat_template))}


def _file_reads(chunk: RecordChunk) -> dict:
    """The records a chunk read, per file: the per-file breakdown's ``read`` (kept out of Beam
    metrics, whose names would grow with the files)."""
    reads = collections.Counter((record.input_index, record.source) for record in chunk.records)
    return {FILE_STATS: {key: {"read": n} for key, n in reads.items()}}


def _after(element: object, _: object) -> object:
    """``element`` unchanged, once the side input (the job's first step) exists."""
    return element


def _count_tokens(part: Part) -> Part:
    """Counts the tokens of training rows for the progress line, and passes the part on."""
    if is_parquet(part.kind) and "input_ids" in part.table.column_names and part.table.num_rows:
        tokens = pc.sum(pc.list_value_length(part.table["input_ids"])).as_py() or 0
        progress.count(tokens_written=tokens)
    return part


def _step_label(pcoll: beam.PCollection) -> str:
    """The producing step's name, e.g. ``KnowledgeBranch Tokenize``."""
    return pcoll.producer.full_label.replace("/", " ")


class PreparePhase(beam.PTransform):
    """One curriculum phase's whole graph, under its own label and output directory."""

    def __init__(self, phase: Phase, facts: dict, started: beam.PCollection):
        super().__init__()
        self.phase = phase
        self.facts = facts
        self.started = started

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return build_graph(pbegin, self.phase.config, self.phase.inputs.shards, self.facts,
                           self.started, self.phase.inputs.shard_bytes)
