"""Writing outputs so that they are deterministic, evenly sharded and appear complete or not at all.

Each chunk's tables are first staged as one Arrow file per (kind, chunk, step), named by a hash
of that key in a folder per input shard, so a retried bundle rewrites the same file. Once every
chunk is staged, the rows of each kind are cut, shard by shard and chunk by chunk, into the
requested number of output files, which are written in parallel by streaming slices of the
staged files. The plan moves through the shuffle: a shard's notes are grouped, only one small
(rows, bytes) entry per shard is gathered to place the shards, and each output file's slices are
grouped by file, so no step holds a note per staged file of the run. Memory stays bounded by one
staged file, output rows and files depend only on the inputs and configuration, and
``manifest.json``, written last, marks the run complete.

The plan trusts the staging directory, not only the runner: each staged file carries its place in
the output order in its footer, so a file whose notice the runner failed to deliver is still
found in its shard's folder, counted and written (and the loss is logged).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from transforms.core.steps import Part, base_kind
from transforms.core.vocabulary import FILTERED, REJECTED
from transforms.io.formats import (
    DEDUP_INDEX,
    DOCUMENTS,
    FORMAT_KINDS,
    format_kinds,
    write_folder_indexes,
)
from transforms.io.formats.how_to_read import how_to_read
from transforms.io.input_warnings import check_strict, input_warnings
from transforms.io.manifest import (
    RowCountError,
    build_manifest,
    check_reject_fraction,
    check_rows_written,
    write_manifest,
)
from transforms.io.output_lock import check_owner
from transforms.io.tokenizer_files import write_tokenizer

LOG = logging.getLogger("beam_pipeline")
STAGING_DIR = ".staging"
PARQUET_KINDS = ("pretrain", "sft", "sft_examples", "validation/pretrain", "validation/sft",
                 "validation/sft_examples")
PHASES_NAME = "phases.json"  # with curriculum phases: their order, written once all complete
JSONL_KINDS = (REJECTED, FILTERED)
OUTPUT_KINDS = PARQUET_KINDS + JSONL_KINDS
DOCUMENT_KINDS = (DOCUMENTS, f"validation/{DOCUMENTS}")  # with --write_documents
PARTITIONED_KINDS = ("pretrain", "validation/pretrain", *DOCUMENT_KINDS)  # may hold partitions
COMPRESSION = "zstd"
# Staged files are Arrow IPC with zstd buffers: about 5x faster to write and 8x to read than
# Parquet here (no page encoding), and no larger. Only the outputs need to be Parquet.
STAGED_SUFFIX = ".arrow"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
ORDER_KEY = b"beam_pipeline.order"  # staged files' schema metadata: [chunk_id, step]
CARD_NAME = "README.md"  # the dataset card (beam_pipeline/card.py), tagged in its YAML header
CARD_TAG = "beam-llm-dataprep"
OUTPUT_WRITE_THREADS = min(os.cpu_count() or 1, 4)  # output files one worker writes at once


@dataclasses.dataclass(frozen=True)
class StagedFile:
    kind: str
    order: tuple[str, str]  # (chunk_id, step): the order rows appear in the output
    path: str
    rows: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class OutputFile:
    """One output file to write: which rows of which staged files, in order."""

    kind: str
    path: str
    slices: tuple[tuple[str, int, int], ...]  # (staged path, first row, end row)

    @property
    def rows(self) -> int:
        return sum(end - start for _, start, end in self.slices)


class Progress:
    """Logs running totals at most every ``interval`` seconds, so long runs show they move."""

    def __init__(self, what: str, interval: float = 10.0):
        self.what = what
        self.interval = interval
        self.totals: collections.Counter = collections.Counter()
        self.last = time.monotonic()

    def add(self, kind: str, rows: int) -> None:
        self.totals[kind] += rows
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            counts = ", ".join(f"{k} {v:,} rows" for k, v in sorted(self.totals.items()))
            LOG.info("%s so far in this worker: %s", self.what, counts)


def is_parquet(kind: str) -> bool:
    return base_kind(kind) in (*PARQUET_KINDS, *DOCUMENT_KINDS, DEDUP_INDEX)


def output_kinds(partitions: Sequence[str] = (), documents: bool = False,
                 dedup_index: bool = False) -> tuple[str, ...]:
    """Every kind a run may write: ``OUTPUT_KINDS``, ``DOCUMENT_KINDS`` with ``documents``,
    ``DEDUP_INDEX`` with ``dedup_index`` and, with partitions, each partition's folder under
    the kinds that hold them (``pretrain/language=en``)."""
    kinds = (OUTPUT_KINDS + (DOCUMENT_KINDS if documents else ())
             + ((DEDUP_INDEX,) if dedup_index else ()))
    return kinds + tuple(f"{kind}/{partition}" for kind in PARTITIONED_KINDS if kind in kinds
                         for partition in partitions)


def shard_of(chunk_id: str) -> str:
    """The input shard a chunk was read from: its id without the chunk number (``shard:n``).
    Tail groups and other ids without a number are their own shard."""
    return chunk_id.rpartition(":")[0] or chunk_id


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def shard_staging_dir(staging_dir: str, kind: str, shard: str) -> str:
    """Where one input shard's parts of one kind are staged: a folder each, so that the plan
    can check a shard's files against the runner's notices without listing the whole run."""
    return FileSystems.join(staging_dir, kind, _digest(shard))


def staged_path(staging_dir: str, part: Part) -> str:
    name = _digest(f"{part.chunk_id}\0{part.step}") + STAGED_SUFFIX
    return FileSystems.join(shard_staging_dir(staging_dir, part.kind, shard_of(part.chunk_id)),
                            name)


class BackgroundWriter(beam.DoFn):
    """A DoFn whose file writes run on background threads (Arrow reads, encodes and compresses
    outside the GIL) while the main thread goes on with the next element.

    At most ``limit`` writes are in flight. A bundle ends only when its writes are done, so a
    failed write fails the bundle, and nothing reads the files before their bundle ends; the
    writes a failed bundle left behind finish before the next bundle writes.
    """

    threads = 1
    limit = 2

    def setup(self) -> None:
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=type(self).__name__)
        self.pending: collections.deque[Future] = collections.deque()

    def teardown(self) -> None:
        self.pool.shutdown()

    def start_bundle(self) -> None:
        wait(self.pending)  # a failed bundle's leftovers; their errors failed it already
        self.pending.clear()

    def finish_bundle(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def write(self, function: Callable[..., None], *args: Any) -> None:
        while len(self.pending) >= self.limit:  # bounds the data held in memory
            self.pending.popleft().result()
        self.pending.append(self.pool.submit(function, *args))


class StagePart(BackgroundWriter):
    """Writes one part to its staging file; the same part always lands in the same file.

    Parts of the ``skip`` kinds are counted by their steps but not written. Files are written
    in the background while the steps fused before this one make the next part.
    """

    def __init__(self, staging_dir: str, skip: Sequence[str] = ()):
        self.staging_dir = staging_dir
        self.skip = frozenset(skip)

    def setup(self) -> None:
        super().setup()
        self.progress = Progress("staged")

    def process(self, part: Part) -> Iterator[StagedFile]:
        if part.kind in self.skip:
            return
        path = staged_path(self.staging_dir, part)
        order = json.dumps([part.chunk_id, part.step]).encode("utf-8")
        table = part.table.replace_schema_metadata({ORDER_KEY: order})
        self.write(write_arrow, path, table)
        self.progress.add(part.kind, part.table.num_rows)
        yield StagedFile(part.kind, (part.chunk_id, part.step), path, part.table.num_rows,
                         part.table.nbytes)


def write_arrow(path: str, table: pa.Table) -> None:
    """One Arrow IPC file (zstd buffers): how intermediate tables are kept on storage."""
    with FileSystems.create(path) as handle, \
            pa.ipc.new_file(handle, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)


def read_arrow(path: str) -> pa.Table:
    with FileSystems.open(path) as handle:
        return pa.ipc.open_file(pa.BufferReader(handle.read())).read_all()


def _staged_note(path: str, kind: str) -> StagedFile:
    """The note the runner failed to deliver, rebuilt from the staged file itself."""
    table = read_arrow(path)
    chunk_id, step = json.loads(table.schema.metadata[ORDER_KEY])
    return StagedFile(kind, (chunk_id, step), path, table.num_rows, table.nbytes)


@dataclasses.dataclass(frozen=True)
class ShardFiles:
    """One input shard's staged files of one kind that hold rows, in output order."""

    kind: str
    shard: str
    files: tuple[StagedFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def source_kind(kind: str) -> str:
    """The staged kind whose rows an output kind holds: its own, or an extra format's source
    (``mds/sft`` holds ``sft``'s rows; ``megatron/pretrain`` the staged documents)."""
    return FORMAT_KINDS[kind].source if kind in FORMAT_KINDS else kind


def find_staged(group: tuple[tuple[str, str], Iterable[StagedFile | None]],
                staging_dir: str) -> ShardFiles:
    """A shard's staged files for one output kind: the runner's notices (None stands for none),
    plus any file in the shard's staging folder whose notice it did not deliver (logged)."""
    (kind, shard), reported = group
    known = {f.path: f for f in reported if f is not None}
    folder = shard_staging_dir(staging_dir, source_kind(kind), shard)
    missing = [path for path in files_under(folder)
               if path.endswith(STAGED_SUFFIX) and path not in known]
    if missing:
        LOG.warning("the runner did not deliver %d of %d staged-file notices of %s; recovered "
                    "them from storage", len(missing), len(known) + len(missing), shard)
    files = [*known.values(), *(_staged_note(path, kind) for path in missing)]
    return ShardFiles(kind, shard, tuple(sorted((f for f in files if f.rows),
                                                key=lambda f: f.order)))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one shard's rows go among its kind's output files."""

    first_row: int  # the kind's rows in the shards before this one
    kind_rows: int
    files: int  # output files of the kind

    def file_of(self, row: int) -> int:
        """The output file that holds the kind's ``row``: file i holds rows
        [kind_rows * i // files, kind_rows * (i + 1) // files)."""
        return min(self.files - 1, ((row + 1) * self.files - 1) // self.kind_rows)

    def start(self, index: int) -> int:
        """The kind's first row in output file ``index``."""
        return self.kind_rows * index // self.files


def place_shards(sizes: Iterable[tuple[str, str, int, int]], num_shards: int,
                 target_bytes: int) -> Iterator[tuple[tuple[str, str], Placement]]:
    """Each (kind, shard)'s place in its kind's rows, shards in order, from (kind, shard, rows,
    bytes) of every shard: one small entry per input shard, not per staged file.

    ``num_shards`` > 0 asks for that many files per kind (fewer if there are fewer rows);
    0 picks ceil(bytes / target_bytes), at least one. Every file receives rows.
    """
    by_kind: dict[str, list[tuple[str, int, int]]] = collections.defaultdict(list)
    for kind, shard, rows, size in sizes:
        if rows:
            by_kind[kind].append((shard, rows, size))
    for kind, shards in by_kind.items():
        shards.sort()
        total_rows = sum(rows for _, rows, _ in shards)
        wanted = num_shards or math.ceil(sum(size for *_, size in shards) / target_bytes)
        count = max(1, min(wanted, total_rows))
        first = 0
        for shard, rows, _ in shards:
            yield (kind, shard), Placement(first, total_rows, count)
            first += rows


def output_path(output_dir: str, kind: str, index: int, count: int) -> str:
    if kind in FORMAT_KINDS:
        format_kind = FORMAT_KINDS[kind]
        suffix = format_kind.writer.suffix(format_kind.base)
    else:
        suffix = ".parquet" if is_parquet(kind) else ".jsonl"
    return FileSystems.join(output_dir, kind, f"part-{index:05d}-of-{count:05d}{suffix}")


def cut_shard(joined: tuple[tuple[str, str], Mapping[str, list]], output_dir: str
              ) -> Iterator[tuple[tuple[str, str], tuple[int, str, int, int]]]:
    """A shard's staged files cut at its kind's output file boundaries:
    ((kind, output path), (the kind's row it starts at, staged path, first row, end row))."""
    (kind, _), sides = joined
    if not sides["place"]:  # a shard without rows
        return
    [place], [shard] = sides["place"], sides["files"]
    start = place.first_row
    for staged_file in shard.files:
        end = start + staged_file.rows
        for index in range(place.file_of(start), place.file_of(end - 1) + 1):
            lo, hi = max(start, place.start(index)), min(end, place.start(index + 1))
            yield ((kind, output_path(output_dir, kind, index, place.files)),
                   (lo, staged_file.path, lo - start, hi - start))
        start = end


def output_file(key: tuple[str, str], pieces: Iterable[tuple[int, str, int, int]]) -> OutputFile:
    """One output file from its slices of staged files, put back in row order."""
    kind, path = key
    return OutputFile(kind, path, tuple((staged, start, end)
                                        for _, staged, start, end in sorted(pieces)))


def _read_staged(path: str) -> pa.Table:
    return read_arrow(path).replace_schema_metadata(None)


def even_row_groups(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """The rows of ``tables``, in order, regrouped into tables of exactly ``rows`` rows (the last
    may be shorter): written one per row group, so a reader can deal row groups of known size.

    Staged slices have any length; writing each as it comes would end a row group at every
    slice boundary. At most one slice plus ``rows`` rows are held at once.

    >>> parts = [pa.table({"x": list(range(n))}) for n in (3, 5, 1)]
    >>> [t.num_rows for t in even_row_groups(parts, 4)]
    [4, 4, 1]
    """
    pending: list[pa.Table] = []
    held = 0
    for table in tables:
        pending.append(table)
        held += table.num_rows
        if held < rows:
            continue
        joined = pa.concat_tables(pending)
        start = 0
        while held - start >= rows:
            yield joined.slice(start, rows).combine_chunks()
            start += rows
        pending, held = [joined.slice(start)], held - start
    if held:
        yield pa.concat_tables(pending).combine_chunks()


class WriteOutputFile(BackgroundWriter):
    """Streams the planned slices of staged files into one output file; several Parquet and
    JSONL files are written at once, in the background. An extra format's shard is written
    in the foreground, since its note carries what writing it found (tokens, index entry)."""

    threads = limit = OUTPUT_WRITE_THREADS

    def __init__(self, row_group_rows: int):
        self.row_group_rows = row_group_rows

    def process(self, plan: OutputFile, fields: Mapping | None = None) -> Iterator[dict]:
        """``fields`` (the manifest's facts) gives an extra format the vocabulary size."""
        note = {"kind": plan.kind, "path": plan.path, "rows": plan.rows}
        if plan.kind in FORMAT_KINDS:
            yield {**note, **self._write_format(plan, fields["tokenizer"]["vocab_size"])}
            return
        self.write(self._write_parquet if is_parquet(plan.kind) else self._write_jsonl, plan)
        yield note

    def _write_format(self, plan: OutputFile, vocab_size: int) -> dict:
        format_kind = FORMAT_KINDS[plan.kind]
        written = format_kind.writer.write(plan.path, format_kind.base, self._slices(plan),
                                           plan.rows, format_kind.columns, vocab_size)
        return {"tokens": written.tokens, **({"entry": written.entry} if written.entry else {})}

    def _slices(self, plan: OutputFile) -> Iterator[pa.Table]:
        for path, start, end in plan.slices:
            yield _read_staged(path).slice(start, end - start)

    def _write_parquet(self, plan: OutputFile) -> None:
        with FileSystems.create(plan.path) as handle:
            writer = None
            for group in even_row_groups(self._slices(plan), self.row_group_rows):
                if writer is None:
                    writer = pq.ParquetWriter(handle, group.schema, compression=COMPRESSION)
                writer.write_table(group, row_group_size=self.row_group_rows)
            writer.close()

    def _write_jsonl(self, plan: OutputFile) -> None:
        with FileSystems.create(plan.path) as handle:
            for table in self._slices(plan):
                for row in table.to_pylist():
                    handle.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")


def stored_paths(path: str) -> list[str]:
    """What deleting ``path`` means: the path itself if it exists (a file, a local directory),
    else the objects under it, because on gs:// a directory is only a name prefix that
    FileSystems.exists does not see and FileSystems.delete does not remove."""
    if FileSystems.exists(path):
        return [path]
    return files_under(path)


def files_under(path: str) -> list[str]:
    return [m.path for m in FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list]


class WriteOutputs(beam.PTransform):
    """Staged files, stats and the names of the shards that may have staged files (``shard_of``
    their chunk ids) in; sharded output files and, last of all, manifest.json out."""

    def __init__(self, output_dir: str, num_shards: int, target_shard_mb: int,
                 row_group_rows: int, manifest_fields: dict, formats: Sequence[str] = (),
                 kinds: Sequence[str] = OUTPUT_KINDS):
        super().__init__()
        self.output_dir = output_dir
        # each staged kind -> the output kinds that hold its rows
        self.readers: dict[str, list[str]] = collections.defaultdict(list)
        for kind in kinds:  # partition folders included (pretrain/language=en)
            self.readers[kind].append(kind)
        for format_kind in format_kinds(formats):
            self.readers[format_kind.source].append(format_kind.kind)
        self.num_shards = num_shards
        self.target_bytes = target_shard_mb * 1024 * 1024
        self.row_group_rows = row_group_rows
        self.manifest_fields = manifest_fields

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection, beam.PCollection]
               ) -> beam.PCollection:
        staged, stats, shard_names = inputs
        staging_dir = FileSystems.join(self.output_dir, STAGING_DIR)
        # Planned a shard at a time: what any one step holds is one input shard's notes, one
        # output file's slices, or one (kind, shard, rows, bytes) per input shard. Every shard
        # and kind is looked at, so files whose notices were all lost are still found.
        kinds = [kind for readers in self.readers.values() for kind in readers]
        every_shard = shard_names | "EveryKind" >> beam.FlatMap(
            lambda shard: (((kind, shard), None) for kind in kinds))
        readers = dict(self.readers)
        notes = staged | "ByShard" >> beam.FlatMap(
            lambda f: (((kind, shard_of(f.order[0])), f) for kind in readers.get(f.kind, ())))
        shards = (
            (notes, every_shard)
            | "NotesAndShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "FindStaged" >> beam.Map(find_staged, staging_dir)
            | "KeyByShard" >> beam.Map(lambda shard: ((shard.kind, shard.shard), shard)))
        places = (
            shards
            | "ShardSizes" >> beam.FlatMapTuple(
                lambda key, shard: [(*key, shard.rows, shard.bytes)] if shard.rows else [])
            | "CollectShardSizes" >> beam.combiners.ToList()
            | "PlaceShards" >> beam.FlatMap(place_shards, self.num_shards, self.target_bytes))
        written = (
            {"files": shards, "place": places}
            | "JoinPlaces" >> beam.CoGroupByKey()
            | "CutShards" >> beam.FlatMap(cut_shard, self.output_dir)
            | "ByOutputFile" >> beam.GroupByKey()
            | "PlanFiles" >> beam.MapTuple(output_file)
            | "WriteFiles" >> beam.ParDo(WriteOutputFile(self.row_group_rows),
                                         self.manifest_fields)
            | "CollectWritten" >> beam.combiners.ToList()
        )
        return written | "WriteManifest" >> beam.Map(
            _finish, beam.pvalue.AsSingleton(stats), self.output_dir, staging_dir,
            self.manifest_fields)


def _finish(files: list[dict], stats: dict, output_dir: str, staging_dir: str,
            fields: dict) -> str:
    leftovers = stored_paths(staging_dir)
    if leftovers:
        FileSystems.delete(leftovers)
    manifest = build_manifest(stats, files, fields["config"], fields["tokenizer"],
                              fields.get("eval_texts"), fields.get("input_files"))
    check_rows_written(manifest)
    check_reject_fraction(manifest, fields["config"]["max_reject_fraction"], stats)
    manifest["warnings"] = input_warnings(manifest)
    check_strict(manifest, fields["config"].get("strict", False))
    check_files_hold_rows(files)
    written = fields["config"]["output_format"]
    manifest["formats"] = {"written": list(written),
                           "index_files": write_folder_indexes(files, output_dir),
                           "how_to_read": how_to_read(manifest["outputs"], written,
                                                      manifest["instruction"]["seq_len"])}
    if "run" in fields:  # the last check before publishing: does this run still own the folder?
        check_owner(fields["run"]["output"], fields["run"]["run_id"])
    config = fields["config"]
    manifest["tokenizer_files"] = write_tokenizer(config["tokenizer"],
                                                  config["instruction"]["chat_template"],
                                                  output_dir)
    return write_manifest(output_dir, manifest)


def file_rows(path: str, kind: str) -> int:
    """The rows an output file holds, from its Parquet footer, its lines or its format's
    header."""
    if kind in FORMAT_KINDS:
        return FORMAT_KINDS[kind].writer.rows(path)
    with FileSystems.open(path) as handle:
        if is_parquet(kind):
            return pq.ParquetFile(handle).metadata.num_rows
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


def check_files_hold_rows(files: Iterable[Mapping]) -> None:
    """Refuses to publish unless every output file exists and holds the rows it is listed with:
    the manifest is the mark of a complete run, so it never lists a file that is missing,
    empty or cut short (another writer, a lost upload)."""
    wrong = []
    for entry in files:
        try:
            rows = file_rows(entry["path"], entry["kind"])
        except (OSError, ValueError, pa.ArrowInvalid) as error:
            wrong.append(f"{entry['path']}: {error}")
            continue
        if rows != entry["rows"]:
            wrong.append(f"{entry['path']}: {rows:,} rows, {entry['rows']:,} written")
    if wrong:
        raise RowCountError("output files are not as written (" + "; ".join(wrong[:5]) +
                            "); the run is not marked complete (no manifest.json)")
