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
own in staging; the main pass's ``DropDuplicates`` reads the file of the chunk in hand. Boilerplate
shared across documents (paragraphs many documents hold) is found the same way, from the
hashes of each document's paragraphs, and removed by the same step. Its only
side input is the number of decision files written (one int): it makes the main pass wait for
them. The documents themselves are never shuffled, and no read is shared between the passes, so
Beam never has to keep a pass's chunks while the decisions are made: the main read is fused with
the steps after that side input and runs once the decisions are written.
The first pass also leaves each document's normalised and redacted text, its quality verdict
and, for those it keys, their token ids (encoded on a background thread) in the staging
directory by text hash (``transforms.knowledge.token_cache``): that pass keeps one core busy
with Python, so the other does the tokenizing, and the main pass reads texts, verdicts and ids
instead of computing them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import numpy as np

from transforms.core.chunks import Chunk
from transforms.core.lengths import length_buckets, source_length_counts
from transforms.core.packing import (
    Blocks,
    blocks_to_table,
    concat_blocks,
    cut_blocks,
    join_streams,
)
from transforms.core.records import Origin, Record, RecordChunk
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
    partitioned_id,
)
from transforms.core.tokenizer import end_of_text_id, load_tokenizer, pad_token_id
from transforms.core.vocabulary import KNOWLEDGE
from transforms.curation.decontam import Decontaminate
from transforms.curation.language import language_partition
from transforms.curation.mixing import MixSources
from transforms.curation.options import BranchCuration
from transforms.curation.scores import FilterByScore, ScoreRecords
from transforms.curation.splits import SplitOff, content_digest
from transforms.curation.urls import url_domain
from transforms.io.formats import DOCUMENTS
from transforms.knowledge.dedup.first_pass import FindDuplicateDocuments, SecondRead, dedup_shards
from transforms.knowledge.dedup.index import IndexDocuments
from transforms.knowledge.dedup.minhash import file_numbering
from transforms.knowledge.document_records import documents_table, ids_table
from transforms.knowledge.documents import DropDuplicates, document_steps
from transforms.knowledge.encoding import raw_text_encoder
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.token_cache import cache_path, lookup, read_tokens

PRETRAIN = "pretrain"
LENGTH_RANGE = "length_range"
UNSELECTED = "knowledge.documents_unselected"  # left out by mixing: not kept after all


# --------------------------------------------------------------------------- tokens and blocks


@dataclasses.dataclass(frozen=True)
class TokenizedChunk(Chunk):
    chunk_id: str
    token_arrays: tuple[np.ndarray, ...]
    records: tuple[Record, ...]  # each document as tokenized

    @property
    def origins(self) -> tuple[Origin, ...]:
        """Per document, for mixing's accounting."""
        return tuple(record.origin for record in self.records)

    def record_tokens(self) -> np.ndarray:
        """Tokens each document puts into blocks: its own plus one end-of-text."""
        return np.fromiter((len(a) + 1 for a in self.token_arrays), np.int64,
                           len(self.token_arrays))

    def record_digests(self, salt: str) -> np.ndarray:
        return np.array([content_digest(a.tobytes(), salt) for a in self.token_arrays],
                        dtype=np.uint64)

    def take(self, indices: Sequence[int]) -> TokenizedChunk:
        return TokenizedChunk(self.chunk_id, tuple(self.token_arrays[i] for i in indices),
                              tuple(self.records[i] for i in indices))

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
        self.count_domains(chunk.records, lengths)
        self.count_languages(chunk.records, lengths)
        yield TokenizedChunk(chunk.chunk_id, arrays, chunk.records)
        yield beam.pvalue.TaggedOutput(LENGTH_RANGE, (int(lengths.min()), int(lengths.max())))


    def count_domains(self, records: Sequence[Record], lengths: np.ndarray) -> None:
        """Documents and tokens kept, per domain of their URL (``--url_blocklist``'s ranking)."""
        for record, length in zip(records, lengths.tolist(), strict=True):
            domain = url_domain(record.url)
            if domain is not None:
                self.count("domains.kept")
                self.count("domains.tokens", length)
                self.count_domain(domain, "kept")
                self.count_domain(domain, "tokens", length)


    def count_languages(self, records: Sequence[Record], lengths: np.ndarray) -> None:
        """Documents and tokens per identified language (a few hundred names at most)."""
        for record, length in zip(records, lengths.tolist(), strict=True):
            if record.language is not None:
                self.count(f"language.{record.language}.documents")
                self.count(f"language.{record.language}.tokens", length)


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


class PartitionByLanguage(ChunkStep):
    """Splits a chunk's documents by language, in input order within each, so that a block
    holds one language and is written to ``pretrain/language=XX/``; each language's
    leftovers are joined apart too (``GatherTails``)."""

    step_name = "partition"

    def run(self, chunk: TokenizedChunk) -> Iterator[TokenizedChunk]:
        by_language: dict[str, list[int]] = {}
        for index, language in enumerate(r.language for r in chunk.records):
            by_language.setdefault(language, []).append(index)
        for language in sorted(by_language):
            part = chunk.take(by_language[language])
            yield dataclasses.replace(part, chunk_id=partitioned_id(
                chunk.chunk_id, language_partition(language)))


class ConcatenateBlocks(ChunkStep):
    """Joins a chunk's documents with end-of-text and cuts full ``block_size`` rows.

    The tokens after the last full block go on as the chunk's tail, to be joined with other
    chunks' tails, so at most one partial block per tail group meets the remainder policy.
    With ``stage_documents`` (Megatron's pretraining layout is asked for) or
    ``write_documents``, the documents themselves leave too, each with its end-of-text token, in
    input order: the last point where they exist whole, after every filter, split and mix. Only
    ``write_documents`` needs more than their ids (``document_records``).
    """

    step_name = "blocks"

    def __init__(self, tokenizer: str, block_size: int, stage_documents: bool = False,
                 write_documents: bool = False, score_names: tuple[str, ...] = ()):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size
        self.stage_documents = stage_documents or write_documents
        self.write_documents = write_documents
        self.score_names = score_names

    def setup(self) -> None:
        self.separator_id = end_of_text_id(load_tokenizer(self.tokenizer_spec))

    def run(self, chunk: TokenizedChunk) -> Iterator[Any]:
        blocks = concat_blocks(chunk.token_arrays, self.block_size, self.separator_id,
                               remainder="carry", sources=[o[2] for o in chunk.origins])
        self.count("knowledge.separator_tokens", len(chunk.token_arrays))
        yield from _emit(self, chunk.chunk_id, blocks)
        if len(blocks.tail.tokens):
            yield beam.pvalue.TaggedOutput(TAILS, (chunk.chunk_id, blocks.tail))
        if self.stage_documents and chunk.token_arrays:
            table = (documents_table(chunk.records, chunk.token_arrays, self.separator_id,
                                     self.score_names)
                     if self.write_documents else ids_table(chunk.token_arrays, self.separator_id))
            yield beam.pvalue.TaggedOutput(PARTS, Part(output_kind(DOCUMENTS, chunk.chunk_id),
                                                       chunk.chunk_id, "documents", table))


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

    With deduplication or boilerplate removal on, the branch reads the inputs a second time
    (``second_read``) for ``FindDuplicateDocuments``, next to the main read, and the main pass
    takes its verdicts and token ids from the token cache it leaves in staging.
    """

    def __init__(self, tokenizer: str, config: KnowledgeConfig, tails: TailPlan,
                 second_read: SecondRead, curation: BranchCuration | None = None,
                 stage_documents: bool = False):
        super().__init__()
        self.stage_documents = stage_documents
        self.tokenizer = tokenizer
        self.config = config
        self.tails = tails
        self.second_read = second_read
        self.token_cache = second_read.token_cache if config.first_pass else None
        self.curation = curation or BranchCuration()

    def _drop_duplicates(self, pipeline: beam.Pipeline) -> tuple[DropDuplicates, beam.PCollection]:
        """Deduplication's first pass; the main pass's step and its side input, the number of
        decision files written."""
        read = self.second_read
        written = (pipeline
                   | "FindDuplicateDocuments" >> FindDuplicateDocuments(
                       read.shards, read.specs, read.chunk_records, read.max_record_bytes,
                       self.config, self.tokenizer, read.decisions, self.token_cache,
                       self.curation,
                       read.keys if self.config.dedup_index and self.config.dedup.active
                       else None)
                   | "CountDecisionFiles" >> beam.combiners.Count.Globally())
        files = file_numbering(shard.source for shard in dedup_shards(read.shards, read.specs))
        return DropDuplicates(files, read.decisions, self.config), written

    def _curate(self, steps: StepChain) -> None:
        """The steps that keep, rewrite or drop documents before they are tokenized."""
        for label, step in document_steps(self.config, self.curation, self.token_cache):
            steps.then(label, step)
        if self.token_cache is not None:
            drop, written = self._drop_duplicates(steps.main.pipeline)
            steps.then("DropDuplicates", drop, side_inputs=[beam.pvalue.AsSingleton(written)])
        if self.curation.decontam is not None:
            steps.then("Decontaminate",
                       Decontaminate(self.curation.decontam, KNOWLEDGE, document_texts))
        scores = self.curation.scores
        if scores.models:
            steps.map("ScoreDocuments", ScoreRecords(scores.models))
            steps.then("FilterByScore", FilterByScore(KNOWLEDGE, scores.thresholds))

    def expand(self, chunks: beam.PCollection) -> BranchOutput:
        config, curation = self.config, self.curation
        steps = StepChain(chunks)
        if not config.tokenize_only:
            self._curate(steps)
        tokenized = steps.then("Tokenize", TokenizeDocuments(self.tokenizer, self.token_cache),
                               LENGTH_RANGE)
        if curation.validation:
            steps.add(steps.main | "SplitValidation" >> SplitOff(curation.validation,
                                                                  curation.seed))
        if curation.mix is not None:
            steps.add(steps.main | "MixSources" >> MixSources(curation.mix, UNSELECTED))
        if curation.language.partition:
            steps.then("PartitionByLanguage", PartitionByLanguage())
        if config.dedup_index and config.dedup.active:
            read = self.second_read
            files = file_numbering(shard.source
                                   for shard in dedup_shards(read.shards, read.specs))
            steps.then("IndexDocuments", IndexDocuments(KNOWLEDGE, files, read.keys))
        blocks = steps.then("ConcatenateBlocks",
                            ConcatenateBlocks(self.tokenizer, config.block_size,
                                              self.stage_documents, config.write_documents,
                                              curation.scores.names),
                            TAILS)
        steps.add(apply_step(blocks[TAILS] | "GatherTails" >> GatherTails(self.tails),
                             "ConcatenateTails",
                             ConcatenateTails(self.tokenizer, config.block_size, config.remainder)))
        length_stats = (tokenized[LENGTH_RANGE]
                        | "DocumentLengthRange" >> beam.CombineGlobally(length_range)
                        | "LengthRangeStats" >> beam.Map(_length_range_stats))
        return steps.output("KnowledgeStats", length_stats)
