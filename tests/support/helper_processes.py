"""Checks shared by the tests of work sent to helper processes (``transforms.core.helpers``)."""

import json
import subprocess
import sys

from tests.conftest import ROOT
from transforms.core import helpers

HEAVY = ("apache_beam", "pyarrow", "transformers")


def heavy_modules_loaded_by(module: str) -> list[str]:
    """The modules of ``HEAVY`` that importing ``module`` loads in a fresh interpreter: what a
    helper pays before its first batch."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import json, sys, {module}; print(json.dumps(sorted("
         f"m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"],
        cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(loaded.stdout)


def send_every_batch_to_helpers(monkeypatch, kind: type) -> list[int]:
    """From now on every batch goes to fresh helpers; the returned list receives the size of
    each batch whose function is a ``kind``, so a test can tell that the work left the
    process."""
    monkeypatch.setattr(helpers, "MIN_CHARS", 0)
    batches: list[int] = []
    start_split = helpers.start_split

    def recorded(function, items, chars):
        if isinstance(function, kind):
            batches.append(len(items))
        return start_split(function, items, chars)

    monkeypatch.setattr(helpers, "start_split", recorded)
    helpers.close_helpers()
    return batches
