"""Deduplication's first pass: reads the knowledge inputs again, judges and keys every document
as the main pass would, and leaves in staging what the main pass reads back (each chunk's
decision file, and the token cache of verdicts and ids)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.classify import classify
from transforms.core import helpers
from transforms.core.records import InputSpec, Record, RecordChunk, Rejection, ShardSpec
from transforms.core.steps import Started, in_global_window
from transforms.core.vocabulary import INSTRUCTION, KNOWLEDGE
from transforms.curation.options import BranchCuration
from transforms.io.read_inputs import ReadInputs
from transforms.io.writers import BackgroundWriter
from transforms.knowledge.dedup.components import FindDuplicates
from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.dedup.decisions import DECISIONS, DROPS, UNITS, WriteDecisions
from transforms.knowledge.dedup.index import (
    KEYS,
    ReadEarlierIndexes,
    index_rows,
    keys_path,
    this_runs_decisions,
    write_chunk_keys,
)
from transforms.knowledge.dedup.minhash import (
    DocumentKeys,
    chunk_number,
    file_numbering,
    record_key,
)
from transforms.knowledge.dedup.paragraphs import FindBoilerplate, chunk_rows
from transforms.knowledge.dedup.text_keys import KeyTexts, TextKeys
from transforms.knowledge.documents import FilterQuality, document_steps
from transforms.knowledge.encoding import raw_text_encoder
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import text_hash
from transforms.knowledge.token_cache import Prepared, cache_path, write_chunk

TOKEN_CACHE = "token-cache"  # under the staging directory: the first pass's verdicts and ids
SHARDS_PER_KEY_BUCKET = 4  # shards of up to 64 MiB: a bucket holds the keys of about 256 MiB
INDEX_ROWS_PER_KEY_BUCKET = 65_536  # as many documents as 256 MiB of input at about 4 KB each


class KeyDocuments(BackgroundWriter):
    """Pass one of deduplication: the small keys of each document the main pass would keep,
    one batch per chunk: ``DocumentKeys`` unless ``--dedup=none``, and with boilerplate
    removal on, the packed rows of its paragraphs' hashes (tagged ``UNITS``).

    It prepares each record as the main pass does, by ``classify`` and the same document steps
    (``document_steps``: those that may drop or change a document), but counts nothing: the
    main pass does that. The quality rules and the keys, which need only the prepared text
    (``text_keys.KeyTexts``), run for a large chunk in helper processes while the main thread
    prepares the next chunk, so a chunk's keys leave one element later (or at the end of the
    bundle); the keys are the same either way. With a ``token_cache`` directory it also writes
    each verdict, each prepared text and, encoded in the background, the kept documents' ids,
    for the main pass to reuse (``transforms.knowledge.token_cache``).
    """

    def __init__(self, specs: Sequence[InputSpec], config: KnowledgeConfig,
                 files: Sequence[str], tokenizer: str, token_cache: str | None = None,
                 curation: BranchCuration | None = None, keys_dir: str | None = None):
        self.keys_dir = keys_dir  # --write_dedup_index: each chunk's keys, for IndexDocuments
        self.specs = {spec.index: spec for spec in specs}
        self.config = config
        self.file_numbers = {path: number for number, path in enumerate(files)}
        self.tokenizer = tokenizer
        self.token_cache = token_cache
        steps = [step for _, step in document_steps(config, curation) if step.changes_documents]
        self.steps = [step for step in steps if not isinstance(step, FilterQuality)]
        self.key_texts = KeyTexts(config.quality, config.dedup if config.dedup.near else None,
                                  config.boilerplate)

    def setup(self) -> None:
        super().setup()
        for step in self.steps:
            step.setup()

    def start_bundle(self) -> None:
        super().start_bundle()
        self._started: Started | None = None

    def process(self, chunk: RecordChunk) -> Iterator[Any]:
        started, self._started = self._started, self.start(chunk)
        if started is not None:
            yield from self.finish(started)

    def finish_bundle(self) -> Iterator[Any]:
        started, self._started = self._started, None
        if started is not None:
            for output in self.finish(started):
                yield in_global_window(output)
        super().finish_bundle()

    def start(self, chunk: RecordChunk) -> Started:
        """Prepares the chunk's documents and starts keying their texts."""
        prepared = [found for record in chunk.records
                    if (found := self.prepare(record)) is not None]
        texts = [record.value for record, _ in prepared]
        return Started((chunk, prepared),
                       helpers.start_split(self.key_texts, texts, sum(map(len, texts))))

    def finish(self, started: Started) -> Iterator[Any]:
        """The chunk's keys and unit rows once its texts are keyed; its token cache file."""
        chunk, prepared = started.chunk
        judged = [(record, source, keys)
                  for (record, source), keys in zip(prepared, started.handle(), strict=True)]
        kept = [(record_key(record, self.file_numbers), record.value, keys)
                for record, _, keys in judged if keys.reason is None]
        if judged and self.token_cache is not None:
            self.write(self._cache, cache_path(self.token_cache, chunk.chunk_id),
                       [keys.digest for _, _, keys in judged],
                       [keys.reason for _, _, keys in judged],
                       [text for _, text, _ in kept],
                       [_prepared(record, source, keys) for record, source, keys in judged])
        if not kept:
            return
        number = chunk_number(chunk.chunk_id)
        if self.config.dedup.active:
            # one element per chunk: a shuffled element costs more than its keys
            found = tuple(DocumentKeys((*key, number, keys.digest), keys.bands, keys.signature)
                          for key, _, keys in kept)
            if self.keys_dir is not None:
                self.write(write_chunk_keys, keys_path(self.keys_dir, chunk.chunk_id), found)
            yield found
        if self.config.boilerplate is not None:
            units = [(key, keys.units) for key, _, keys in kept]
            if any(found for _, found in units):
                yield beam.pvalue.TaggedOutput(UNITS, chunk_rows(units, number))

    def prepare(self, record: Record) -> tuple[Record, Record] | None:
        """The document as the steps before the quality rules leave it, and as classified;
        None for a record that is not a knowledge document the main pass would judge."""
        routed = classify(record, self.specs[record.input_index])
        if isinstance(routed, Rejection) or routed[0] != KNOWLEDGE:
            return None
        record = source = routed[1]
        for step in self.steps:
            # Nothing is known of a chunk before this pass: it is the one that writes the cache.
            judged = step.judge(record, None)
            if not isinstance(judged, Record):
                return None
            record = judged
        return record, source

    def _cache(self, path: str, digests: list[bytes], reasons: list[str | None],
               texts: list[str], prepared: list[Prepared]) -> None:
        encoded = raw_text_encoder(self.tokenizer).encode(texts, parallel=False)
        write_chunk(path, digests, reasons, encoded, prepared)


def _prepared(record: Record, source: Record, keys: TextKeys) -> Prepared:
    """What the text steps made of ``source``: found in the main pass by its text's hash (that
    of the prepared text where they changed nothing)."""
    if record.value is source.value or record.value == source.value:
        return Prepared(keys.digest, None, record.pii)
    return Prepared(text_hash(source.value), record.value, record.pii)


def key_buckets(shards: int, earlier_rows: int = 0) -> int:
    """How many buckets deduplication's keys are grouped in (``FindDuplicates``): one per
    ``SHARDS_PER_KEY_BUCKET`` input shards, and one more per ``INDEX_ROWS_PER_KEY_BUCKET`` rows of
    earlier runs' indexes (``--dedup_against``), whose keys join the same buckets: sized by the
    run alone, a bucket's memory grew with the index (BENCHMARKS.md, deduplication across
    runs)."""
    return (max(1, -(-shards // SHARDS_PER_KEY_BUCKET))
            + -(-earlier_rows // INDEX_ROWS_PER_KEY_BUCKET))


class FindCopies(beam.PTransform):
    """One branch's ``DocumentKeys`` batches in; a decision per copy among its documents to drop
    out: within the run, and with ``against`` (earlier runs' indexes, their rows of ``branch``)
    as copies of what an earlier run published (``transforms.knowledge.dedup.index``)."""

    def __init__(self, dedup: DedupConfig, shards: int, branch: str,
                 against: Sequence[str] = ()):
        super().__init__()
        self.dedup = dedup
        self.shards = shards
        self.branch = branch
        self.against = tuple(against)

    def expand(self, keys: beam.PCollection) -> beam.PCollection:
        if self.against:
            earlier = keys.pipeline | "ReadEarlierIndexes" >> ReadEarlierIndexes(self.against,
                                                                                 self.branch)
            keys = (keys, earlier) | "WithEarlierRuns" >> beam.Flatten()
        buckets = key_buckets(self.shards, index_rows(self.against))
        drops = keys | "FindDuplicates" >> FindDuplicates(self.dedup.threshold, buckets,
                                                          self.dedup.rounds)
        if self.against:
            drops = drops | "ThisRunsDecisions" >> beam.FlatMap(this_runs_decisions)
        return drops


@dataclasses.dataclass(frozen=True)
class SecondRead:
    """What deduplication's first pass needs to read the inputs again, and the staging directory
    where it leaves each document's quality verdict and token ids for the main pass."""

    shards: tuple[ShardSpec, ...]
    specs: tuple[InputSpec, ...]
    chunk_records: int
    max_record_bytes: int
    staging_dir: str

    @property
    def token_cache(self) -> str:
        return FileSystems.join(self.staging_dir, TOKEN_CACHE)

    @property
    def decisions(self) -> str:
        return FileSystems.join(self.staging_dir, DECISIONS)

    @property
    def keys(self) -> str:
        return FileSystems.join(self.staging_dir, KEYS)


def dedup_shards(shards: Sequence[ShardSpec], specs: Sequence[InputSpec]) -> list[ShardSpec]:
    """The shards deduplication reads: those of inputs not declared ``branch=instruction``."""
    instruction_only = {spec.index for spec in specs if spec.branch == INSTRUCTION}
    return [shard for shard in shards if shard.input_index not in instruction_only]


class FindDuplicateDocuments(beam.PTransform):
    """Pass one: reads the inputs again (those not declared ``branch=instruction``), writes the
    decisions of each chunk that has any (copies to drop, boilerplate to remove) to its file
    under ``decisions``, and returns those files' paths."""

    def __init__(self, shards: Sequence[ShardSpec], specs: Sequence[InputSpec],
                 chunk_records: int, max_record_bytes: int, config: KnowledgeConfig,
                 tokenizer: str, decisions: str, token_cache: str | None = None,
                 curation: BranchCuration | None = None, keys_dir: str | None = None):
        super().__init__()
        self.keys_dir = keys_dir
        self.curation = curation
        self.shards = dedup_shards(shards, specs)
        self.specs = tuple(specs)
        self.decisions = decisions
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes
        self.config = config
        self.tokenizer = tokenizer
        self.token_cache = token_cache

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = file_numbering(shard.source for shard in self.shards)
        config = self.config
        keyed = (
            pbegin
            | "ReadInputs" >> ReadInputs(self.shards, self.chunk_records, self.max_record_bytes)
            | "KeyDocuments" >> beam.ParDo(KeyDocuments(self.specs, config, files,
                                                        self.tokenizer, self.token_cache,
                                                        self.curation, self.keys_dir)
                                           ).with_outputs(UNITS, main=DROPS))
        decisions = {}
        if config.dedup.active:
            decisions[DROPS] = keyed[DROPS] | "FindCopies" >> FindCopies(
                config.dedup, len(self.shards), KNOWLEDGE, config.dedup_against)
        if config.boilerplate is not None:
            decisions[UNITS] = keyed[UNITS] | "FindBoilerplate" >> FindBoilerplate(
                config.boilerplate.min_documents, key_buckets(len(self.shards)))
        return decisions | "WriteDecisions" >> WriteDecisions(self.decisions)
