"""Shared core: records and chunks, the step contract, packing, the tokenizer."""
