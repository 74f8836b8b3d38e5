"""Deduplication's memory at scale, by simulation: peak resident memory against the share of
duplicates, and the rounds label propagation takes (issue 20; docs/dedup.md).

Each cell is N synthetic documents: one giant cluster (a template and 99,999 copies, half exact
and half near) and, among the other N - 10^5, a fraction F of copies of earlier documents
(alternately exact and near; an original may get several). A document is what deduplication's
first pass makes of one (``DocumentKeys``: node, 16 LSH band keys, a 128-value MinHash
signature). A near copy is its template's signature with 1 to 8 values replaced, so it is
verified (estimated similarity >= 0.93) and shares at least half its bands. They are made
inside the pipeline, a chunk of 4,096 at a time, and go through the real ``FindDuplicates``
(bands, candidate pairs, verification, ``ConnectedComponents``) with the production bucket
count (one per 256 MiB of input at about 4 KB a document), on the DirectRunner in
``multi_processing`` mode with one worker process.

Each cell runs in its own process, and the bench drives the worker as a Dataflow worker is fed
rather than as the local runner does by default (a whole stage as one bundle, a shuffle's
output as one message, one worker process for every step): ``_BoundedBundles`` cuts each
stage's input between elements into bundles of at most ``--bundle_mb`` (64 MiB; a grouped key
stays whole) and runs them one after another; ``_in_a_fresh_worker`` starts each step (fused
stage) in a new worker process; and glibc's mmap and trim thresholds are fixed (``FIXED_MALLOC``,
unless ``--default_malloc``). Before each bundle the worker's high-water mark is reset
(``/proc/PID/clear_refs``) and after it ``VmHWM`` is read: a step's peak is the largest over its
bundles, and the cell reports the step with the largest peak. The runner process plays
Dataflow's shuffle service. The FnApiRunner keeps every shuffle's data in its own memory (about
34 GB at 10^7 documents), so the bench has it keep them in files under ``--spill_dir`` instead,
grouped one hash partition at a time (``bench/spilled_shuffle.py``); ``--spill_dir ""`` leaves
them in memory.

With ``--index M`` the cell also deduplicates against an earlier run's index of M documents
(``--dedup_against``, ``transforms/knowledge/dedup/index.py``), wired as
``FindDuplicateDocuments`` wires it: the index's keys are made inside the pipeline a batch of
1,024 at a time (``--index_batch``; an index file's row group at the default ``--row_group_rows``,
which ``ReadEarlierIndexes`` reads as one batch), as index rows (``INDEX_SCHEMA``: a
``document_id``, the text hash, band keys and signature of documents of their own) turned into
``DocumentKeys`` by the real ``earlier_keys`` (nodes ``earlier_node``, input -1), flattened
with this run's keys before ``FindDuplicates``, and its decisions go through the real
``this_runs_decisions``. A fraction ``--index_dups`` of this run's N - 10^5 other documents are
copies of index documents (alternately exact and near, as above), taken from this run's
originals, so the within-run copies are the same number as without an index. The bucket count
counts this run's documents and the index's, one per 65,536, as ``key_buckets`` does
(``--buckets_run_only`` counts this run's alone, as it did before: the peak then grows with the
index). The bench checks that every copy of
an index document is decided ``duplicate_earlier_run``. ``--index 0`` (the default) builds the
same pipeline as before.

    .venv/bin/python -m bench.bench_dedup_scale [--docs 1000000] [--dups 0.05 0.3 0.6]
        [--giant 100000] [--index 0 1000000] [--index_dups 0.05] [--index_batch 1024]
        [--buckets_run_only] [--workers 1] [--bundle_mb 64] [--default_malloc]
        [--spill_dir DIR]

Prints one JSON line per cell (for every step: its bundles, the largest, its peak, and each
bundle's resident memory before it and at its peak) and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner

from bench.spilled_shuffle import spill_shuffles
from transforms.core.steps import METRICS_NAMESPACE
from transforms.core.vocabulary import DUPLICATE_EARLIER_RUN, KNOWLEDGE
from transforms.knowledge.dedup.components import FindDuplicates
from transforms.knowledge.dedup.config import MAX_ROUNDS, DedupConfig
from transforms.knowledge.dedup.index import INDEX_SCHEMA, earlier_keys, this_runs_decisions
from transforms.knowledge.dedup.minhash import DocumentKeys, band_keys
from transforms.knowledge.document_records import document_id

CHUNK = 4096
INDEX_BATCH = 1024  # an index file's row group (--row_group_rows): ReadEarlierIndexes' batch
GIANT = 100_000  # members of the giant cluster: a template and its copies
DOCS_PER_BUCKET = 65_536  # 256 MiB of input at about 4 KB a document (SHARDS_PER_KEY_BUCKET)
CONFIG = DedupConfig()
# glibc raises its mmap threshold (up to 32 MiB) each time a large mmapped block is freed, so
# later buffers of that size come from the heap and stay resident after they are freed: a
# worker's resident memory then keeps the high-water mark of earlier bundles' buffers, more of
# them the more pairs a bundle makes. Fixed thresholds hand every freed block over 128 KiB
# back, so resident memory follows what the step holds. The cell and its workers inherit them.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


class Corpus:
    """Which document copies which: position arithmetic, so every chunk is made on its own.

    This run's documents are the giant cluster, then the originals, the copies of originals
    and the copies of an earlier run's index documents (none without an index)."""

    def __init__(self, docs: int, dups: float, giant: int = GIANT, index: int = 0,
                 index_dups: float = 0.0):
        self.docs = docs
        self.giant = giant
        self.index = index
        self.others = docs - giant
        self.copies = round(dups * self.others)
        self.earlier_copies = round(index_dups * self.others) if index else 0
        self.originals = self.others - self.copies - self.earlier_copies

    def template(self, position: int) -> tuple[int, bool] | None:
        """(the position copied, exact) for a copy of a document of this run; None for an
        original or a copy of an index document."""
        if position < self.giant:
            return (0, position % 2 == 0) if position else None
        index = position - self.giant
        if index < self.originals:
            return None
        k = index - self.originals
        if k >= self.copies:
            return None
        return self.giant + (k * 7919) % self.originals, k % 2 == 0

    def earlier_template(self, position: int) -> tuple[int, bool] | None:
        """(the index document's row copied, exact) for a copy of an index document; None for
        every other document. The k-th copy takes row 7919 k modulo the index size: distinct
        rows while there are fewer copies than rows and the size is no multiple of 7,919."""
        k = position - self.giant - self.originals - self.copies
        if k < 0:
            return None
        return (k * 7919) % self.index, k % 2 == 0

    @property
    def expected_drops(self) -> int:
        return self.giant - 1 + self.copies + self.earlier_copies


def _signature(template: int) -> np.ndarray:
    return np.random.default_rng(template).integers(0, 2**32 - 1, CONFIG.num_perm,
                                                    dtype=np.uint32)


def _index_signature(row: int) -> np.ndarray:
    """An index document's signature: a seed of its own, so it shares nothing with this run's
    originals (nor does its text hash, ``_content("index", row)``)."""
    return np.random.default_rng([row, 2]).integers(0, 2**32 - 1, CONFIG.num_perm,
                                                    dtype=np.uint32)


def _near(signature: np.ndarray, position: int) -> np.ndarray:
    """A near copy's signature: 1 to 8 of its template's values replaced (in place)."""
    rng = np.random.default_rng([position, 1])
    changed = rng.choice(CONFIG.num_perm, rng.integers(1, 9), replace=False)
    signature[changed] = rng.integers(0, 2**32 - 1, len(changed), dtype=np.uint32)
    return signature


def _content(tag: str, number: int) -> bytes:
    return hashlib.blake2b(f"{tag}:{number}".encode(), digest_size=16).digest()


def make_chunk(chunk: int, corpus: Corpus) -> Iterator[tuple[DocumentKeys, ...]]:
    docs = []
    for position in range(chunk * CHUNK, min((chunk + 1) * CHUNK, corpus.docs)):
        copied = corpus.template(position)
        earlier = corpus.earlier_template(position) if corpus.earlier_copies else None
        if earlier is not None and earlier[1]:  # an exact copy of an index document
            content, signature = _content("index", earlier[0]), _index_signature(earlier[0])
        elif earlier is not None:
            content = _content("near", position)
            signature = _near(_index_signature(earlier[0]), position)
        elif copied is None:
            content, signature = _content("doc", position), _signature(position)
        elif copied[1]:  # exact
            content, signature = _content("doc", copied[0]), _signature(copied[0])
        else:
            signature = _near(_signature(copied[0]), position)
            content = _content("near", position)
        docs.append(DocumentKeys((0, 0, position, chunk, content),
                                 band_keys(signature, CONFIG.bands), signature.tobytes()))
    yield tuple(docs)


def make_index_chunk(chunk: int, corpus: Corpus, batch: int = INDEX_BATCH
                     ) -> Iterator[tuple[DocumentKeys, ...]]:
    """One batch of the earlier run's index, as ``ReadEarlierIndexes`` makes one of a row group:
    index rows (``INDEX_SCHEMA``) made ``DocumentKeys`` by ``earlier_keys`` (run 0)."""
    rows = range(chunk * batch, min((chunk + 1) * batch, corpus.index))
    signatures = [_index_signature(row) for row in rows]
    columns = {
        "branch": [KNOWLEDGE] * len(rows),  # (where the index has a branch column)
        "id": [document_id("earlier-run", row) for row in rows],
        "digest": [_content("index", row) for row in rows],
        "bands": [list(band_keys(signature, CONFIG.bands)) for signature in signatures],
        "signature": [signature.tobytes() for signature in signatures],
    }
    yield earlier_keys(pa.table({name: columns[name] for name in INDEX_SCHEMA.names},
                                schema=INDEX_SCHEMA), 0)


class _BoundedBundles(fn_runner.BundleManager):
    """The FnApiRunner's bundle manager for one worker, but each stage's input cut into
    bundles of at most ``limit`` encoded bytes (or one element, if that is larger), run one
    after another on the worker; and the worker's peak resident memory recorded per bundle.

    The local runner otherwise sends a worker a stage's whole input as one bundle, and the
    output of a shuffle as one message: the worker then holds all of it while the stage runs,
    so its memory follows the stage's input (every document, every pair) rather than the
    step. A Dataflow worker gets bundles that are slices of a stage and reads grouped values
    as a stream. Cutting at element boundaries keeps every grouped key whole: a bucket, a
    node and its messages go to the worker together, as on Dataflow.
    """

    limit = 64 << 20
    steps: dict[str, dict] = {}

    def process_bundle(self, inputs, expected_outputs, fired_timers, expected_output_timers,
                       dry_run=False):
        pieces = {name: _pieces(buffer, self.bundle_context_manager.get_input_coder_impl(name),
                                self.limit) for name, buffer in inputs.items()}
        merged, splits, first = None, [], True
        while True:
            part = {name: next(found, None) for name, found in pieces.items()}
            if not first and all(piece is None for piece in part.values()):
                break
            part = {name: piece or [] for name, piece in part.items()}
            workers = _descendants(os.getpid())
            for pid in workers:  # the high-water mark back to the resident memory now
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            before = max((_status_kb(pid, "VmRSS") for pid in workers), default=0)
            result, split = super().process_bundle(part, expected_outputs,
                                                   fired_timers if first else {},
                                                   expected_output_timers, dry_run)
            peak = max((_status_kb(pid, "VmHWM") for pid in _descendants(os.getpid())),
                       default=0)
            step = self.steps.setdefault(_step_name(self.bundle_context_manager.stage.name),
                                         {"bundles": 0, "largest_bundle_mb": 0, "peak_kb": 0,
                                          "rise_kb": 0, "trace": []})
            step["bundles"] += 1
            step["largest_bundle_mb"] = max(step["largest_bundle_mb"], round(
                sum(len(blob) for piece in part.values() for blob in piece) / 2**20))
            step["peak_kb"] = max(step["peak_kb"], peak)
            step["rise_kb"] = max(step["rise_kb"], peak - before)
            step["trace"].append((round(before / 1024), round(peak / 1024)))
            splits += split
            merged = result if merged is None else beam_fn_api_pb2.InstructionResponse(
                process_bundle=beam_fn_api_pb2.ProcessBundleResponse(
                    monitoring_infos=monitoring_infos.consolidate(itertools.chain(
                        result.process_bundle.monitoring_infos,
                        merged.process_bundle.monitoring_infos))),
                error=result.error or merged.error)
            first = False
        return merged, splits


_EXECUTE_BUNDLE = fn_runner.FnApiRunner._execute_bundle


def _in_a_fresh_worker(execute_bundle):
    """``FnApiRunner._execute_bundle`` that first stops the worker processes, so that each
    step (a fused stage) starts in a new one, as a step's own bundles would on a Dataflow
    worker: its peak is then that step's, not the heap left over from the steps before it.
    The runner's gRPC server stays up; the next step's workers connect to it anew."""
    ran: list[str] = []

    def execute(runner, context, bundle_context_manager, bundle_input):
        manager = context.worker_handler_manager
        if ran:  # the first step's worker is started with the job, before any step
            handlers = {h for found in manager._cached_handlers.values() for h in found}
            for handler in handlers:
                handler.control_conn.close()
                handler.data_conn.close()
            for pid in _descendants(os.getpid()):  # the worker and the shell that started it
                os.kill(pid, signal.SIGKILL)
            for handler in handlers:
                handler.worker_thread.join()
            manager._cached_handlers.clear()
            manager._workers_by_id.clear()
            bundle_context_manager._worker_handlers = None  # (set when the job was planned)
        ran.append(bundle_context_manager.stage.name)
        return execute_bundle(runner, context, bundle_context_manager, bundle_input)

    return execute


def _pieces(buffer, coder, limit: int) -> Iterator[list[bytes]]:
    """A buffer's encoded elements in pieces of at most ``limit`` bytes, cut between elements
    (a larger element is a piece of its own)."""
    piece: list[bytes] = []
    size = 0
    for blob in buffer:
        if len(blob) <= limit:  # the worker's output messages end on element boundaries
            spans = [blob]
        else:
            spans, stream, start, end = [], create_InputStream(blob), 0, 0
            while stream.size() > 0:
                coder.decode_from_stream(stream, True)
                position = len(blob) - stream.size()
                if position - start > limit and end > start:
                    spans.append(blob[start:end])
                    start = end
                end = position
            spans.append(blob[start:])
        for span in spans:
            if piece and size + len(span) > limit:
                yield piece
                piece, size = [], 0
            piece.append(span)
            size += len(span)
    if piece:
        yield piece


def _step_name(stage: str) -> str:
    """A fused stage's transforms, in order, without the runner's decorations."""
    names = re.findall(r"(?:ref_AppliedPTransform_)?([A-Za-z0-9/_-]+?)(?:_\d+)?\)", stage)
    names = [name.replace("-", "/").removeprefix("FindDuplicates/") for name in names]
    return " + ".join(dict.fromkeys(names))


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _count(decision) -> None:
    beam.metrics.Metrics.counter("bench", "decisions").inc()
    if decision[1] == DUPLICATE_EARLIER_RUN:
        beam.metrics.Metrics.counter("bench", "earlier_run").inc()


def _quiet_stopped_workers(args) -> None:
    if not (args.exc_type is RuntimeError and "Worker subprocess exited" in str(args.exc_value)):
        threading.__excepthook__(args)


def run_cell(docs: int, dups: float, giant: int, workers: int, bundle_mb: float,
             spill_dir: str = "", index: int = 0, index_dups: float = 0.0,
             index_batch: int = INDEX_BATCH, buckets_with_index: bool = False) -> dict:
    corpus = Corpus(docs, dups, giant, index, index_dups)
    if corpus.earlier_copies > index:
        raise ValueError(f"{corpus.earlier_copies:,} copies of an index of {index:,} documents:"
                         " give a larger --index or a smaller --index_dups")
    buckets = max(1, -(-(docs + (index if buckets_with_index else 0)) // DOCS_PER_BUCKET))
    threading.excepthook = _quiet_stopped_workers
    _BoundedBundles.limit = int(bundle_mb * 2**20) if bundle_mb else sys.maxsize
    fn_runner.FnApiRunner._get_bundle_manager = lambda runner, context: _BoundedBundles(
        context, runner._progress_frequency,
        cache_token_generator=fn_runner.FnApiRunner.get_cache_token_generator(static=False))
    fn_runner.FnApiRunner._execute_bundle = _in_a_fresh_worker(_EXECUTE_BUNDLE)
    options = PipelineOptions(["--direct_running_mode=multi_processing",
                               f"--direct_num_workers={workers}"])
    started = time.perf_counter()
    pipeline = beam.Pipeline(runner="DirectRunner", options=options)
    if not index:
        _ = (pipeline
             | beam.Create(range(-(-docs // CHUNK)))
             | beam.FlatMap(make_chunk, corpus)
             | FindDuplicates(CONFIG.threshold, buckets)
             | beam.Map(_count))
    else:  # as FindDuplicateDocuments joins earlier runs' indexes
        keys = (pipeline
                | "Chunks" >> beam.Create(range(-(-docs // CHUNK)))
                | "MakeChunk" >> beam.FlatMap(make_chunk, corpus))
        earlier = (pipeline
                   | "IndexBatches" >> beam.Create(range(-(-index // index_batch)))
                   | "MakeIndexBatch" >> beam.FlatMap(make_index_chunk, corpus, index_batch))
        _ = ((keys, earlier)
             | "WithEarlierRuns" >> beam.Flatten()
             | "FindDuplicates" >> FindDuplicates(CONFIG.threshold, buckets)
             | "ThisRunsDecisions" >> beam.FlatMap(this_runs_decisions)
             | "Count" >> beam.Map(_count))
    with spill_shuffles(spill_dir) if spill_dir else contextlib.nullcontext():
        result = pipeline.run()
        result.wait_until_finish()
    wall = time.perf_counter() - started
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        MetricsFilter())["counters"] if c.key.metric.namespace in ("bench", METRICS_NAMESPACE)}
    changed = [counters.get(f"dedup.round_{r:02d}.changed", 0) for r in range(1, MAX_ROUNDS + 1)]
    steps = {name: {"bundles": step["bundles"], "largest_bundle_mb": step["largest_bundle_mb"],
                    "peak_mb": round(step["peak_kb"] / 1024),
                    "rise_mb": round(step["rise_kb"] / 1024),
                    "bundles_mb": step["trace"]}
             for name, step in _BoundedBundles.steps.items()}
    largest = max(steps, key=lambda name: steps[name]["peak_mb"])
    return {
        "docs": docs, "dup_fraction": dups, "giant": giant, "workers": workers,
        "bundle_mb": bundle_mb,
        "index": index, "index_dups": index_dups if index else 0, "index_batch": index_batch,
        "buckets": buckets,
        "duplicates": corpus.expected_drops,
        "decided": counters.get("decisions", 0),
        "earlier_copies": corpus.earlier_copies,
        "decided_earlier_run": counters.get("earlier_run", 0),
        "rounds_with_changes": sum(1 for n in changed if n),
        "changed_per_round": changed,
        "largest_step": largest,
        "largest_step_peak_mb": steps[largest]["peak_mb"],
        "largest_step_rise_mb": steps[largest]["rise_mb"],
        "largest_step_bundles": steps[largest]["bundles"],
        "runner_peak_mb": round(_status_kb(os.getpid(), "VmHWM") / 1024),
        "wall_s": round(wall),
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--dups", type=float, nargs="+", default=[0.05, 0.3, 0.6])
    parser.add_argument("--giant", type=int, default=GIANT, help="members of the giant cluster")
    parser.add_argument("--index", type=int, nargs="+", default=[0],
                        help="documents in an earlier run's index to deduplicate against")
    parser.add_argument("--index_dups", type=float, default=0.05,
                        help="share of this run's documents outside the giant cluster that"
                        " copy index documents (with an index)")
    parser.add_argument("--index_batch", type=int, default=INDEX_BATCH,
                        help="index documents per batch (an index file's row group)")
    parser.add_argument("--buckets_run_only", action="store_true",
                        help="one bucket per 65,536 documents of this run alone, not of this run"
                        " and the index (what key_buckets counts)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--bundle_mb", type=float, default=64,
                        help="largest bundle (encoded input) a worker gets; 0: a whole stage")
    parser.add_argument("--default_malloc", action="store_true",
                        help="leave glibc's mmap and trim thresholds dynamic (see above)")
    parser.add_argument("--spill_dir", default=tempfile.gettempdir(),
                        help="where the runner keeps shuffled data (bench/spilled_shuffle.py);"
                        " empty: in its memory, as the local runner does")
    parser.add_argument("--cell", action="store_true", help="run one cell in this process")
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(run_cell(args.docs[0], args.dups[0], args.giant, args.workers,
                                  args.bundle_mb, args.spill_dir, args.index[0],
                                  args.index_dups, args.index_batch,
                                  not args.buckets_run_only)), flush=True)
        return
    rows = []
    for docs in args.docs:
        for dups in args.dups:
            for index in args.index:
                with_index = ["--index", str(index), "--index_dups", str(args.index_dups),
                              "--index_batch", str(args.index_batch),
                              *(["--buckets_run_only"] if args.buckets_run_only else [])
                              ] if index else []
                out = subprocess.run([sys.executable, "-m", "bench.bench_dedup_scale", "--cell",
                                      "--docs", str(docs), "--dups", str(dups),
                                      "--giant", str(args.giant), *with_index,
                                      "--workers", str(args.workers),
                                      "--bundle_mb", str(args.bundle_mb),
                                      "--spill_dir", args.spill_dir],
                                     capture_output=True, text=True, check=True,
                                     env=os.environ if args.default_malloc else {
                                         **os.environ, **FIXED_MALLOC}).stdout
                row = json.loads(out.strip().splitlines()[-1])
                row["malloc"] = "default" if args.default_malloc else "fixed thresholds"
                if (row["decided"] != row["duplicates"]
                        or row["decided_earlier_run"] != row["earlier_copies"]):
                    raise SystemExit(f"wrong decisions: {row}")
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("| documents | F | index | duplicates | of them, copies of the index (decided) "
          "| buckets | largest step | its peak (MB) | its rise (MB) | bundles"
          " | runner peak (MB) | rounds with changes | wall (s) |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['docs']:,} | {row['dup_fraction']:.0%} | {row['index']:,} "
              f"| {row['duplicates']:,} ({row['duplicates'] / row['docs']:.0%}) "
              f"| {row['earlier_copies']:,} ({row['decided_earlier_run']:,}) "
              f"| {row['buckets']} | {row['largest_step'].split(' + ')[0]} "
              f"| {row['largest_step_peak_mb']:,} | {row['largest_step_rise_mb']:,} | "
              f"{row['largest_step_bundles']} | {row['runner_peak_mb']:,} | "
              f"{row['rounds_with_changes']} (+1) | {row['wall_s']:,} |")


if __name__ == "__main__":
    main()
