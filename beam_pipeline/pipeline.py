"""Graph assembly and the local entry point."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import TextIO

import apache_beam as beam
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.runners.runner import PipelineRunner

from beam_pipeline import beam_internals, progress
from beam_pipeline.options import PrepConfig
from beam_pipeline.planning import Phase, Plan, prepare
from beam_pipeline.report import publish
from transforms.classify import ClassifyRecords
from transforms.core.records import ShardSpec
from transforms.core.steps import PARTS, STATS, Part, TailPlan, tail_group_ids
from transforms.core.tokenizer import load_tokenizer, tokenizer_identity
from transforms.core.vocabulary import FILTERED, INSTRUCTION, KNOWLEDGE
from transforms.instruction.branch import InstructionBranch
from transforms.io.manifest import MANIFEST_NAME, read_manifest, sum_counters, summary_lines
from transforms.io.read_inputs import ReadInputs
from transforms.io.writers import (
    PARQUET_KINDS,
    PHASES_NAME,
    STAGING_DIR,
    ClearPreviousRun,
    StagePart,
    WriteOutputs,
    shard_of,
)
from transforms.knowledge.branch import KnowledgeBranch, SecondRead

LOG = logging.getLogger("beam_pipeline")
MIB = 1024 * 1024
TAILS_DIR = "tails"  # under the staging directory
SHARDS_PER_TAIL_BUCKET = 64  # a shard leaves at most a few leftovers per chunk
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
# Beam's DirectRunner first tries the Prism runner, downloading its binary from GitHub. Prism
# ignores --direct_running_mode, and offline the attempt costs half a second before Beam falls
# back to the FnApiRunner; these names go to the FnApiRunner directly (--runner=PrismRunner
# still chooses Prism).
FN_API_RUNNERS = ("DirectRunner", "SwitchingDirectRunner")


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
    second_read = SecondRead(tuple(shards), tuple(cfg.inputs), cfg.chunk_records,
                             cfg.max_record_mb * MIB, FileSystems.join(cfg.output, STAGING_DIR))
    knowledge_parts, knowledge_stats = routed[KNOWLEDGE] | "KnowledgeBranch" >> KnowledgeBranch(
        cfg.tokenizer, cfg.knowledge, tail_plan(cfg, shards, KNOWLEDGE), second_read,
        cfg.curation.for_branch(KNOWLEDGE, cfg.inputs))
    instruction_parts, instruction_stats = (
        routed[INSTRUCTION]
        | "InstructionBranch" >> InstructionBranch(
            cfg.tokenizer, cfg.instruction, tail_plan(cfg, shards, INSTRUCTION),
            cfg.curation.for_branch(INSTRUCTION, cfg.inputs)))
    # Each step's tables are written to staging by a DoFn fused with the step, and only the
    # small StagedFile notes are flattened: the DirectRunner materialises a flatten of several
    # stages' outputs, which would hold every output row in memory at once.
    stage = StagePart(FileSystems.join(cfg.output, STAGING_DIR),
                      skip=() if cfg.write_filtered else (FILTERED,))
    staged = [parts
              | f"Count {_step_label(parts)}" >> beam.Map(_count_tokens)
              | f"Stage {_step_label(parts)}" >> beam.ParDo(stage)
              for parts in (routed[PARTS], *knowledge_parts, *instruction_parts)]
    stats = ((routed[STATS], knowledge_stats, instruction_stats)
             | "AllStats" >> beam.Flatten()
             | "SumStats" >> beam.CombineGlobally(sum_counters))
    after_start = (staged
                   | "AllStaged" >> beam.Flatten()
                   | "AfterJobStart" >> beam.Map(_after, beam.pvalue.AsSingleton(fields)))
    # Every input shard and tail group that may have staged files, for WriteOutputs to look in.
    shard_names = (
        (chunks
         | "ShardNames" >> beam.Map(lambda chunk: shard_of(chunk.chunk_id))
         | "DistinctShards" >> beam.Distinct()),
        p | "TailGroups" >> beam.Create(tail_group_ids(tail_buckets(shards)))
    ) | "StagingShards" >> beam.Flatten()
    return (after_start, stats, shard_names) | "WriteOutputs" >> WriteOutputs(
        cfg.output, cfg.num_shards, cfg.target_shard_mb, cfg.row_group_rows,
        beam.pvalue.AsSingleton(fields))


def _manifest_fields(_: int, tokenizer: str | None, chat_template: str | None,
                     fields: dict) -> dict:
    """The manifest's facts with the tokenizer's identity, found inside the job: the launcher
    only checks ``--tokenizer`` cheaply (``check_tokenizer``)."""
    return {**fields, "tokenizer": tokenizer_identity(load_tokenizer(tokenizer, chat_template))}


def _after(element: object, _: object) -> object:
    """``element`` unchanged, once the side input (the job's first step) exists."""
    return element


def _count_tokens(part: Part) -> Part:
    """Counts the tokens of training rows for the progress line, and passes the part on."""
    if part.kind in PARQUET_KINDS and part.table.num_rows:
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


def _write_phases(manifests: list[str], output: str, phases: Sequence[Phase]) -> str:
    """OUTPUT/phases.json, written once every phase is complete: the order to train in."""
    if len(manifests) != len(phases):
        raise RuntimeError(f"{len(manifests)} of {len(phases)} phases wrote a manifest; "
                           f"{PHASES_NAME} is not written")
    path = FileSystems.join(output, PHASES_NAME)
    listing = [{"phase": i + 1, "name": phase.name, "directory": phase.config.output,
                "manifest": FileSystems.join(phase.config.output, MANIFEST_NAME)}
               for i, phase in enumerate(phases)]
    with FileSystems.create(path) as handle:
        handle.write(json.dumps({"phases": listing}, indent=2).encode("utf-8") + b"\n")
    return path


def run(argv: Sequence[str]) -> PrepConfig:
    return execute(prepare(argv))


def local_runner(plan: Plan) -> PipelineRunner | None:
    """The FnApiRunner for the DirectRunner's names, as Beam's DirectRunner builds it when it
    falls back from Prism (the options reach subprocess workers); None lets Beam choose."""
    if plan.runner not in FN_API_RUNNERS:
        return None
    return beam_internals.fn_api_runner(plan.options)


def build_pipeline(plan: Plan) -> beam.Pipeline:
    """The whole job's graph, built from the plan alone (no file is opened here)."""
    cfg = plan.config
    pipeline = beam.Pipeline(runner=local_runner(plan), options=plan.options)
    started = pipeline | "ClearPreviousRun" >> ClearPreviousRun(plan.clear_outputs)
    if plan.phases[0].name is None:
        phase = plan.phases[0]
        build_graph(pipeline, cfg, phase.shards, plan.facts, started, phase.inputs.shard_bytes)
    else:
        manifests = [pipeline | f"Phase {phase.name}" >> PreparePhase(phase, plan.facts, started)
                     for phase in plan.phases]
        _ = (manifests
             | "AllPhases" >> beam.Flatten()
             | "CollectPhases" >> beam.combiners.ToList()
             | "WritePhases" >> beam.Map(_write_phases, cfg.output, plan.phases))
    return pipeline


def execute(plan: Plan) -> PrepConfig:
    """Builds and runs the graph; on a local runner shows progress, waits and prints the
    summary."""
    cfg = plan.config
    LOG.info("%d input shard(s) from %d input(s) in %d phase(s); writing to %s",
             len(plan.shards), len(cfg.inputs), len(plan.phases), cfg.output)
    pipeline = build_pipeline(plan)
    if plan.runner not in LOCAL_RUNNERS:
        pipeline.run()
        LOG.info("submitted to %s; the job writes %s/manifest.json when it completes (then "
                 "python -m beam_pipeline.report %s writes the report and dataset card)",
                 plan.runner, cfg.output, cfg.output)
        return cfg
    with _console(plan) as console, _progress(plan, console):
        pipeline.run().wait_until_finish()
    for phase in plan.phases:
        if phase.name is not None:
            print(f"phase {phase.name} ({phase.config.output}):")
        manifest = read_manifest(phase.config.output)
        for line in (*summary_lines(manifest), *empty_input_warnings(manifest)):
            print(line)
        print(publish(phase.config.output))  # the dataset card, and a line naming the report
    return cfg


@contextlib.contextmanager
def _progress(plan: Plan, console: TextIO) -> Iterator[None]:
    if plan.quiet:
        yield
        return
    with progress.ProgressReporter(plan.planned, console):
        yield


@contextlib.contextmanager
def _console(plan: Plan) -> Iterator[TextIO]:
    """The terminal's stderr for the launcher's own lines while the run works. Beam's
    ``multi_processing`` worker processes print a failing step's traceback straight to the
    stderr they inherit, so, unless --verbose, the workers are started with theirs sent to a
    file (deleted after the run); the launcher then reports the failure once."""
    mode = plan.options.view_as(DirectOptions).direct_running_mode
    if plan.verbose or mode != "multi_processing":
        yield sys.stderr
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as workers_log, os.fdopen(os.dup(saved), "w") as console:
        os.dup2(workers_log.fileno(), 2)
        try:
            yield console
        finally:
            console.flush()
            os.dup2(saved, 2)
            os.close(saved)


def empty_input_warnings(manifest: dict) -> list[str]:
    """A warning for each input that gave no record: an empty file, or a pattern that matched
    only empty files, passes otherwise unnoticed."""
    return [f"warning: --input {entry['pattern']} read 0 records (its files are empty)"
            for entry in manifest.get("inputs", []) if entry.get("read") == 0]
