"""The shape every chunk-level step shares: results, dropped records and counters.

A step turns one ``RecordChunk`` into its main result(s). Records it cannot or should not carry
on become ``Rejection``s; they leave as one Arrow table per chunk and step (tag ``parts``) so
that rejected/ and filtered/ files are as deterministic as the data files. Counters leave as a
``Counter`` per chunk (tag ``stats``); the manifest is their sum, and the same figures are
reported as Beam metrics. A few steps also keep samples (what decontamination removed) for the
manifest; they travel in the same stream under the ``samples`` key.

A chunk bound for the validation split carries ``VALIDATION_MARK`` at the end of its id: the
same steps process it, its rows go to ``validation/<kind>`` and its counters are reported under
``validation.``, and its leftovers are never joined with the training split's.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pickle
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms.core.chunks import Chunk
from transforms.core.records import Rejection
from transforms.core.vocabulary import REJECTED

PARTS = "parts"
STATS = "stats"
TAILS = "tails"
SAMPLES = "samples"
# Per-file counters, keyed (input index, file path): summed into the manifest like the others
# but never reported as Beam metrics, whose names would grow with the number of files.
FILE_STATS = "files"
# Per-domain counters of knowledge documents with a URL, kept out of Beam metrics for the same
# reason; only the top domains reach the manifest (``KeepTopDomains``).
DOMAIN_STATS = "domains"
METRICS_NAMESPACE = "beam_pipeline"
VALIDATION = "validation"
VALIDATION_MARK = "|" + VALIDATION

REJECTED_SCHEMA = pa.schema([
    ("source", pa.string()),
    ("position", pa.int64()),
    ("reason", pa.string()),
    ("message", pa.string()),
    ("raw", pa.string()),
])


@dataclasses.dataclass(frozen=True)
class Part(Chunk):
    """A table bound for one output kind (pretrain, sft, rejected, filtered)."""

    kind: str
    chunk_id: str
    step: str
    table: pa.Table


def validation_id(chunk_id: str) -> str:
    return chunk_id + VALIDATION_MARK


def is_validation(chunk_id: str) -> bool:
    return chunk_id.endswith(VALIDATION_MARK)


# A Hive-style partition (``language=en``): a folder of its own under an output kind. A chunk
# bound for one carries it in its id, before any validation mark.
PARTITION = re.compile(r"[a-z_]+=[a-z0-9_-]+")


def partitioned_id(chunk_id: str, partition: str) -> str:
    """``chunk_id`` for the rows of one partition: ``shard:n|language=en[|validation]``."""
    base = chunk_id.removesuffix(VALIDATION_MARK)
    return f"{base}|{partition}{chunk_id[len(base):]}"


def partition_of(chunk_id: str) -> str | None:
    """The partition a chunk's rows go to, or None."""
    _, bar, last = chunk_id.removesuffix(VALIDATION_MARK).rpartition("|")
    return last if bar and PARTITION.fullmatch(last) else None


def output_kind(kind: str, chunk_id: str) -> str:
    """Where a chunk's rows of ``kind`` go: ``kind`` itself or ``validation/kind``, and under
    it the chunk's partition folder, if any (``pretrain/language=en``)."""
    kind = f"{VALIDATION}/{kind}" if is_validation(chunk_id) else kind
    partition = partition_of(chunk_id)
    return kind if partition is None else f"{kind}/{partition}"


def base_kind(kind: str) -> str:
    """The output kind without its partition folder: ``pretrain/language=en`` -> ``pretrain``."""
    head, _, last = kind.rpartition("/")
    return head if head and PARTITION.fullmatch(last) else kind


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
    """Base class: subclasses implement ``run`` and call ``drop``/``count`` while they work.

    The values of the step's side inputs (``apply_step``) are passed on to ``run`` with each
    chunk: what a step reads per chunk is state of the call, not of the step, which a runner
    reuses across bundles.
    """

    step_name = "step"
    chunk_tags: tuple[str, ...] = ()  # extra outputs that are chunks too (see apply_step)

    # ``side_inputs`` has no hint: Beam would check one against a step applied without any.
    def process(self, chunk: Any, *side_inputs) -> Iterator[Any]:
        self._dropped: dict[str, list[Rejection]] = collections.defaultdict(list)
        self._stats: collections.Counter = collections.Counter()
        self._samples: dict[str, list] = collections.defaultdict(list)
        self._domains: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        chunk_id = chunk.chunk_id
        self._prefix = f"{VALIDATION}." if is_validation(chunk_id) else ""
        yield from self.run(chunk, *side_inputs)
        files: dict[tuple[int, str], collections.Counter] = collections.defaultdict(
            collections.Counter)
        for kind, rejections in sorted(self._dropped.items()):
            for rejection in rejections:
                self._stats[f"{kind}.{rejection.reason}"] += 1
                self._stats[f"input.{rejection.input_index}.{kind}.{rejection.reason}"] += 1
                files[rejection.input_index, rejection.source][f"{kind}.{rejection.reason}"] += 1
            yield beam.pvalue.TaggedOutput(
                PARTS, Part(kind, chunk_id, self.step_name, rejections_table(rejections)))
        for name, value in self._stats.items():
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, name).inc(value)
        if self._samples:
            self._stats[SAMPLES] = dict(self._samples)
        if files:
            self._stats[FILE_STATS] = dict(files)
        if self._domains:
            self._stats[DOMAIN_STATS] = dict(self._domains)
        if self._stats:
            yield beam.pvalue.TaggedOutput(STATS, self._stats)

    def run(self, chunk: Any, *side_inputs: Any) -> Iterator[Any]:
        raise NotImplementedError

    def drop(self, rejection: Rejection, kind: str = REJECTED) -> None:
        """Takes a record out of the pipeline: ``rejected`` (bad input) or ``filtered`` (policy)."""
        self._dropped[kind].append(rejection)

    def count(self, name: str, value: int = 1) -> None:
        """Adds to a counter; a validation chunk's counters are kept apart (``validation.``)."""
        self._stats[self._prefix + name] += value

    def count_domain(self, domain: str, name: str, value: int = 1) -> None:
        """Adds to a per-domain counter (``DOMAIN_STATS``), never a Beam metric."""
        self._domains[domain][name] += value

    def sample(self, name: str, sample: dict) -> None:
        """Keeps an example for the manifest, which lists the first few by (source, position)."""
        self._samples[name].append(sample)

    def distribution(self, name: str, values: Iterable[int]) -> None:
        """Reports values to a Beam distribution (count, sum, min and max in the runner's UI)."""
        metric = beam.metrics.Metrics.distribution(METRICS_NAMESPACE, name)
        for value in values:
            metric.update(int(value))


@dataclasses.dataclass(frozen=True)
class Started:
    """A chunk and the handle of the work an ``OverlappedStep`` started on it."""

    chunk: Any
    handle: Any

    @property
    def chunk_id(self) -> str:
        return self.chunk.chunk_id


class OverlappedStep(ChunkStep):
    """A step whose heavy work runs in threads that release the GIL (a tokenizer's native
    code) while the steps fused before it prepare the next chunk on the main thread.

    ``start(chunk)`` begins the work and returns a handle; ``run`` gets a ``Started`` with that
    handle one element later, or at the end of the bundle for its last chunk. So a runner that
    runs a stage on one thread (the DirectRunner's ``in_memory`` mode) still uses two cores.
    Only the moment of output changes, never the rows, and at most one chunk waits.
    """

    def start(self, chunk: Any) -> Any:
        raise NotImplementedError

    def start_bundle(self) -> None:
        self._started: Started | None = None

    def process(self, chunk: Any) -> Iterator[Any]:
        started, self._started = self._started, Started(chunk, self.start(chunk))
        if started is not None:
            yield from super().process(started)

    def finish_bundle(self) -> Iterator[Any]:
        started, self._started = self._started, None
        if started is not None:
            for output in super().process(started):
                yield in_global_window(output)


def in_global_window(output: Any) -> Any:
    """An output of ``finish_bundle``, which Beam wants windowed (all our data is global)."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
    return GlobalWindows.windowed_value(output)


class StepOutput(NamedTuple):
    """What a chunk step gives the graph: the chunks that go on (``main``), the parts to stage
    (output rows and dropped records), its counters, and any extra tagged outputs.

    A named tuple, so that Beam records these as the outputs of a composite that returns it
    (and the rendered graph draws its edges)."""

    main: beam.PCollection
    parts: beam.PCollection
    stats: beam.PCollection
    tagged: Mapping[str, beam.PCollection] = MappingProxyType({})

    def __getitem__(self, tag: str | int | slice) -> Any:  # an int index as for any tuple
        if isinstance(tag, int | slice):
            return tuple.__getitem__(self, tag)
        return {PARTS: self.parts, STATS: self.stats, **self.tagged}[tag]


class BranchOutput(NamedTuple):
    """What a branch gives the graph: every step's parts, kept apart so that each is staged
    where it is made, and all its counters."""

    parts: tuple[beam.PCollection, ...]
    stats: beam.PCollection


def apply_step(pcoll: beam.PCollection, label: str, step: ChunkStep, *tags: str,
               side_inputs: Sequence[beam.pvalue.AsSideInput] = ()) -> StepOutput:
    """Applies a step and returns its outputs (``main``, parts, stats and the extra ``tags``).

    The main output and ``parts`` are typed ``Chunk``, and so are the tags in the step's
    ``chunk_tags``: Beam then codes them with ``ChunkCoder``.
    """
    hints = {tag: Chunk if tag in step.chunk_tags else Any for tag in tags}
    outputs = pcoll | label >> beam.ParDo(step, *side_inputs).with_output_types(
        Chunk, **{PARTS: Chunk, STATS: Any}, **hints).with_outputs(PARTS, STATS, *tags,
                                                                   main="main")
    return StepOutput(outputs.main, outputs[PARTS], outputs[STATS],
                      {tag: outputs[tag] for tag in tags})


class StepChain:
    """A branch's steps in order, each applied to the chunks the one before lets through;
    every step's parts and stats are collected for ``BranchOutput``."""

    def __init__(self, chunks: beam.PCollection) -> None:
        self.main = chunks
        self.outputs: list[StepOutput] = []

    def then(self, label: str, step: ChunkStep, *tags: str,
             side_inputs: Sequence[beam.pvalue.AsSideInput] = ()) -> StepOutput:
        """Applies ``step`` to the chunks that went through so far."""
        return self.add(apply_step(self.main, label, step, *tags, side_inputs=side_inputs))

    def map(self, label: str, transform: beam.PTransform) -> beam.PCollection:
        """Applies a transform that only rewrites the chunks (no parts, no counters)."""
        self.main = self.main | label >> transform
        return self.main

    def add(self, output: StepOutput) -> StepOutput:
        """Adds a step applied by the caller (a composite step, or one on other chunks)."""
        self.outputs.append(output)
        self.main = output.main
        return output

    def output(self, label: str, *more_stats: beam.PCollection) -> BranchOutput:
        parts = tuple(output.parts for output in self.outputs)
        stats = ((*(output.stats for output in self.outputs), *more_stats)
                 | label >> beam.Flatten())
        return BranchOutput(parts, stats)


@dataclasses.dataclass(frozen=True)
class TailGroup(Chunk):
    """Leftovers of several chunks (block tails, under-filled packs), in chunk order."""

    chunk_id: str
    items: tuple


@dataclasses.dataclass(frozen=True)
class TailPlan:
    """How a branch gathers its chunks' leftovers: into ``buckets`` groups, through files in
    ``spill_dir`` (one directory per branch: both branches may leave leftovers of one chunk)."""

    buckets: int
    spill_dir: str


def tail_bucket(chunk_id: str, buckets: int) -> int:
    """A stable bucket for a chunk's leftovers (hashlib, so every process agrees)."""
    digest = hashlib.sha256(chunk_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def tail_group_id(bucket: int, validation: bool, partition: str | None = None) -> str:
    """The chunk id of a bucket's ``TailGroup``: after every input chunk in output order."""
    group = f"~tails-{bucket:05d}{VALIDATION_MARK if validation else ''}"
    return group if partition is None else partitioned_id(group, partition)


def tail_group_ids(buckets: int, partitions: Sequence[str] = ()) -> list[str]:
    """Every chunk id ``GatherTails`` may give its groups."""
    return [tail_group_id(bucket, validation, partition) for bucket in range(buckets)
            for validation in (False, True) for partition in (None, *partitions)]


def spill_tail(tail: tuple[str, Any], spill_dir: str) -> tuple[str, str]:
    """Writes a chunk's leftover to a file named by its chunk id; (chunk id, path) out. A
    retried bundle writes the same file again."""
    chunk_id, leftover = tail
    name = hashlib.sha256(chunk_id.encode("utf-8")).hexdigest()[:24]
    path = FileSystems.join(spill_dir, f"{name}.pickle")
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        pickle.dump(leftover, f, protocol=pickle.HIGHEST_PROTOCOL)
    return chunk_id, path


def read_tail(path: str) -> Any:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return pickle.load(f)


class GatherTails(beam.PTransform):
    """Groups ``(chunk_id, leftover)`` pairs into a bounded number of ordered ``TailGroup``s.

    Only leftovers move (at most a block or a few packs per chunk), and they move through
    files: the shuffle carries each chunk's path, and a group's files are read when it is
    formed. The DirectRunner holds a shuffle's whole input in memory, and the leftovers of all
    chunks grow with the dataset (with them in the shuffle, a 48-copy instruction run peaked
    380 MB above a 12-copy one); a group holds about ``SHARDS_PER_TAIL_BUCKET`` shards'
    leftovers. Sorting by chunk id inside each group keeps the result independent of arrival
    order. Leftovers of the validation split and of each partition are grouped apart.
    """

    def __init__(self, plan: TailPlan):
        super().__init__()
        self.plan = plan

    def expand(self, tails: beam.PCollection) -> beam.PCollection:
        buckets = self.plan.buckets
        return (
            tails
            | "Spill" >> beam.Map(spill_tail, self.plan.spill_dir)
            | "Bucket" >> beam.Map(lambda note: (
                (tail_bucket(note[0], buckets), is_validation(note[0]), partition_of(note[0])),
                note))
            | "Group" >> beam.GroupByKey()
            | "Order" >> beam.MapTuple(lambda key, group: TailGroup(
                tail_group_id(*key), tuple(read_tail(path) for _, path in sorted(group)))))
