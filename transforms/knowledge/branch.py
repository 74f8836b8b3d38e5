"""The knowledge-corpus branch: documents to fixed-length pretraining blocks.

Each chunk of documents goes through small steps: ``Normalize`` (one canonical text per
document), ``QualityFilter`` (Gopher/C4-style rules), ``DropDuplicates`` (exact and near copies
across the whole dataset), ``Tokenize`` (one batched call, overlapped with the steps before) and
``ConcatenateBlocks`` (documents joined in input order into blocks of exactly ``block_size``
tokens within the chunk). Each chunk's leftover tokens are joined with other chunks' leftovers
in a few ordered groups, so at most one partial block per group is dropped or padded. A dropped
document is ``filtered`` with its reason code. Rows depend only on the input. Tokens travel as
numpy int32 arrays.

Deduplication needs the whole dataset, so it runs in two passes (``FindDuplicateDocuments``):
the first reads the inputs again, shuffles only small keys per document (in batches per chunk),
resolves clusters through the shuffle and writes each chunk's drop decisions to a file of its
own in staging; the main pass's ``DropDuplicates`` reads the file of the chunk in hand. Its only
side input is the number of decision files written (one int): it makes the main pass wait for
them. The documents themselves are never shuffled, and no read is shared between the passes, so
Beam never has to keep a pass's chunks while the decisions are made: the main read is fused with
the steps after that side input and runs once the decisions are written.
The first pass also leaves each document's quality verdict and, for those it keys, their token
ids (encoded on a background thread) in the staging directory by text hash
(``transforms.knowledge.token_cache``): that pass keeps one core busy with Python, so the other
does the
tokenizing, and the main pass reads verdicts and ids instead of computing them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from transforms.classify import classify
from transforms.core.chunks import Chunk
from transforms.core.lengths import length_buckets, source_length_counts
from transforms.core.packing import Blocks, blocks_to_table, concat_blocks, cut_blocks, join_streams
from transforms.core.records import InputSpec, Origin, Record, RecordChunk, Rejection, ShardSpec
from transforms.core.steps import (
    PARTS,
    TAILS,
    BranchOutput,
    ChunkStep,
    GatherTails,
    OverlappedStep,
    Part,
    Started,
    StepChain,
    TailGroup,
    TailPlan,
    apply_step,
    output_kind,
)
from transforms.core.tokenizer import end_of_text_id, load_tokenizer, pad_token_id
from transforms.core.vocabulary import INSTRUCTION, KNOWLEDGE
from transforms.curation.decontam import Decontaminate
from transforms.curation.mixing import MixSources
from transforms.curation.options import BranchCuration
from transforms.curation.splits import SplitOff, content_digest
from transforms.io.read_inputs import ReadInputs
from transforms.io.writers import BackgroundWriter
from transforms.knowledge.dedup.components import FindDuplicates
from transforms.knowledge.dedup.decisions import DECISIONS, WriteDecisions
from transforms.knowledge.dedup.minhash import (
    DocumentKeys,
    MinHasher,
    chunk_number,
    document_keys,
    file_numbering,
    record_key,
)
from transforms.knowledge.documents import DropDuplicates, FilterQuality, document_steps
from transforms.knowledge.encoding import raw_text_encoder
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import TextStats
from transforms.knowledge.token_cache import cache_path, lookup, read_tokens, write_chunk

PRETRAIN = "pretrain"
LENGTH_RANGE = "length_range"
TOKEN_CACHE = "token-cache"  # under the staging directory: the first pass's verdicts and ids
UNSELECTED = "knowledge.documents_unselected"  # left out by mixing: not kept after all
SHARDS_PER_KEY_BUCKET = 4  # shards of up to 64 MiB: a bucket holds the keys of about 256 MiB


# --------------------------------------------------------------------------- deduplication


class KeyDocuments(BackgroundWriter):
    """Pass one of deduplication: the small keys of each document the main pass would keep.

    It judges each record as the main pass does, by ``classify`` and the same document steps
    (``document_steps``), but counts nothing: the main pass does that. With a
    ``token_cache`` directory it also writes each verdict and, encoded in the background on the
    core this pass leaves idle, the kept documents' ids, for the main pass to reuse
    (``transforms.knowledge.token_cache``).
    """

    def __init__(self, specs: Sequence[InputSpec], config: KnowledgeConfig,
                 files: Sequence[str], tokenizer: str, token_cache: str | None = None):
        self.specs = {spec.index: spec for spec in specs}
        self.config = config
        self.file_numbers = {path: number for number, path in enumerate(files)}
        self.tokenizer = tokenizer
        self.token_cache = token_cache
        self.steps = [step for _, step in document_steps(config)]

    def setup(self) -> None:
        super().setup()
        dedup_config = self.config.dedup
        self.hasher = MinHasher(dedup_config.num_perm) if dedup_config.near else None

    def process(self, chunk: RecordChunk) -> Iterator[tuple[DocumentKeys, ...]]:
        judged = [(record, found) for record in chunk.records
                  if (found := self.judge(record)) is not None]
        kept = [(record, stats) for record, (stats, reason) in judged if reason is None]
        if judged and self.token_cache is not None:
            self.write(self._cache, cache_path(self.token_cache, chunk.chunk_id),
                       [stats.digest for _, (stats, _) in judged],
                       [reason for _, (_, reason) in judged],
                       [stats.text for _, stats in kept])
        chunk = chunk_number(chunk.chunk_id)
        keys = tuple(document_keys(record_key(record, self.file_numbers), chunk, stats,
                                   self.config.dedup, self.hasher) for record, stats in kept)
        if keys:
            yield keys  # one element per chunk: a shuffled element costs more than its keys

    def judge(self, record: Record) -> tuple[TextStats, str | None] | None:
        """The normalised document and its quality verdict (a reason code, or None to keep
        it); None for a record that is not a knowledge document the main pass would judge."""
        routed = classify(record, self.specs[record.input_index])
        if isinstance(routed, Rejection) or routed[0] != KNOWLEDGE:
            return None
        record = routed[1]
        for step in self.steps:
            if isinstance(step, FilterQuality):  # the verdict is kept, with the text's stats
                stats = TextStats(record.value)
                return stats, step.verdict(stats)
            judged = step.judge(record)
            if not isinstance(judged, Record):
                return None
            record = judged
        return TextStats(record.value), None

    def _cache(self, path: str, digests: list[bytes], reasons: list[str | None],
               texts: list[str]) -> None:
        encoded = raw_text_encoder(self.tokenizer).encode(texts, parallel=False)
        write_chunk(path, digests, reasons, encoded)


def key_buckets(shards: int) -> int:
    """How many buckets deduplication's keys are grouped in (``FindDuplicates``)."""
    return max(1, -(-shards // SHARDS_PER_KEY_BUCKET))


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


def dedup_shards(shards: Sequence[ShardSpec], specs: Sequence[InputSpec]) -> list[ShardSpec]:
    """The shards deduplication reads: those of inputs not declared ``branch=instruction``."""
    instruction_only = {spec.index for spec in specs if spec.branch == INSTRUCTION}
    return [shard for shard in shards if shard.input_index not in instruction_only]


class FindDuplicateDocuments(beam.PTransform):
    """Pass one: reads the inputs again (those not declared ``branch=instruction``), writes the
    drop decisions of each chunk that has any to its file under ``decisions``, and returns
    those files' paths."""

    def __init__(self, shards: Sequence[ShardSpec], specs: Sequence[InputSpec],
                 chunk_records: int, max_record_bytes: int, config: KnowledgeConfig,
                 tokenizer: str, decisions: str, token_cache: str | None = None):
        super().__init__()
        self.shards = dedup_shards(shards, specs)
        self.specs = tuple(specs)
        self.decisions = decisions
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes
        self.config = config
        self.tokenizer = tokenizer
        self.token_cache = token_cache

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = file_numbering(shard.path for shard in self.shards)
        return (
            pbegin
            | "ReadInputs" >> ReadInputs(self.shards, self.chunk_records, self.max_record_bytes)
            | "KeyDocuments" >> beam.ParDo(KeyDocuments(self.specs, self.config, files,
                                                        self.tokenizer, self.token_cache))
            | "FindDuplicates" >> FindDuplicates(self.config.dedup.threshold,
                                                 key_buckets(len(self.shards)),
                                                 self.config.dedup.rounds)
            | "WriteDecisions" >> WriteDecisions(self.decisions))


# --------------------------------------------------------------------------- tokens and blocks


@dataclasses.dataclass(frozen=True)
class TokenizedChunk(Chunk):
    chunk_id: str
    token_arrays: tuple[np.ndarray, ...]
    origins: tuple[Origin, ...] = ()  # per document, for mixing's accounting

    def record_tokens(self) -> np.ndarray:
        """Tokens each document puts into blocks: its own plus one end-of-text."""
        return np.fromiter((len(a) + 1 for a in self.token_arrays), np.int64,
                           len(self.token_arrays))

    def record_digests(self, salt: str) -> np.ndarray:
        return np.array([content_digest(a.tobytes(), salt) for a in self.token_arrays],
                        dtype=np.uint64)

    def take(self, indices: Sequence[int]) -> TokenizedChunk:
        return TokenizedChunk(self.chunk_id, tuple(self.token_arrays[i] for i in indices),
                              tuple(self.origins[i] for i in indices))

    def counts(self) -> dict[str, int]:
        return {"knowledge.documents": len(self.token_arrays),
                "knowledge.tokens": sum(len(a) for a in self.token_arrays)}


class TokenizeDocuments(OverlappedStep):
    """Tokenizes a chunk's documents in one batch; reports their lengths. The batch is encoded
    in the background while the steps before prepare the next chunk (``OverlappedStep``), and
    only for documents whose ids deduplication's first pass did not leave in ``token_cache``.
    """

    step_name = "tokenize"

    def __init__(self, tokenizer: str, token_cache: str | None = None):
        self.tokenizer_spec = tokenizer
        self.token_cache = token_cache

    def setup(self) -> None:
        self.background = ThreadPoolExecutor(1)

    def teardown(self) -> None:
        self.background.shutdown()

    def start(self, chunk: RecordChunk) -> Future:
        return self.background.submit(self.tokens, chunk)

    def tokens(self, chunk: RecordChunk) -> tuple[np.ndarray, ...]:
        texts = document_texts(chunk)
        cached = (read_tokens(cache_path(self.token_cache, chunk.chunk_id))
                  if self.token_cache is not None else {})
        found = lookup(cached, texts)
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:  # the encoder is made on first use: a run may never need one
            encoded = raw_text_encoder(self.tokenizer_spec).encode([texts[i] for i in missing])
            for i, ids in zip(missing, encoded, strict=True):
                found[i] = ids
        return tuple(found)

    def run(self, started: Started) -> Iterator[Any]:
        chunk = started.chunk
        arrays = started.handle.result()
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        self.count("knowledge.documents", len(arrays))
        self.count("knowledge.tokens", int(lengths.sum()))
        for bound, count in zip(*np.unique(length_buckets(lengths), return_counts=True),
                                strict=True):
            self.count(f"knowledge.document_tokens.le_{bound}", int(count))
        self.distribution("knowledge.document_tokens", lengths)
        for name, count in source_length_counts(
                KNOWLEDGE, lengths, (r.input_index for r in chunk.records)).items():
            self.count(name, count)
        yield TokenizedChunk(chunk.chunk_id, arrays, tuple(r.origin for r in chunk.records))
        yield beam.pvalue.TaggedOutput(LENGTH_RANGE, (int(lengths.min()), int(lengths.max())))


def length_range(ranges: Iterable[tuple[int, int] | tuple[()]]) -> tuple[int, int] | tuple[()]:
    """(shortest, longest) over per-chunk ranges; () for none. Combines partial results too."""
    found = [r for r in ranges if r]
    if not found:
        return ()
    return min(r[0] for r in found), max(r[1] for r in found)


def _length_range_stats(found: tuple[int, int] | tuple[()]) -> dict[str, int]:
    if not found:
        return {}
    return {"knowledge.document_tokens_min": found[0], "knowledge.document_tokens_max": found[1]}


class ConcatenateBlocks(ChunkStep):
    """Joins a chunk's documents with end-of-text and cuts full ``block_size`` rows.

    The tokens after the last full block go on as the chunk's tail, to be joined with other
    chunks' tails, so at most one partial block per tail group meets the remainder policy.
    """

    step_name = "blocks"

    def __init__(self, tokenizer: str, block_size: int):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size

    def setup(self) -> None:
        self.separator_id = end_of_text_id(load_tokenizer(self.tokenizer_spec))

    def run(self, chunk: TokenizedChunk) -> Iterator[Any]:
        blocks = concat_blocks(chunk.token_arrays, self.block_size, self.separator_id,
                               remainder="carry")
        self.count("knowledge.separator_tokens", len(chunk.token_arrays))
        yield from _emit(self, chunk.chunk_id, blocks)
        if len(blocks.tail.tokens):
            yield beam.pvalue.TaggedOutput(TAILS, (chunk.chunk_id, blocks.tail))


class ConcatenateTails(ChunkStep):
    """Cuts the joined tails of several chunks into blocks; applies the remainder policy."""

    step_name = "tail-blocks"

    def __init__(self, tokenizer: str, block_size: int, remainder: str):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size
        self.remainder = remainder

    def setup(self) -> None:
        self.pad_id = pad_token_id(load_tokenizer(self.tokenizer_spec))

    def run(self, group: TailGroup) -> Iterator[Any]:
        blocks = cut_blocks(join_streams(group.items), self.block_size, self.remainder,
                            self.pad_id)
        self.count("knowledge.remainder_tokens", blocks.remainder_tokens)
        self.count("knowledge.pad_tokens", blocks.pad_tokens)
        yield from _emit(self, group.chunk_id, blocks)


def _emit(step: ChunkStep, chunk_id: str, blocks: Blocks) -> Iterator[Any]:
    step.count("knowledge.blocks", len(blocks.input_ids))
    step.count("knowledge.tokens_out", blocks.tokens_out)
    if len(blocks.input_ids):
        yield beam.pvalue.TaggedOutput(PARTS, Part(output_kind(PRETRAIN, chunk_id), chunk_id,
                                                   step.step_name, blocks_to_table(blocks)))


def document_texts(chunk: RecordChunk) -> list[str]:
    return [record.value for record in chunk.records]


class KnowledgeBranch(beam.PTransform):
    """Knowledge chunks in; each step's parts (pretraining blocks, dropped records) and stats
    out. The parts stay apart so that each is staged where it is made (see build_graph).

    With deduplication on, the branch reads the inputs a second time (``second_read``) for
    ``FindDuplicateDocuments``, next to the main read, and the main pass takes its verdicts and
    token ids from the token cache it leaves in staging.
    """

    def __init__(self, tokenizer: str, config: KnowledgeConfig, tails: TailPlan,
                 second_read: SecondRead, curation: BranchCuration | None = None):
        super().__init__()
        self.tokenizer = tokenizer
        self.config = config
        self.tails = tails
        self.second_read = second_read
        self.token_cache = None if config.dedup.mode == "none" else second_read.token_cache
        self.curation = curation or BranchCuration()

    def _drop_duplicates(self, pipeline: beam.Pipeline) -> tuple[DropDuplicates, beam.PCollection]:
        """Deduplication's first pass; the main pass's step and its side input, the number of
        decision files written."""
        read = self.second_read
        written = (pipeline
                   | "FindDuplicateDocuments" >> FindDuplicateDocuments(
                       read.shards, read.specs, read.chunk_records, read.max_record_bytes,
                       self.config, self.tokenizer, read.decisions, self.token_cache)
                   | "CountDecisionFiles" >> beam.combiners.Count.Globally())
        files = file_numbering(shard.path for shard in dedup_shards(read.shards, read.specs))
        return DropDuplicates(files, read.decisions), written

    def expand(self, chunks: beam.PCollection) -> BranchOutput:
        config, curation = self.config, self.curation
        steps = StepChain(chunks)
        for label, step in document_steps(config, self.token_cache):
            steps.then(label, step)
        if self.token_cache is not None:
            drop, written = self._drop_duplicates(chunks.pipeline)
            steps.then("DropDuplicates", drop, side_inputs=[beam.pvalue.AsSingleton(written)])
        if curation.decontam is not None:
            steps.then("Decontaminate",
                       Decontaminate(curation.decontam, KNOWLEDGE, document_texts))
        tokenized = steps.then("Tokenize", TokenizeDocuments(self.tokenizer, self.token_cache),
                               LENGTH_RANGE)
        if curation.validation:
            steps.add(steps.main | "SplitValidation" >> SplitOff(curation.validation,
                                                                  curation.seed))
        if curation.mix is not None:
            steps.add(steps.main | "MixSources" >> MixSources(curation.mix, UNSELECTED))
        blocks = steps.then("ConcatenateBlocks",
                            ConcatenateBlocks(self.tokenizer, config.block_size), TAILS)
        steps.add(apply_step(blocks[TAILS] | "GatherTails" >> GatherTails(self.tails),
                             "ConcatenateTails",
                             ConcatenateTails(self.tokenizer, config.block_size, config.remainder)))
        length_stats = (tokenized[LENGTH_RANGE]
                        | "DocumentLengthRange" >> beam.CombineGlobally(length_range)
                        | "LengthRangeStats" >> beam.Map(_length_range_stats))
        return steps.output("KnowledgeStats", length_stats)
