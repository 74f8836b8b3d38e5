"""The instruction branch: adapt, validate, render with the chat template, mask, pack."""
