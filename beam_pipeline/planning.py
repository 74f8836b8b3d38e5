"""Everything checked before a graph is built, so that a bad option, input or output directory
fails at launch with one message rather than inside a job; the plan is all the graph needs."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import uuid
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

from beam_pipeline import progress
from beam_pipeline.options import PrepConfig, check_command_line, config_from_options
from transforms.core.records import ShardSpec
from transforms.core.tokenizer import check_tokenizer, load_tokenizer
from transforms.core.vocabulary import BRANCHES
from transforms.curation.decontam import eval_index
from transforms.curation.urls import check_blocklist
from transforms.instruction.chat_template import (
    SYSTEM_NONE,
    check_system_prompt,
    check_template_tokens,
)
from transforms.io.earlier_runs import check_card_place, check_output_dir
from transforms.io.planning import (
    InputPlan,
    check_field_mappings,
    large_compressed_advice,
    plan_inputs,
)
from transforms.io.writers import OUTPUT_KINDS, PHASES_NAME

LOG = logging.getLogger("beam_pipeline")
RESERVED_NAMES = {kind.split("/")[0] for kind in OUTPUT_KINDS} | {"manifest.json", PHASES_NAME}


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
    run_id: str  # names this run in its output lock
    quiet: bool = False
    verbose: bool = False
    argv: tuple[str, ...] = ()  # as given, for the lock's record of who holds the folder

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
        for spec in phase_cfg.inputs:
            if inputs.skipped[spec.index].counts:
                LOG.info("--input %s: skipped %s", spec.pattern,
                         inputs.skipped[spec.index].describe())
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
    check_command_line(argv)
    pipeline_argv, quiet, verbose = _console_flags(argv)
    options = PipelineOptions(pipeline_argv)
    options.view_as(SetupOptions).save_main_session = False
    cfg = config_from_options(options)
    check_output_place(cfg)
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
    run_id = uuid.uuid4().hex[:16]
    facts: dict = {"run": {"output": cfg.output, "run_id": run_id},
                   "input_files": {index: found for phase in phases
                                   for index, found in phase.inputs.input_facts().items()}}
    if cfg.curation.decontam is not None:  # evaluation files that cannot be read fail here
        facts["eval_texts"] = eval_index(cfg.curation.decontam).counts()
    if cfg.curation.urls.active:  # so do blocklists that cannot be read or parsed
        check_blocklist(cfg.curation.urls)
    for phase in phases:  # each phase's folder (or --output) gets a dataset card
        check_card_place(phase.config.output)
    directories = dict.fromkeys([cfg.output, *(phase.config.output for phase in phases)])
    clear = [directory for directory in directories
             if check_output_dir(directory, cfg.overwrite)]
    return Plan(options, cfg, phases, facts, clear, run_id, quiet, verbose, tuple(argv))


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (local paths resolved, gs:// as text)."""
    if "://" not in path and "://" not in folder:
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path.rstrip("/") == folder.rstrip("/") or path.startswith(folder.rstrip("/") + "/")


def _folder_read_whole(pattern: str) -> str | None:
    """The folder an --input reads at any depth: a directory, or the part of a ``**`` pattern
    before its first wildcard; None for a file or a one-level glob."""
    if pattern.endswith("/") or ("://" not in pattern and os.path.isdir(pattern)):
        return pattern
    if "**" in pattern:
        return re.split(r"[*?\[]", pattern, maxsplit=1)[0].rpartition("/")[0] or "."
    return None


def check_output_place(cfg: PrepConfig) -> None:
    """An --output that cannot hold a run fails before any work: a file where the folder
    should be, a folder the tokenizer is loaded from, or one an --input reads (a rerun would
    read its own outputs back as input)."""
    output = cfg.output
    if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"--output {output} is a file; a run writes a folder there")
    tokenizer = cfg.tokenizer or ""
    if ("://" in tokenizer or os.path.exists(tokenizer)) and _inside(tokenizer, output):
        raise ValueError(f"--tokenizer {cfg.tokenizer} is inside --output {output}, which a run "
                         "(and --overwrite) replaces; copy the tokenizer elsewhere first")
    for spec in cfg.inputs:
        folder = _folder_read_whole(spec.pattern)
        if folder is not None and _inside(output, folder):
            raise ValueError(f"--output {output} is inside --input {spec.pattern}: a rerun would "
                             "read this run's outputs back as input; choose an --output "
                             "outside the inputs")
