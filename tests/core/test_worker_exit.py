"""Beam SDK worker processes skip the interpreter's teardown, and only they do."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

# A process that names its __main__ like Beam's SDK worker, with an exit handler registered
# before the package is imported (as logging's and grpc's are in a real worker).
SCRIPT = """
import atexit, importlib.machinery, sys
if sys.argv[1] == "worker":
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec(
        "apache_beam.runners.worker.sdk_worker_main", None)
atexit.register(lambda: print("teardown ran", flush=True))
import transforms
print("work done", flush=True)
if sys.argv[2] == "fail":
    raise RuntimeError("the harness failed")
"""


def run(kind: str, outcome: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, kind, outcome], check=False,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_worker_leaves_before_the_teardown_with_status_0():
    done = run("worker", "ok")
    assert (done.returncode, done.stdout) == (0, "work done\n")


def test_a_failed_worker_still_exits_with_status_1():
    done = run("worker", "fail")
    assert (done.returncode, done.stdout) == (1, "work done\n")
    assert "RuntimeError: the harness failed" in done.stderr


@pytest.mark.parametrize("outcome, status", [("ok", 0), ("fail", 1)])
def test_any_other_process_keeps_its_teardown(outcome, status):
    done = run("other", outcome)
    assert (done.returncode, done.stdout) == (status, "work done\nteardown ran\n")
