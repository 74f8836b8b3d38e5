"""The knowledge branch: normalise, filter, deduplicate, tokenize, cut blocks."""
