"""How chunks (thousands of records in one element) travel between Beam steps.

Beam samples the size of elements on every step's output for its metrics, and by default it
measures an element by encoding it: for a chunk that is a whole pickling of the chunk, about 8%
of an instruction run on the DirectRunner. Steps declare their chunk outputs as ``Chunk``, whose
coder pickles as Beam's default does but estimates size from a few of a chunk's items.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import apache_beam as beam
import pyarrow as pa

SIZE_SAMPLE = 8  # items pickled to estimate a sequence's size


class Chunk:
    """Base of the dataclasses that carry a chunk of records, or a table, between steps; each
    subclass is coded by ``ChunkCoder``."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        beam.coders.registry.register_coder(cls, ChunkCoder)


def estimated_size(value: Any) -> int:
    """About the pickled size of ``value``: Arrow tables by their buffers, tuples and lists
    from ``SIZE_SAMPLE`` evenly spaced items, anything else by pickling it."""
    if isinstance(value, pa.Table):
        return value.nbytes
    if isinstance(value, (tuple, list)) and len(value) > SIZE_SAMPLE:
        step = len(value) / SIZE_SAMPLE
        sample = [value[int(k * step)] for k in range(SIZE_SAMPLE)]
        return len(pickle.dumps(sample, pickle.HIGHEST_PROTOCOL)) * len(value) // SIZE_SAMPLE
    return len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))


class ChunkCoder(beam.coders.Coder):
    """Pickles like Beam's default coder; estimates a chunk's size field by field."""

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Any:
        return pickle.loads(encoded)

    def estimate_size(self, value: Any) -> int:
        if not dataclasses.is_dataclass(value):
            return len(self.encode(value))
        return sum(estimated_size(getattr(value, field.name))
                   for field in dataclasses.fields(value))

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return Chunk

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


beam.coders.registry.register_coder(Chunk, ChunkCoder)
