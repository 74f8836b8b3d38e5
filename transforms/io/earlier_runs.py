"""What an earlier run left in an output folder, and which of it is the run's own: the check that
refuses to mix two runs' files, and the deletions ``--overwrite`` makes (docs/outputs.md, "One
run per folder"). Only what a run wrote ever goes; a user's files beside it stay."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.core.records import LABEL
from transforms.core.steps import PARTITION, base_kind
from transforms.io.formats import FORMAT_KINDS
from transforms.io.manifest import MANIFEST_NAME
from transforms.io.tokenizer_files import TOKENIZER_DIR
from transforms.io.writers import (
    CARD_NAME,
    CARD_TAG,
    DEDUP_INDEX,
    DOCUMENT_KINDS,
    OUTPUT_KINDS,
    PARTITIONED_KINDS,
    PHASES_NAME,
    STAGING_DIR,
    files_under,
    stored_paths,
)


def _earlier_phase_dirs(output_dir: str) -> list[str]:
    """The phase directories that an earlier run's ``phases.json`` lists under ``output_dir``.

    Only names a phase may have are taken, joined to ``output_dir``: the listing cannot point an
    overwrite anywhere else.
    """
    path = FileSystems.join(output_dir, PHASES_NAME)
    if not FileSystems.exists(path):
        return []
    try:
        with FileSystems.open(path) as handle:
            listing = json.loads(handle.read())["phases"]
        names = [entry["name"] for entry in listing]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a phases listing ({error}); remove it, or the output "
                         "directory, by hand") from error
    return [FileSystems.join(output_dir, name) for name in names
            if isinstance(name, str) and LABEL.fullmatch(name)]


def is_our_card(path: str) -> bool:
    """Whether ``path`` is a dataset card this pipeline wrote (its YAML header carries
    ``CARD_TAG``), not a README.md of the user's."""
    with FileSystems.open(path) as handle:
        head = handle.read(65536).decode("utf-8", "replace")
    header = head.split("\n---", 1)[0] if head.startswith("---") else ""
    return f'- "{CARD_TAG}"' in header.splitlines()


def check_card_place(output_dir: str) -> None:
    """Refuses to write the dataset card over a README.md of the user's in ``output_dir``."""
    card = FileSystems.join(output_dir, CARD_NAME)
    if FileSystems.exists(card) and not is_our_card(card):
        raise ValueError(f"{card} is not a dataset card of this pipeline, and a run writes its "
                         "card there; move the file, or choose another --output")


# Output files are named by ``output_path`` and by nothing else: the name a run's own files have
# (Parquet, JSONL, and the extra formats' shards: Megatron's .bin/.idx and .npy, MDS, LitData).
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
PART_NAME = re.compile(r"part-\d{5}-of-\d{5}\.(?:parquet|jsonl|bin|idx|npy|mds)")
# every folder a run writes shards into
RUN_KINDS = (*OUTPUT_KINDS, *DOCUMENT_KINDS, DEDUP_INDEX, *FORMAT_KINDS)
# a format folder's index (MDS's, LitData's index.json): only a run writes one there
FOLDER_INDEXES = {f"{kind}/{format_kind.writer.index_name}"
                  for kind, format_kind in FORMAT_KINDS.items() if format_kind.writer.index_name}
REPORT_NAME = "report.html"
REPORT_TAG = f'<meta name="generator" content="{CARD_TAG}">'  # in the data report's head


def _is_our_report(path: str) -> bool:
    with FileSystems.open(path) as handle:
        return REPORT_TAG.encode() in handle.read(4096)


def _listed_files(directory: str) -> list[str]:
    """The files an earlier run's ``manifest.json`` in ``directory`` says it wrote: its output
    files and its tokenizer files, each taken by name into ``directory`` (so a listing cannot
    point a deletion anywhere else, and a folder moved as a whole still matches)."""
    path = FileSystems.join(directory, MANIFEST_NAME)
    if not FileSystems.exists(path):
        return []
    try:
        with FileSystems.open(path) as handle:
            manifest = json.loads(handle.read())
        outputs = [(kind, entry["path"]) for kind, entries in manifest["outputs"].items()
                   for entry in entries]
        tokenizer = list(manifest.get("tokenizer_files", []))
        indexes = list(manifest.get("formats", {}).get("index_files", []))
    except (ValueError, KeyError, TypeError, AttributeError):
        return []  # not a complete manifest: its run's files are found by their names
    shards = [(base_kind(kind), FileSystems.join(directory, kind, FileSystems.split(name)[1]))
              for kind, name in outputs
              if base_kind(kind) in RUN_KINDS and PART_NAME.fullmatch(FileSystems.split(name)[1])]
    names = [path for _, path in shards]
    names += [companion for kind, path in shards if kind in FORMAT_KINDS
              for companion in FORMAT_KINDS[kind].writer.companions(path)]
    names += [FileSystems.join(directory, index) for index in indexes if index in FOLDER_INDEXES]
    names += [FileSystems.join(directory, TOKENIZER_DIR, name) for name in tokenizer
              if isinstance(name, str) and _FILE_NAME.fullmatch(name)]
    return names


def _part_files(directory: str) -> list[str]:
    """Output files of a run that failed before its manifest: named as only a run names them,
    and the format folders' indexes."""
    found = [m.path for result in FileSystems.match(_part_patterns(directory))
             for m in result.metadata_list if _is_part(directory, m.path)]
    return found + [FileSystems.join(directory, index) for index in sorted(FOLDER_INDEXES)]


def _part_patterns(directory: str) -> list[str]:
    """Where a run's output files lie: in each kind's folder, and in its partition folders."""
    return ([FileSystems.join(directory, kind, "part-*") for kind in RUN_KINDS]
            + [FileSystems.join(directory, kind, "*=*", "part-*") for kind in PARTITIONED_KINDS])


def _is_part(directory: str, path: str) -> bool:
    """A file named as only a run names its outputs, in a kind's folder or partition folder."""
    folder, name = FileSystems.split(path)
    kind = folder[len(directory):].strip("/")
    return bool(PART_NAME.fullmatch(name)) and base_kind(kind) in RUN_KINDS


def earlier_run_files(output_dir: str) -> list[str]:
    """Every file an earlier run wrote under ``output_dir`` and nothing else: what its manifest
    lists, output files named as only a run names them (a failed run's), its manifest, staging
    folder and phases listing, and the card and report where they carry the pipeline's tag.
    A user's files beside them, in the same folders or not, are never among them."""
    found: list[str] = []
    for directory in (output_dir, *_earlier_phase_dirs(output_dir)):
        candidates = [*_listed_files(directory), *_part_files(directory),
                      FileSystems.join(directory, MANIFEST_NAME),
                      *files_under(FileSystems.join(directory, STAGING_DIR))]
        card = FileSystems.join(directory, CARD_NAME)
        if FileSystems.exists(card) and is_our_card(card):
            candidates.append(card)
        report = FileSystems.join(directory, REPORT_NAME)
        if FileSystems.exists(report) and _is_our_report(report):
            candidates.append(report)
        found += [path for path in candidates if FileSystems.exists(path)]
    phases = FileSystems.join(output_dir, PHASES_NAME)
    if FileSystems.exists(phases):
        found.append(phases)
    return sorted(dict.fromkeys(found))


def _run_markers(output_dir: str) -> list[str]:
    """What shows, cheaply, that an earlier run wrote here (or in its phases): a manifest,
    phases listing or staging folder, or one output file per kind (one listed object each)."""
    phases = FileSystems.join(output_dir, PHASES_NAME)
    found = [phases] if FileSystems.exists(phases) else []
    for directory in (output_dir, *_earlier_phase_dirs(output_dir)):
        manifest = FileSystems.join(directory, MANIFEST_NAME)
        found += [manifest] if FileSystems.exists(manifest) else []
        staging = FileSystems.join(directory, STAGING_DIR)
        found += [staging] if _holds_anything(staging) else []
        for pattern in _part_patterns(directory):
            matched = FileSystems.match([pattern], limits=[1])[0].metadata_list
            found += [m.path for m in matched if _is_part(directory, m.path)]
    return found


def _holds_anything(path: str) -> bool:
    """Whether ``path`` exists, as a file, a local directory or a gs:// prefix; one listed
    object at most, so the check costs the same however many files an earlier run wrote."""
    if FileSystems.exists(path):
        return True
    return bool(FileSystems.match([FileSystems.join(path, "**")], limits=[1])[0].metadata_list)


def check_output_dir(output_dir: str, overwrite: bool) -> bool:
    """Refuses to mix two runs' files: earlier outputs are an error unless ``overwrite``.
    Returns whether earlier outputs are there, for ``ClearPreviousRun`` to delete in the job."""
    existing = _run_markers(output_dir)
    if existing and not overwrite:
        raise ValueError(f"{output_dir} already holds outputs ({', '.join(existing)}); "
                         "pass --overwrite=true to replace them")
    return bool(existing)


def clear_staging(output_dir: str) -> None:
    """Deletes a failed run's staging folder before this run's job starts, since
    deduplication's first pass and every step write into it from the start. Called once the
    run holds the folder's lock."""
    staging = FileSystems.join(output_dir, STAGING_DIR)
    if _holds_anything(staging):
        FileSystems.delete(stored_paths(staging))


def clear_previous_outputs(output_dir: str) -> int:
    """Deletes the files an earlier run wrote under ``output_dir`` (``earlier_run_files``);
    the number deleted. Runs inside the job (``ClearPreviousRun``), so the launcher lists no
    output files."""
    stored = earlier_run_files(output_dir)
    if stored:
        FileSystems.delete(stored)
    if not output_dir.startswith("gs://"):
        _remove_empty_folders(output_dir)
    return len(stored)


def _remove_empty_folders(output_dir: str) -> None:
    """Local folders that held only an earlier run's files (gs:// has no empty folders)."""
    format_folders = {kind.rsplit("/", depth)[0] for kind in FORMAT_KINDS for depth in (0, 1, 2)}
    names = [*OUTPUT_KINDS, *DOCUMENT_KINDS, DEDUP_INDEX, *format_folders, STAGING_DIR,
             TOKENIZER_DIR,
             "validation"]
    for directory in (output_dir, *_earlier_phase_dirs(output_dir)):
        partitions = [os.path.join(kind, name) for kind in PARTITIONED_KINDS
                      if os.path.isdir(os.path.join(directory, kind))
                      for name in os.listdir(os.path.join(directory, kind))
                      if PARTITION.fullmatch(name)]
        for name in sorted([*partitions, *names], key=len, reverse=True):  # inner ones first
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(directory, name))


class ClearPreviousRun(beam.PTransform):
    """The job's first step when an earlier run's outputs are to be replaced: deletes them and
    yields one element, which the output writing waits for (as a side input)."""

    def __init__(self, output_dirs: Sequence[str]):
        super().__init__()
        self.output_dirs = list(output_dirs)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin
                | "OutputDirectories" >> beam.Create([self.output_dirs])
                | "DeleteEarlierOutputs" >> beam.Map(
                    lambda dirs: sum(clear_previous_outputs(d) for d in dirs)))
