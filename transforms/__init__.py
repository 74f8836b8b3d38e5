"""Reusable PTransforms and the pure functions behind them, one module per concern."""

import os

# transformers prints "PyTorch was not found" when imported; the pipeline only tokenizes and
# never needs torch. Set before any module here imports transformers; the user's value wins.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
