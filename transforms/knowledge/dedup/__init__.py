"""Deduplication across the whole dataset: exact copies and near copies (MinHash + LSH).

Only small keys are shuffled, never the documents (README, "Determinism and memory": on the
DirectRunner a shuffle holds all its data in memory). Pass one turns every kept document into
``DocumentKeys``: its node (record key, chunk and a hash of its normalised text) and, for
near-duplicate detection, a MinHash signature and its LSH band keys. ``FindDuplicates`` groups
those keys, verifies candidate pairs by their estimated Jaccard similarity and joins copies into
clusters by label propagation over the shuffle (``ConnectedComponents``), one decision per
document to drop. The decisions are grouped by chunk and written to one small file per chunk
(``write_decisions``); the main pass's ``DropDuplicates`` reads its own chunk's file. Nothing
that grows with the documents or the duplicates is held on one worker or sent to every worker
(docs/dedup.md).

The surviving copy is always the one with the smallest record key (input index, source,
position), whatever the runner, worker count or bundle boundaries.

``minhash``: the document keys; ``components``: the shuffle that finds and resolves copies;
``decisions``: the per-chunk decision files, which also tell each survivor its copies;
``paragraphs``: boilerplate shared across documents, found from pass one's paragraph hashes and
removed through the same files; ``first_pass``: pass one's read of the inputs and its keys;
``config``: the options.
"""
