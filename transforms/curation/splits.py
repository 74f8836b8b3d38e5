"""The validation split: a deterministic, content-hashed holdout per branch.

A record goes to validation when the seeded hash of what it trains (a document's tokens; an
example's tokens and labels) falls below a threshold: a fraction of the hash range
(``--knowledge_validation=0.01``), or the hash of the N-th smallest record of the branch
(``=500``), found by a pass over the records' hashes only. It runs after tokenization, so two
records that become the same example (two conversations truncated to the same turns) land on the
same side: validation never holds a row that training also holds. The split does not depend on
order, runner or workers. A chunk's held-out records leave as a second chunk
whose id carries ``VALIDATION_MARK``: it goes through the same steps as training chunks, and its
rows into ``validation/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np

from transforms.core.steps import VALIDATION, ChunkStep, StepOutput, apply_step, validation_id

HASH_SPACE = 1 << 64


def content_digest(content: str | bytes, salt: str) -> int:
    """A 64-bit hash of ``content`` under ``salt`` (the seed and the purpose)."""
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(content, digest_size=8, key=salt.encode("utf-8")[:64])
    return int.from_bytes(digest.digest(), "big")


def split_salt(seed: int) -> str:
    return f"validation:{seed}"


class SplitValidation(ChunkStep):
    """Splits each chunk into its training records and, under a marked id, its held-out ones.

    The threshold is fixed (a fraction) or comes as a side input (a count); records whose
    digest is below it are held out. The held-out chunk's ``counts()`` are reported under
    ``validation.``, so the manifest can tell the two splits apart.
    """

    step_name = "split"

    def __init__(self, seed: int, fraction: float | None = None):
        self.salt = split_salt(seed)
        self.threshold = None if fraction is None else int(fraction * HASH_SPACE)

    def process(self, chunk: Any, threshold: int | None = None) -> Iterator[Any]:
        if threshold is not None:
            self.threshold = threshold
        yield from super().process(chunk)

    def run(self, chunk: Any) -> Iterator[Any]:
        digests = chunk.record_digests(self.salt)
        if self.threshold > 0:
            held = digests <= np.uint64(min(self.threshold, HASH_SPACE) - 1)
        else:
            held = np.zeros(len(digests), dtype=bool)
        if not held.all():
            yield chunk.take(np.flatnonzero(~held).tolist())
        if held.any():
            held_out = chunk.take(np.flatnonzero(held).tolist())
            for name, value in held_out.counts().items():
                self.count(f"{VALIDATION}.{name}", value)
            yield dataclasses.replace(held_out, chunk_id=validation_id(chunk.chunk_id))


def _digests(chunk: Any, salt: str) -> list[int]:
    return chunk.record_digests(salt).tolist()


class SplitOff(beam.PTransform):
    """Encoded chunks in; training and validation chunks (main), parts and stats out.

    ``size`` < 1 is a fraction of the branch's records; >= 1 a count, which needs one pass over
    the records' digests (``beam.combiners.Top.Smallest``) before the split.
    """

    def __init__(self, size: float, seed: int):
        super().__init__()
        self.size = size
        self.seed = seed

    def expand(self, chunks: beam.PCollection) -> StepOutput:
        if self.size < 1:
            return apply_step(chunks, "Split", SplitValidation(self.seed, fraction=self.size))
        count = int(self.size)
        threshold = (
            chunks
            | "Digests" >> beam.FlatMap(_digests, split_salt(self.seed))
            | "Smallest" >> beam.combiners.Top.Smallest(count)
            | "Threshold" >> beam.Map(
                lambda smallest: smallest[-1] + 1 if len(smallest) == count else HASH_SPACE))
        return apply_step(chunks, "Split", SplitValidation(self.seed),
                          side_inputs=[beam.pvalue.AsSingleton(threshold)])
