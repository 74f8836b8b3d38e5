"""Graph assembly and the local entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

from beam_pipeline import beam_internals
from beam_pipeline.options import DESCRIPTION, OPTION_GROUPS, PrepConfig, config_from_options
from transforms.classify import ClassifyRecords
from transforms.core.records import ShardSpec
from transforms.core.steps import PARTS, STATS, TailPlan
from transforms.core.tokenizer import load_tokenizer, tokenizer_identity
from transforms.core.vocabulary import (
    BRANCHES,
    FILTERED,
    INSTRUCTION,
    KNOWLEDGE,
)
from transforms.curation.decontam import eval_index
from transforms.instruction.branch import InstructionBranch
from transforms.io.manifest import (
    MANIFEST_NAME,
    RejectRateError,
    RowCountError,
    read_manifest,
    sum_counters,
    summary_lines,
)
from transforms.io.read_inputs import ReadInputs
from transforms.io.readers import plan_shards
from transforms.io.writers import (
    OUTPUT_KINDS,
    PHASES_NAME,
    STAGING_DIR,
    StagePart,
    WriteOutputs,
    prepare_output_dir,
)
from transforms.knowledge.branch import (
    KnowledgeBranch,
    SecondRead,
)

LOG = logging.getLogger("beam_pipeline")
MIB = 1024 * 1024
OWN_OPTIONS = tuple(options for _, options in OPTION_GROUPS)
OWN_GROUPS = tuple(title for title, _ in OPTION_GROUPS)
RESERVED_NAMES = {kind.split("/")[0] for kind in OUTPUT_KINDS} | {"manifest.json", PHASES_NAME}
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
    return TailPlan(max(1, math.ceil(len(shards) / SHARDS_PER_TAIL_BUCKET)),
                    FileSystems.join(cfg.output, STAGING_DIR, TAILS_DIR, branch))


def build_graph(p: beam.Pipeline | beam.pvalue.PBegin, cfg: PrepConfig,
                shards: Sequence[ShardSpec], facts: dict) -> beam.PCollection:
    """Read -> classify -> the two branches -> sharded files and manifest.json (whose path is
    the returned PCollection's one element)."""
    chunks = p | "ReadInputs" >> ReadInputs(shards, cfg.chunk_records, cfg.max_record_mb * MIB)
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
    staged = [parts | f"Stage {_step_label(parts)}" >> beam.ParDo(stage)
              for parts in (routed[PARTS], *knowledge_parts, *instruction_parts)]
    stats = ((routed[STATS], knowledge_stats, instruction_stats)
             | "AllStats" >> beam.Flatten()
             | "SumStats" >> beam.CombineGlobally(sum_counters))
    return (staged | "AllStaged" >> beam.Flatten(), stats) | "WriteOutputs" >> WriteOutputs(
        cfg.output, cfg.num_shards, cfg.target_shard_mb, cfg.row_group_rows,
        {"config": cfg.as_dict(), **facts})


def _step_label(pcoll: beam.PCollection) -> str:
    """The producing step's name, e.g. ``KnowledgeBranch Tokenize``."""
    return pcoll.producer.full_label.replace("/", " ")


class PreparePhase(beam.PTransform):
    """One curriculum phase's whole graph, under its own label and output directory."""

    def __init__(self, phase: Phase, facts: dict):
        super().__init__()
        self.phase = phase
        self.facts = facts

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return build_graph(pbegin, self.phase.config, self.phase.shards, self.facts)


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


def argument_parser() -> argparse.ArgumentParser:
    """Our options first, then every Beam option, so --help documents them all."""
    parser = beam_internals.argument_parser(
        prog="python -m beam_pipeline", description=DESCRIPTION, allow_abbrev=False,
        usage="%(prog)s --input PATTERN [--input PATTERN ...] --output DIR [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    beam_internals.set_default_group_title(
        parser, "Beam options (runner, Dataflow, worker environment, ...)")
    for cls in OWN_OPTIONS:
        cls._add_argparse_args(parser)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        if cls not in OWN_OPTIONS:
            cls._add_argparse_args(parser)
    # List our groups first in --help, ahead of Beam's many options.
    beam_internals.order_groups(parser, lambda group: group.title not in OWN_GROUPS)
    return parser


@dataclasses.dataclass(frozen=True)
class Phase:
    """The inputs of one curriculum phase (or of the whole run) and where they are written."""

    name: str | None
    config: PrepConfig
    shards: list[ShardSpec]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything checked before the graph is built: a bad option or input fails here."""

    options: PipelineOptions
    config: PrepConfig
    phases: list[Phase]
    facts: dict  # for the manifest: the tokenizer's identity, the evaluation sets' counts

    @property
    def runner(self) -> str:
        return self.options.view_as(StandardOptions).runner or "DirectRunner"

    @property
    def shards(self) -> list[ShardSpec]:
        return [shard for phase in self.phases for shard in phase.shards]


def plan_phases(cfg: PrepConfig) -> list[Phase]:
    """One phase per ``phase=`` name, in order of first mention; the whole run if none."""
    named = [spec.phase for spec in cfg.inputs]
    if not any(named):
        phases = [(None, cfg)]
    else:
        if not all(named):
            missing = ", ".join(spec.pattern for spec in cfg.inputs if not spec.phase)
            raise ValueError(f"some inputs name a phase, so every input must; missing on: "
                             f"{missing}")
        clashes = sorted(set(named) & RESERVED_NAMES)
        if clashes:
            raise ValueError(f"phase name(s) {', '.join(clashes)} would clash with output files "
                             f"of the run; choose others")
        phases = [(name, dataclasses.replace(
            cfg, inputs=tuple(spec for spec in cfg.inputs if spec.phase == name),
            output=FileSystems.join(cfg.output, name))) for name in dict.fromkeys(named)]
    result = []
    for name, phase_cfg in phases:
        for branch in BRANCHES:  # a wrong weight or a missing declaration fails here
            phase_cfg.curation.for_branch(branch, phase_cfg.inputs)
        result.append(Phase(name, phase_cfg, plan_shards(list(phase_cfg.inputs))))
    return result


def prepare(argv: Sequence[str]) -> Plan:
    """Parses and validates options, loads the tokenizer, plans shards, checks the output."""
    argument_parser().parse_args(argv)  # --help, unknown options and bad values stop here
    options = PipelineOptions(argv)
    options.view_as(SetupOptions).save_main_session = False
    cfg = config_from_options(options)
    facts = {"tokenizer": tokenizer_identity(
        load_tokenizer(cfg.tokenizer, cfg.instruction.chat_template))}
    phases = plan_phases(cfg)
    if cfg.curation.decontam is not None:  # evaluation files that cannot be read fail here
        facts["eval_texts"] = eval_index(cfg.curation.decontam).counts()
    prepare_output_dir(cfg.output, cfg.overwrite)
    for phase in phases:
        if phase.name is not None:
            prepare_output_dir(phase.config.output, cfg.overwrite)
    return Plan(options, cfg, phases, facts)


def run(argv: Sequence[str]) -> PrepConfig:
    return execute(prepare(argv))


def local_runner(plan: Plan) -> PipelineRunner | None:
    """The FnApiRunner for the DirectRunner's names, as Beam's DirectRunner builds it when it
    falls back from Prism (the options reach subprocess workers); None lets Beam choose."""
    if plan.runner not in FN_API_RUNNERS:
        return None
    return beam_internals.fn_api_runner(plan.options)


def execute(plan: Plan) -> PrepConfig:
    """Builds and runs the graph; on a local runner waits and prints the summary."""
    cfg = plan.config
    LOG.info("%d input shard(s) from %d input(s) in %d phase(s); writing to %s",
             len(plan.shards), len(cfg.inputs), len(plan.phases), cfg.output)
    pipeline = beam.Pipeline(runner=local_runner(plan), options=plan.options)
    if plan.phases[0].name is None:
        build_graph(pipeline, cfg, plan.phases[0].shards, plan.facts)
    else:
        manifests = [pipeline | f"Phase {phase.name}" >> PreparePhase(phase, plan.facts)
                     for phase in plan.phases]
        _ = (manifests
             | "AllPhases" >> beam.Flatten()
             | "CollectPhases" >> beam.combiners.ToList()
             | "WritePhases" >> beam.Map(_write_phases, cfg.output, plan.phases))
    result = pipeline.run()
    if plan.runner in LOCAL_RUNNERS:
        result.wait_until_finish()
        for phase in plan.phases:
            if phase.name is not None:
                print(f"phase {phase.name} ({phase.config.output}):")
            for line in summary_lines(read_manifest(phase.config.output)):
                print(line)
    else:
        LOG.info("submitted to %s; the job writes %s/manifest.json when it completes",
                 plan.runner, cfg.output)
    return cfg


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    LOG.setLevel(logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plan = prepare(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        execute(plan)
    except (RejectRateError, RowCountError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
