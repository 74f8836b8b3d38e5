"""The shape every chunk-level step shares: results, dropped records and counters.

A step turns one ``RecordChunk`` into its main result(s). Records it cannot or should not carry
on become ``Rejection``s; they leave as one Arrow table per chunk and step (tag ``parts``) so
that rejected/ and filtered/ files are as deterministic as the data files. Counters leave as a
``Counter`` per chunk (tag ``stats``); the manifest is their sum, and the same figures are
reported as Beam metrics.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa

from transforms.records import Rejection

PARTS = "parts"
STATS = "stats"
TAILS = "tails"
METRICS_NAMESPACE = "beam_pipeline"

REJECTED_SCHEMA = pa.schema([
    ("source", pa.string()),
    ("position", pa.int64()),
    ("reason", pa.string()),
    ("message", pa.string()),
    ("raw", pa.string()),
])


@dataclasses.dataclass(frozen=True)
class Part:
    """A table bound for one output kind (pretrain, sft, rejected, filtered)."""

    kind: str
    chunk_id: str
    step: str
    table: pa.Table


def rejections_table(rejections: Iterable[Rejection]) -> pa.Table:
    rows = list(rejections)
    return pa.table({
        "source": [r.source for r in rows],
        "position": [r.position for r in rows],
        "reason": [r.reason for r in rows],
        "message": [r.message for r in rows],
        "raw": [r.raw for r in rows],
    }, schema=REJECTED_SCHEMA)


class ChunkStep(beam.DoFn):
    """Base class: subclasses implement ``run`` and call ``drop``/``count`` while they work."""

    step_name = "step"

    def process(self, chunk: Any) -> Iterator[Any]:
        self._dropped: dict[str, list[Rejection]] = collections.defaultdict(list)
        self._stats: collections.Counter = collections.Counter()
        yield from self.run(chunk)
        chunk_id = chunk.chunk_id
        for kind, rejections in sorted(self._dropped.items()):
            for rejection in rejections:
                self._stats[f"{kind}.{rejection.reason}"] += 1
                self._stats[f"input.{rejection.input_index}.{kind}.{rejection.reason}"] += 1
            yield beam.pvalue.TaggedOutput(
                PARTS, Part(kind, chunk_id, self.step_name, rejections_table(rejections)))
        for name, value in self._stats.items():
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, name).inc(value)
        if self._stats:
            yield beam.pvalue.TaggedOutput(STATS, self._stats)

    def run(self, chunk: Any) -> Iterator[Any]:
        raise NotImplementedError

    def drop(self, rejection: Rejection, kind: str = "rejected") -> None:
        """Takes a record out of the pipeline: ``rejected`` (bad input) or ``filtered`` (policy)."""
        self._dropped[kind].append(rejection)

    def count(self, name: str, value: int = 1) -> None:
        self._stats[name] += value

    def distribution(self, name: str, values: Iterable[int]) -> None:
        """Reports values to a Beam distribution (count, sum, min and max in the runner's UI)."""
        metric = beam.metrics.Metrics.distribution(METRICS_NAMESPACE, name)
        for value in values:
            metric.update(int(value))


def apply_step(pcoll: beam.PCollection, label: str, step: ChunkStep, *tags: str):
    """Applies a step and returns its tagged outputs (``main`` plus any extra tags)."""
    return pcoll | label >> beam.ParDo(step).with_outputs(PARTS, STATS, *tags, main="main")


@dataclasses.dataclass(frozen=True)
class TailGroup:
    """Leftovers of several chunks (block tails, under-filled packs), in chunk order."""

    chunk_id: str
    items: tuple


def tail_bucket(chunk_id: str, buckets: int) -> int:
    """A stable bucket for a chunk's leftovers (hashlib, so every process agrees)."""
    digest = hashlib.sha256(chunk_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


class GatherTails(beam.PTransform):
    """Groups ``(chunk_id, leftover)`` pairs into a bounded number of ordered ``TailGroup``s.

    Only leftovers move (at most a block or a few packs per chunk), so this shuffle stays small;
    sorting by chunk id inside each group keeps the result independent of arrival order.
    """

    def __init__(self, buckets: int):
        super().__init__()
        self.buckets = buckets

    def expand(self, tails):
        buckets = self.buckets
        return (
            tails
            | "Bucket" >> beam.Map(lambda tail: (tail_bucket(tail[0], buckets), tail))
            | "Group" >> beam.GroupByKey()
            | "Order" >> beam.MapTuple(lambda bucket, group: TailGroup(
                f"~tails-{bucket:05d}", tuple(item for _, item in sorted(
                    group, key=lambda tail: tail[0])))))
