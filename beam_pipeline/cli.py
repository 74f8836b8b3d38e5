"""The command line's outcome: a run, or one message naming what to change and an exit status,
with the traceback and Beam's log lines only under --verbose."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Sequence

from beam_pipeline.options import launch_command
from beam_pipeline.planning import prepare
from beam_pipeline.running import execute, take_output
from transforms.io.input_warnings import StrictWarningError
from transforms.io.manifest import RejectRateError, RowCountError

LOG = logging.getLogger("beam_pipeline")


def rerun_command(argv: Sequence[str], **changes: str) -> str:
    """The command that was run, with ``changes`` as options (replacing the same options)."""
    kept = [arg for arg in argv if arg.split("=", 1)[0].removeprefix("--") not in changes]
    added = [f"--{name}={value}" for name, value in changes.items()]
    return launch_command([*kept, *added])


# The last line of a traceback that a worker process sends back as the error's text.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.MULTILINE)
# Failures that stop a run once its outputs are written, and those whose message says what to
# change (the others get their class name).
_STOPPED = {RejectRateError.__name__, RowCountError.__name__, StrictWarningError.__name__}
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
        lock = take_output(plan)
    except ValueError as error:  # a bad option or input: the message names it
        if verbose:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:
        _fail(argv, error, verbose)
    try:
        execute(plan, lock)
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
