"""Building the job from a plan and running it: on a local runner with a progress line, the
launcher's stderr kept clear of worker tracebacks, and the summary at the end."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import TextIO

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, TestOptions
from apache_beam.runners.runner import PipelineRunner

from beam_pipeline import beam_internals, progress
from beam_pipeline.graph import PreparePhase, build_graph
from beam_pipeline.options import PrepConfig, launch_command
from beam_pipeline.planning import Phase, Plan, prepare
from beam_pipeline.report import publish
from transforms.core import beam_caches
from transforms.io.earlier_runs import ClearPreviousRun, clear_staging
from transforms.io.manifest import MANIFEST_NAME, read_manifest, summary_lines
from transforms.io.output_lock import Holder, OutputLock, acquire, release_if_held
from transforms.io.writers import PHASES_NAME

LOG = logging.getLogger("beam_pipeline")
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
# Beam's DirectRunner first tries the Prism runner, downloading its binary from GitHub. Prism
# ignores --direct_running_mode, and offline the attempt costs half a second before Beam falls
# back to the FnApiRunner; these names go to the FnApiRunner directly (--runner=PrismRunner
# still chooses Prism).
FN_API_RUNNERS = ("DirectRunner", "SwitchingDirectRunner")


def run(argv: Sequence[str]) -> PrepConfig:
    plan = prepare(argv)
    return execute(plan, take_output(plan))


def take_output(plan: Plan) -> OutputLock | None:
    """Takes the output folder's lock before any work (a run that cannot is refused with a
    ValueError naming the holder), then deletes a failed run's staging folders. A Dataflow
    dry run (--dry_run: everything but the submission) touches nothing and takes no lock,
    as no job would release it."""
    if _dry_run(plan):
        return None
    holder = Holder.this_run(plan.run_id, launch_command(plan.argv))
    try:
        lock = acquire(plan.config.output, holder)
    except OSError as error:
        raise ValueError(f"--output {plan.config.output} cannot be written: "
                         f"{error.strerror or error}") from error
    try:
        for directory in plan.clear_outputs:
            clear_staging(directory)
    except BaseException:
        lock.release()
        raise
    return lock


def _dry_run(plan: Plan) -> bool:
    # Beam reads the flag as truthy text, so do the same.
    return plan.runner not in LOCAL_RUNNERS and bool(plan.options.view_as(TestOptions).dry_run)


def local_runner(plan: Plan) -> PipelineRunner | None:
    """The FnApiRunner for the DirectRunner's names, as Beam's DirectRunner builds it when it
    falls back from Prism (the options reach subprocess workers); None lets Beam choose."""
    if plan.runner not in FN_API_RUNNERS:
        return None
    return beam_internals.fn_api_runner(plan.options)


def build_pipeline(plan: Plan) -> beam.Pipeline:
    """The whole job's graph, built from the plan alone (no file is opened here)."""
    cfg = plan.config
    beam_caches.install()
    pipeline = beam.Pipeline(runner=local_runner(plan), options=plan.options)
    started = pipeline | "ClearPreviousRun" >> ClearPreviousRun(plan.clear_outputs)
    if plan.phases[0].name is None:
        phase = plan.phases[0]
        done = build_graph(pipeline, cfg, phase.shards, plan.facts, started,
                           phase.inputs.shard_bytes)
    else:
        manifests = [pipeline | f"Phase {phase.name}" >> PreparePhase(phase, plan.facts, started)
                     for phase in plan.phases]
        done = (manifests
                | "AllPhases" >> beam.Flatten()
                | "CollectPhases" >> beam.combiners.ToList()
                | "WritePhases" >> beam.Map(_write_phases, cfg.output, plan.phases))
    if plan.runner not in LOCAL_RUNNERS:  # a local launcher releases the lock itself
        _ = done | "ReleaseOutputLock" >> beam.Map(release_if_held, cfg.output, plan.run_id)
    return pipeline


def execute(plan: Plan, lock: OutputLock | None) -> PrepConfig:
    """Builds and runs the graph holding the output folder's ``lock`` (None for a dry run); on
    a local runner shows progress, waits, prints the summary and releases the lock. A remote
    job releases it as its last step, so the launcher releases it only if the submission
    fails."""
    try:
        cfg = _execute(plan)
    except BaseException:
        _release(lock)
        raise
    if plan.runner in LOCAL_RUNNERS:
        _release(lock)
    return cfg


def _release(lock: OutputLock | None) -> None:
    if lock is not None:
        lock.release()


def _execute(plan: Plan) -> PrepConfig:
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
        for line in (*summary_lines(manifest, phase.config.output),
                     *(f"warning: {w}" for w in manifest.get("warnings", []))):
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
