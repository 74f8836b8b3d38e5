"""Graph assembly and the local entry point."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shlex
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from typing import TextIO

import apache_beam as beam
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
)
from apache_beam.runners.runner import PipelineRunner

from beam_pipeline import beam_internals, progress
from beam_pipeline.options import DESCRIPTION, OPTION_GROUPS, PrepConfig, config_from_options
from beam_pipeline.report import publish
from transforms.classify import ClassifyRecords
from transforms.core.records import ShardSpec
from transforms.core.steps import PARTS, STATS, Part, TailPlan, tail_group_ids
from transforms.core.tokenizer import check_tokenizer, load_tokenizer, tokenizer_identity
from transforms.core.vocabulary import (
    BRANCHES,
    FILTERED,
    INSTRUCTION,
    KNOWLEDGE,
)
from transforms.curation.decontam import eval_index
from transforms.instruction.branch import InstructionBranch
from transforms.instruction.chat_template import (
    SYSTEM_NONE,
    check_system_prompt,
    check_template_tokens,
)
from transforms.io.manifest import (
    MANIFEST_NAME,
    RejectRateError,
    RowCountError,
    read_manifest,
    sum_counters,
    summary_lines,
)
from transforms.io.read_inputs import ReadInputs, check_field_mappings
from transforms.io.readers import InputPlan, large_compressed_advice, plan_inputs
from transforms.io.writers import (
    OUTPUT_KINDS,
    PARQUET_KINDS,
    PHASES_NAME,
    STAGING_DIR,
    ClearPreviousRun,
    StagePart,
    WriteOutputs,
    check_card_place,
    check_output_dir,
    shard_of,
)
from transforms.knowledge.branch import KnowledgeBranch
from transforms.knowledge.dedup.first_pass import SecondRead

LOG = logging.getLogger("beam_pipeline")
MIB = 1024 * 1024
OWN_OPTIONS = tuple(options for _, options in OPTION_GROUPS)
OWN_GROUPS = tuple(title for title, _ in OPTION_GROUPS)
RESERVED_NAMES = {kind.split("/")[0] for kind in OUTPUT_KINDS} | {"manifest.json", PHASES_NAME}
TAILS_DIR = "tails"  # under the staging directory
SHARDS_PER_TAIL_BUCKET = 64  # a shard leaves at most a few leftovers per chunk
CONSOLE_GROUP = "terminal output (local runs)"
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
    console = parser.add_argument_group(CONSOLE_GROUP)
    console.add_argument("--quiet", action="store_true",
                         help="Print no progress while a local run works (the summary still "
                              "comes at the end).")
    console.add_argument("--verbose", action="store_true",
                         help="On failure, print the full traceback and Beam's own log lines "
                              "as well as the one-line error.")
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        if cls not in OWN_OPTIONS:
            cls._add_argparse_args(parser)
    # List our groups first in --help, ahead of Beam's many options.
    beam_internals.order_groups(
        parser, lambda group: group.title not in (*OWN_GROUPS, CONSOLE_GROUP))
    return parser


@dataclasses.dataclass(frozen=True)
class Phase:
    """The inputs of one curriculum phase (or of the whole run) and where they are written."""

    name: str | None
    config: PrepConfig
    inputs: InputPlan

    @property
    def shards(self) -> list[ShardSpec]:
        return self.inputs.shards


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything checked before the graph is built: a bad option or input fails here."""

    options: PipelineOptions
    config: PrepConfig
    phases: list[Phase]
    facts: dict  # for the manifest: the evaluation sets' counts (the job adds the tokenizer's)
    clear_outputs: list[str]  # output directories whose earlier outputs the job deletes first
    quiet: bool = False
    verbose: bool = False

    @property
    def runner(self) -> str:
        return self.options.view_as(StandardOptions).runner or "DirectRunner"

    @property
    def shards(self) -> list[ShardSpec]:
        return [shard for phase in self.phases for shard in phase.shards]

    @property
    def planned(self) -> progress.Planned:
        return progress.Planned(len(self.shards),
                                sum(phase.inputs.total_bytes for phase in self.phases))


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
        inputs = plan_inputs(list(phase_cfg.inputs))
        for spec in phase_cfg.inputs:  # a field mapping the input does not have fails here
            check_field_mappings(spec, inputs.first_files[spec.index])
        if inputs.large_compressed:
            LOG.warning("%s", large_compressed_advice(inputs.large_compressed))
        result.append(Phase(name, phase_cfg, inputs))
    return result


def _console_flags(argv: Sequence[str]) -> tuple[list[str], bool, bool]:
    """``argv`` without the launcher's own --quiet and --verbose, and their values."""
    rest = [arg for arg in argv if arg not in ("--quiet", "--verbose")]
    return rest, "--quiet" in argv, "--verbose" in argv


def prepare(argv: Sequence[str]) -> Plan:
    """Parses and validates options, checks the tokenizer and the output directory cheaply, and
    plans shards from glob expansion: nothing here grows with the number of input files beyond
    listing them (Parquet footers, the tokenizer and the earlier outputs are the job's work; the
    tokenizer is loaded here only to check a --chat_template or --system_prompt none)."""
    argument_parser().parse_args(argv)  # --help, unknown options and bad values stop here
    pipeline_argv, quiet, verbose = _console_flags(argv)
    options = PipelineOptions(pipeline_argv)
    options.view_as(SetupOptions).save_main_session = False
    cfg = config_from_options(options)
    check_tokenizer(cfg.tokenizer, cfg.instruction.chat_template)
    # A template given by --chat_template must be the tokenizer's family's, and --system_prompt
    # none must be possible: both are checked before any work (else the job loads the tokenizer).
    template = cfg.instruction.chat_template
    if template is not None or cfg.instruction.system_prompt == SYSTEM_NONE:
        tok = load_tokenizer(cfg.tokenizer, template)
        # A tokenizer's own template is its family's by definition.
        if template is not None and not cfg.instruction.template_markup_as_text:
            check_template_tokens(tok, f"--chat_template {template!r}")
        check_system_prompt(tok, cfg.instruction.system_prompt)
    phases = plan_phases(cfg)
    facts = {}
    if cfg.curation.decontam is not None:  # evaluation files that cannot be read fail here
        facts["eval_texts"] = eval_index(cfg.curation.decontam).counts()
    for phase in phases:  # each phase's folder (or --output) gets a dataset card
        check_card_place(phase.config.output)
    directories = dict.fromkeys([cfg.output, *(phase.config.output for phase in phases)])
    clear = [directory for directory in directories
             if check_output_dir(directory, cfg.overwrite)]
    return Plan(options, cfg, phases, facts, clear, quiet, verbose)


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


def rerun_command(argv: Sequence[str], **changes: str) -> str:
    """The command that was run, with ``changes`` as options (replacing the same options)."""
    kept = [arg for arg in argv if arg.split("=", 1)[0].removeprefix("--") not in changes]
    added = [f"--{name}={value}" for name, value in changes.items()]
    return shlex.join(["python", "-m", "beam_pipeline", *kept, *added])


# The last line of a traceback that a worker process sends back as the error's text.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.MULTILINE)
# Failures that stop a run once its outputs are written, and those whose message says what to
# change (the others get their class name).
_STOPPED = {RejectRateError.__name__, RowCountError.__name__}
_ACTIONABLE = _STOPPED | {ValueError.__name__}


def _failure(error: BaseException) -> tuple[str, str]:
    """The failing exception's class name and its one-line message. A worker process's failure
    reaches the launcher as a RuntimeError holding the worker's traceback: the last exception
    line of it is the failure. Beam's ``[while running 'STEP']`` suffix is dropped."""
    name, message = type(error).__name__, str(error).strip()
    if "Traceback (most recent call last)" in message:
        found = _EXCEPTION_LINE.findall(message)
        if found:
            name, message = found[-1][0].rsplit(".", 1)[-1], found[-1][1]
    return name, re.sub(r"\s*\[while running '[^']*'\]\s*$", "", message)


def _quiet_beam_logs(verbose: bool) -> None:
    """Beam logs a failing step's exception with its traceback before re-raising it; the
    launcher prints that failure once itself, so Beam's log lines show only with --verbose."""
    logging.getLogger("apache_beam").setLevel(logging.INFO if verbose else logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    LOG.setLevel(logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    _quiet_beam_logs(verbose)
    try:
        plan = prepare(argv)
    except ValueError as error:  # a bad option or input: the message names it
        if verbose:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:
        _fail(argv, error, verbose)
    try:
        execute(plan)
    except Exception as error:
        _fail(argv, error, verbose)


def _fail(argv: Sequence[str], error: BaseException, verbose: bool) -> None:
    """One message for a failed run, with what to do next; exit status 1."""
    if verbose:
        traceback.print_exception(error)
    name, message = _failure(error)
    if name in _STOPPED:
        advice = (f"the directory holds this run's partial outputs; once the inputs or the "
                  f"option are changed, run again with --overwrite=true: "
                  f"{rerun_command(argv, overwrite='true')}")
    else:
        advice = "run again with --verbose for the traceback"
    text = message if name in _ACTIONABLE else f"{name}: {message}"
    print(f"error: {text}\n{advice}", file=sys.stderr)
    sys.exit(1)
