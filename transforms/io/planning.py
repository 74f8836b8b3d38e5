"""Planning the read: ``--input`` patterns into a fixed list of shards, from glob expansion alone,
so that every runner sees the same records in the same order.

Reading happens in two steps. ``plan_inputs`` runs once, when the graph is built, from glob
expansion alone: it cuts files into a fixed list of ``ShardSpec``s (byte ranges or whole files),
and ``split_shard`` cuts a Parquet file into row-group ranges inside the job (``plan_shards`` does
both at once, for callers that read outside a pipeline). ``read_formats.read_shard`` then streams
each shard. Declared field mappings are checked here too, on the first records of each input,
so that a wrong mapping fails the job before any work starts.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.core.fields import apply_field_map
from transforms.core.records import InputSpec, Record, RecordChunk, ShardSpec
from transforms.io.compression import (
    FORMAT_BY_EXTENSION,
    READ_ERRORS,
    compression_suffix,
    file_format,
    uncompressed_name,
)
from transforms.io.read_formats import read_shard

DEFAULT_TARGET_SHARD_BYTES = 64 << 20
# One compressed file above this size keeps one worker busy for long (tens of minutes): the
# planner advises splitting it, pointing at INPUTS_DOC.
LARGE_COMPRESSED_BYTES = 2 << 30
INPUTS_DOC = "docs/inputs-at-scale.md"
MAPPING_CHECK_RECORDS = 20  # first records of an input on which declared fields must appear
MAPPING_CHECK_MAX_JSON_BYTES = 64 << 20  # a JSON array is parsed whole; larger ones go unchecked
GLOB_CHARACTERS = re.compile(r"[*?\[]")

# Why a file an input could reach is not read (``inputs[i].skipped`` in the manifest). The first
# four apply to files found in a directory input; the rest to any local file.
HIDDEN = "hidden"  # a name starting with '.', or under such a folder (which counts once)
README_OR_LICENSE = "readme_or_license"  # README*, LICENSE*, LICENCE*: about the data, not data
UNKNOWN_EXTENSION = "unknown_extension"  # the extension names no format, and none is declared
NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO (reading it waits forever), socket, device
BROKEN_LINK = "broken_link"  # a symbolic link to nothing (or to itself)
UNREADABLE = "unreadable"  # a folder that cannot be listed or a file that cannot be looked at
SAME_FILE = "same_file"  # reached before under another path (a link): read once
SKIPPED_EXAMPLES = 3  # paths kept per reason in the manifest
_DOCUMENTATION = ("README", "LICENSE", "LICENCE")


@dataclasses.dataclass
class Skipped:
    """The files one input passed over: how many per reason, and the first few paths of each."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))

    def add(self, reason: str, path: str) -> None:
        self.counts[reason] += 1
        if len(self.examples[reason]) < SKIPPED_EXAMPLES:
            # A name that is not UTF-8 cannot go into JSON as it is: its bytes are shown escaped.
            self.examples[reason].append(
                path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))

    def facts(self) -> dict:
        return {"skipped": dict(sorted(self.counts.items())),
                "skipped_examples": {reason: self.examples[reason] for reason in sorted(
                    self.counts)}}

    def describe(self) -> str:
        return ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.counts.items()))


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """What the launcher learns from glob expansion alone: the shards, the bytes each stands
    for (for progress), the first file of each input (for the field-mapping check), the
    compressed files too large to read fast (one worker reads each), and per input how many
    files it reads and which it skipped (for the manifest)."""

    shards: list[ShardSpec]
    shard_bytes: list[int]
    first_files: dict[int, str]
    large_compressed: list[tuple[str, int]]
    file_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    skipped: dict[int, Skipped] = dataclasses.field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.shard_bytes)

    def input_facts(self) -> dict[int, dict]:
        """Per input index, what the manifest's ``inputs`` entry says about its files."""
        return {index: {"file_count": count, **self.skipped[index].facts()}
                for index, count in self.file_counts.items()}


def plan_shards(
    specs: Iterable[InputSpec], target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
) -> list[ShardSpec]:
    """Expand the input patterns into a deterministic list of shards, Parquet row groups too.

    Files are taken in sorted path order; the same specs over the same files always give the
    same list. Uncompressed JSONL and line/paragraph text are cut into byte ranges and Parquet
    into row-group ranges of about ``target_shard_bytes`` each; anything else is one shard per
    file. The launcher uses ``plan_inputs``, which leaves Parquet footers to the job.
    """
    plan = plan_inputs(specs, target_shard_bytes)
    return [part for shard in plan.shards for part in split_shard(shard, target_shard_bytes)]


def plan_inputs(
    specs: Iterable[InputSpec], target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES
) -> InputPlan:
    """Shards from glob expansion alone: nothing read from the files, so planning costs the
    same for 10 files or 100,000. A pattern matching nothing, an unknown extension or a
    compressed Parquet file stops the job here. Parquet files stay whole; ``split_shard``
    cuts them into row-group ranges inside the job."""
    if target_shard_bytes < 1:
        raise ValueError(f"target_shard_bytes must be positive, got {target_shard_bytes}")
    plan = InputPlan([], [], {}, [])
    for spec in specs:
        skipped = plan.skipped[spec.index] = Skipped()
        files = _matched_files(spec, skipped)
        plan.first_files[spec.index] = files[0][0]
        plan.file_counts[spec.index] = len(files)
        for path, size in files:
            for shard, nbytes in _plan_file(spec, path, size, target_shard_bytes):
                plan.shards.append(shard)
                plan.shard_bytes.append(nbytes)
            if compression_suffix(path) and size > LARGE_COMPRESSED_BYTES:
                plan.large_compressed.append((path, size))
    return plan


def _matched_files(spec: InputSpec, skipped: Skipped) -> list[tuple[str, int]]:
    """The files of ``spec``, sorted by path, each once; what is passed over goes to
    ``skipped``. A directory stands for the data files in it at any depth: those whose format
    the extension tells (all when the format is declared), neither hidden nor a README or
    LICENSE. A local file that is not a regular one (a FIFO would block the read forever) or a
    link to nothing is skipped wherever it is found."""
    directory = _directory(spec.pattern)
    if directory is None:
        files = _local_files(_match(spec.pattern), skipped)
        if not files:
            raise ValueError(f"--input pattern {spec.pattern!r} matches no files"
                             + (f" to read (skipped: {skipped.describe()})"
                                if skipped.counts else ""))
        return files
    if "://" in directory:
        found = [(m.path, m.size_in_bytes) for m in
                 FileSystems.match([FileSystems.join(directory, "**")])[0].metadata_list]
    else:
        found = _walk(directory, skipped)
    named = []
    for path, size in found:
        reason = _name_reason(spec, path[len(directory):].lstrip("/"))
        if reason is None:
            named.append((path, size))
        else:
            skipped.add(reason, path)
    files = _local_files(named, skipped)
    if not files:
        raise ValueError(
            f"--input {spec.pattern!r} is a directory with no data file of a known format "
            f"({', '.join(sorted(FORMAT_BY_EXTENSION))}, optionally compressed)"
            + (f"; skipped: {skipped.describe()}" if skipped.counts else "")
            + f"; pass a glob with the format, e.g. --input "
            f"'{directory.rstrip('/')}/*.data#format=jsonl'")
    return files


def _match(pattern: str) -> list[tuple[str, int]]:
    """The files a pattern names: itself when it exists as a path (``data[1].jsonl`` is that
    file even beside ``data1.jsonl``), else the files its glob matches."""
    filesystem = FileSystems.get_filesystem(pattern)
    if GLOB_CHARACTERS.search(pattern) and filesystem.exists(pattern):
        found = [filesystem.metadata(pattern)]
    else:
        found = FileSystems.match([pattern])[0].metadata_list
    return [(m.path, m.size_in_bytes) for m in found]


def _walk(directory: str, skipped: Skipped) -> list[tuple[str, int]]:
    """Every file under a local directory, through links to folders; a folder that is hidden,
    cannot be listed or was reached before (a link loop) is skipped once, not entered."""
    found: list[tuple[str, int]] = []
    entered: set[str] = set()

    def unreadable(error: OSError) -> None:
        skipped.add(UNREADABLE, str(error.filename))

    for root, folders, names in os.walk(directory, onerror=unreadable, followlinks=True):
        real = os.path.realpath(root)
        if real in entered:
            skipped.add(SAME_FILE, os.path.join(root, ""))
            folders[:] = []
            continue
        entered.add(real)
        kept = []
        for name in sorted(folders):
            reason = _name_reason(None, name, folder=True)
            if reason is None:
                kept.append(name)
            else:
                skipped.add(reason, os.path.join(root, name, ""))
        folders[:] = kept
        found += [(os.path.join(root, name), 0) for name in names]
    return found


def _name_reason(spec: InputSpec | None, relative: str, folder: bool = False) -> str | None:
    """Why a path found in a directory input is not data, from its name alone (``relative``
    to the directory); None when it is read."""
    parts = relative.split("/")
    if any(part.startswith(".") for part in parts):
        return HIDDEN
    if folder:
        return None
    if parts[-1].upper().startswith(_DOCUMENTATION):
        return README_OR_LICENSE
    if spec is not None and not spec.format and not _known_format(relative):
        return UNKNOWN_EXTENSION
    return None


def _local_files(found: list[tuple[str, int]], skipped: Skipped) -> list[tuple[str, int]]:
    """``found`` sorted by path, local files looked at: only regular files, each once (by its
    own path when the input reaches it so, else by the first link in order), with their sizes;
    remote objects as listed."""
    files: list[tuple[str, int]] = []
    seen: set[tuple[int, int]] = set()
    for path, size in sorted(found, key=lambda item: (os.path.islink(item[0]), item[0])):
        if "://" in path:
            files.append((path, size))
            continue
        try:
            info = os.stat(path)
        except OSError:
            skipped.add(BROKEN_LINK if os.path.islink(path) else UNREADABLE, path)
            continue
        if not stat.S_ISREG(info.st_mode):
            skipped.add(NOT_A_REGULAR_FILE, path)
        elif (info.st_dev, info.st_ino) in seen:
            skipped.add(SAME_FILE, path)
        else:
            seen.add((info.st_dev, info.st_ino))
            files.append((path, info.st_size))
    return sorted(files)


def _directory(pattern: str) -> str | None:
    """``pattern`` when it names a directory: a local one, or any path ending in ``/``."""
    if pattern.endswith("/") or ("://" not in pattern and os.path.isdir(pattern)):
        return pattern
    return None


def _known_format(path: str) -> bool:
    return posixpath.splitext(uncompressed_name(path))[1] in FORMAT_BY_EXTENSION


def large_compressed_advice(large: list[tuple[str, int]]) -> str:
    """The planning-time warning for compressed files that one worker each must read."""
    path, size = max(large, key=lambda item: item[1])
    return (f"{len(large)} compressed input file(s) over {LARGE_COMPRESSED_BYTES >> 30} GiB "
            f"(largest {path}, {size / (1 << 30):.1f} GiB): a compressed file cannot be split, so "
            f"one worker reads each from start to end. Recompress into pieces of about 1 GB "
            f"(e.g. part-00000.jsonl.zst, ...) or store it uncompressed, which is split into "
            f"byte ranges; see {INPUTS_DOC}")


def _plan_file(spec: InputSpec, path: str, size: int,
               target: int) -> list[tuple[ShardSpec, int]]:
    fmt = spec.format or file_format(path)
    unit = spec.text_unit if fmt == "text" else "file"
    index = spec.index
    compressed = compression_suffix(path) is not None
    if fmt == "parquet" and compressed:
        raise ValueError(
            f"{path!r}: Parquet cannot be read through an outer compression; "
            "Parquet compresses its own pages"
        )
    byte_ranges = not compressed and (fmt == "jsonl" or (fmt == "text" and unit != "file"))
    count = max(1, -(-size // target)) if byte_ranges else 1
    bounds = [size * i // count for i in range(count + 1)]
    return [
        (ShardSpec(index, path, fmt, text_unit=unit, start=bounds[i],
                   end=bounds[i + 1] if i + 1 < count else None), bounds[i + 1] - bounds[i])
        for i in range(count)
    ]


def split_shard(shard: ShardSpec,
                target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES) -> list[ShardSpec]:
    """A whole Parquet file as row-group ranges (its footer is read here, inside the job);
    any other shard as it is."""
    if shard.format != "parquet" or shard.start != 0 or shard.end is not None:
        return [shard]
    return _plan_parquet(shard.input_index, shard.path, target_shard_bytes)


def _plan_parquet(index: int, path: str, target: int) -> list[ShardSpec]:
    """Group consecutive row groups until their compressed size reaches ``target``."""
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            meta = pq.ParquetFile(f).metadata
    except READ_ERRORS:
        # Not readable now: one shard, and read_shard reports it as unreadable_file.
        return [ShardSpec(index, path, "parquet")]
    shards: list[ShardSpec] = []
    first, size = 0, 0
    for i in range(meta.num_row_groups - 1):  # the last group always closes the last shard
        group = meta.row_group(i)
        size += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        if size >= target:
            shards.append(ShardSpec(index, path, "parquet", start=first, end=i + 1))
            first, size = i + 1, 0
    shards.append(ShardSpec(index, path, "parquet", start=first))
    return shards


def check_field_mappings(spec: InputSpec, path: str) -> None:
    """Fails when a field declared on ``--input`` (``text=sentence1``) is absent from every one
    of the first records of the input's first file, before any work is done."""
    field_map = dict(spec.fields)
    fmt = spec.format or file_format(path)
    if not field_map or _too_big_to_peek(path, fmt):
        return
    shard = ShardSpec(spec.index, path, fmt, text_unit=spec.text_unit if fmt == "text" else "file")
    try:
        chunks = list(_first_chunks(shard))
    except (OSError, pa.ArrowException):
        return  # unreadable now: the job reports the file as unreadable_file
    values = [record.value for chunk in chunks for record in chunk.records
              if record.error is None and isinstance(record.value, dict)]
    if not values:
        return
    missing: set[str] = set()
    for value in values:
        try:
            apply_field_map(value, field_map)
            return  # one record has every declared field: the mapping fits the input
        except KeyError as error:
            missing.update(str(error.args[0]).split(", "))
    declared = ";".join(f"{k}={v}" for k, v in spec.fields if v in missing)
    raise ValueError(
        f"--input {spec.pattern!r}: declared field(s) {declared} not found in the first "
        f"{len(values)} record(s) of {path}, whose fields are {', '.join(sorted(values[0]))}; "
        f"change the mapping after '#'")


def _first_chunks(shard: ShardSpec) -> Iterator[RecordChunk]:
    if shard.format == "parquet":
        yield from _first_parquet_rows(shard)
        return
    yield next(read_shard(shard, chunk_records=MAPPING_CHECK_RECORDS), RecordChunk("", ()))


def _first_parquet_rows(shard: ShardSpec) -> Iterator[RecordChunk]:
    """Parquet's first rows from its first row group only (a bounded read)."""
    with FileSystems.open(shard.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        parquet = pq.ParquetFile(f)
        if parquet.metadata.num_row_groups == 0:
            return
        batch = next(parquet.iter_batches(batch_size=MAPPING_CHECK_RECORDS, row_groups=[0]),
                     None)
    if batch is not None:
        yield RecordChunk("", tuple(Record(shard.path, i, shard.input_index, value=row)
                                    for i, row in enumerate(batch.to_pylist())))


def _too_big_to_peek(path: str, fmt: str) -> bool:
    if fmt != "json":
        return False
    return FileSystems.get_filesystem(path).metadata(path).size_in_bytes > \
        MAPPING_CHECK_MAX_JSON_BYTES
