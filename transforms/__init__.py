"""Reusable PTransforms and the pure functions behind them, one module per concern."""

import os
import sys

from transforms.core import worker_exit

# transformers prints "PyTorch was not found" when imported; the pipeline only tokenizes and
# never needs torch. Set before any module here imports transformers; the user's value wins.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Beam's worker processes unpickle the DoFns defined here, so they all import this package.
worker_exit.install()
# Beam introspects DoFns and parses options again on every use; answered once (beam_caches.py).
# Only where Beam is loaded already, as in its workers: the training loader imports this package
# without Beam. The launcher installs them itself when it builds the graph.
if "apache_beam" in sys.modules:
    from transforms.core import beam_caches

    beam_caches.install()
