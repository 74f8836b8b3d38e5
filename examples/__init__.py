"""Worked training examples over the pipeline's outputs: ``python -m examples.NAME``."""
