"""Reusable PTransforms and the pure functions behind them, one module per concern."""
