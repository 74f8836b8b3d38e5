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
the first reads the inputs again and shuffles only small keys per document (in batches per
chunk); the main pass drops the copies it names, chunk by chunk, with that small
``DuplicateIndex`` as a side input. The documents themselves are never shuffled, and no read is
shared between the passes, so Beam never has to keep a pass's chunks while the index is built:
the main read is fused with the steps after the side input and runs once the index is ready.
The first pass also leaves each document's quality verdict and, for those it keys, their token
ids (encoded on a background thread) in the staging directory by text hash
(``transforms.token_cache``): that pass keeps one core busy with Python, so the other does the
tokenizing, and the main pass reads verdicts and ids instead of computing them again.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from transforms.chunks import Chunk
from transforms.classify import classify
from transforms.curation import BranchCuration
from transforms.decontam import Decontaminate
from transforms.dedup import (
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
    MODES,
    DedupConfig,
    DocumentKeys,
    DuplicateIndex,
    FindDuplicates,
    MinHasher,
    document_keys,
    record_key,
)
from transforms.fast_encoder import fast_raw_encoder
from transforms.mixing import MixSources
from transforms.normalize import NormalizeConfig, normalize_text
from transforms.option_types import boolean, fraction, non_negative_int, positive_int
from transforms.packing import Blocks, blocks_to_table, concat_blocks, cut_blocks, join_streams
from transforms.quality import (
    QualityConfig,
    TextStats,
    describe,
    first_failure,
    format_ngram_limits,
    parse_ngram_limits,
)
from transforms.read_inputs import ReadInputs
from transforms.records import (
    INSTRUCTION,
    KNOWLEDGE,
    InputSpec,
    Origin,
    Record,
    RecordChunk,
    Rejection,
    ShardSpec,
)
from transforms.splits import SplitOff, content_digest
from transforms.steps import (
    PARTS,
    STATS,
    TAILS,
    ChunkStep,
    GatherTails,
    OverlappedStep,
    Part,
    Started,
    TailGroup,
    TailPlan,
    apply_step,
    output_kind,
)
from transforms.token_cache import cache_path, lookup, read_tokens, read_verdicts, write_chunk
from transforms.tokenizer import end_of_text_id, load_tokenizer, private_backend
from transforms.writers import BackgroundWriter

PRETRAIN = "pretrain"
FILTERED = "filtered"
GROUP = "knowledge branch"
EMPTY_AFTER_NORMALIZATION = "empty_after_normalization"
LENGTH_RANGE = "length_range"
UNSELECTED = "knowledge.documents_unselected"  # left out by mixing: not kept after all
_UNKNOWN = object()  # no verdict from the first pass
SHARDS_PER_KEY_BUCKET = 4  # shards of up to 64 MiB: a bucket holds the keys of about 256 MiB


# --------------------------------------------------------------------------- options


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def ngram_limits(text: str) -> tuple[tuple[int, float], ...]:
    try:
        return parse_ngram_limits(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_QUALITY = QualityConfig()
_DEDUP = DedupConfig()
# (QualityConfig field, argparse type, help): each becomes --FIELD=VALUE.
_QUALITY_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("min_words", non_negative_int, "Fewest words a document may have (too_few_words). A word "
     "is a run of letters, marks and digits; each Han or kana character counts as one."),
    ("max_words", non_negative_int, "Most words a document may have (too_many_words); 0: no "
     "limit."),
    ("min_mean_word_length", non_negative_float, "Shortest mean word length, in characters "
     "(mean_word_length). Skipped for documents of under 10 words or written mostly in Han, "
     "kana, Hangul or scripts without spaces."),
    ("max_mean_word_length", non_negative_float, "Longest mean word length (mean_word_length); "
     "0: no limit."),
    ("max_symbol_word_ratio", non_negative_float, "Most '#' signs and ellipses per word "
     "(symbol_ratio); 0: no limit."),
    ("max_ellipsis_lines", fraction, "Largest share of lines that end in an ellipsis "
     "(ellipsis_lines; documents of 3 lines or more); 0: no limit."),
    ("max_bullet_lines", fraction, "Largest share of lines that start with a bullet "
     "(bullet_lines; documents of 3 lines or more); 0: no limit."),
    ("min_alpha_fraction", fraction, "Smallest share of letters among the non-space "
     "characters (low_alpha_fraction)."),
    ("max_duplicate_lines", fraction, "Largest share of lines that repeat an earlier line "
     "(duplicate_lines); 0: no limit."),
    ("max_duplicate_line_chars", fraction, "Largest share of characters in repeated lines "
     "(duplicate_lines); 0: no limit."),
    ("max_duplicate_paragraphs", fraction, "Largest share of paragraphs that repeat an earlier "
     "one (duplicate_paragraphs); 0: no limit."),
    ("max_duplicate_paragraph_chars", fraction, "Largest share of characters in repeated "
     "paragraphs (duplicate_paragraphs); 0: no limit."),
    ("max_top_ngram", ngram_limits, "n:share,...: for each n, the largest share of word "
     "characters that the most frequent word n-gram (if seen 3 times or more) may cover "
     "(repeated_top_ngram); empty: off."),
    ("max_duplicate_ngrams", ngram_limits, "n:share,...: for each n, the largest share of word "
     "characters inside n-grams that occurred before (duplicate_ngrams); empty: off."),
)


def _shown(value: Any) -> str:
    """A default as it is typed on the command line."""
    return format_ngram_limits(value) if isinstance(value, tuple) else str(value)


class KnowledgeOptions(PipelineOptions):
    """Options of the knowledge branch."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(GROUP)
        group.add_argument(
            "--block_size", type=positive_int, default=2048,
            help="Tokens per pretraining block (default 2048).")
        group.add_argument(
            "--remainder", choices=("drop", "pad"), default="drop",
            help="The tokens left after the last full block (at most one block's worth per "
            "group of chunks): drop them (default) or pad the block; the manifest reports the "
            "cost either way.")
        group.add_argument(
            "--normalize", type=boolean, default=True,
            help="Normalise documents before anything else (default true): Unicode NFC, "
            "control and zero-width characters and byte-order marks removed, every line break "
            "as LF, plus the two options below. A document left empty is filtered as "
            f"{EMPTY_AFTER_NORMALIZATION}.")
        group.add_argument(
            "--collapse_whitespace", type=boolean, default=True,
            help="With --normalize: one space between words, at most one blank line between "
            "paragraphs, no trailing spaces; indentation is kept (default true; set false for "
            "code or other text whose spacing matters).")
        group.add_argument(
            "--strip_gutenberg", type=boolean, default=True,
            help="With --normalize: cut the Project Gutenberg licence header and footer from "
            "documents that carry their markers (default true).")
        group.add_argument(
            "--quality_filter", type=boolean, default=True,
            help="Drop documents that fail a Gopher/C4-style quality rule (default true); each "
            "rule is set by its own option below and drops with its own reason code.")
        for name, kind, text in _QUALITY_OPTIONS:
            default = _shown(getattr(_QUALITY, name))  # argparse parses a str default with kind
            group.add_argument(f"--{name}", type=kind, default=default,
                               help=f"{text} Default {default}.")
        group.add_argument(
            "--dedup", choices=MODES, default=_DEDUP.mode,
            help="Deduplicate across the whole dataset: 'near' drops exact copies "
            f"({DUPLICATE_EXACT}) and near copies found with MinHash and LSH "
            f"({DUPLICATE_NEAR}), 'exact' only exact copies of the normalised text, "
            "'none' nothing. The copy with the smallest (input, source, position) survives. "
            f"Default {_DEDUP.mode}.")
        group.add_argument(
            "--dedup_ngram", type=positive_int, default=_DEDUP.ngram,
            help=f"Words per MinHash shingle (default {_DEDUP.ngram}).")
        group.add_argument(
            "--dedup_num_perm", type=positive_int, default=_DEDUP.num_perm,
            help=f"MinHash values per document (default {_DEDUP.num_perm}).")
        group.add_argument(
            "--dedup_bands", type=positive_int, default=_DEDUP.bands,
            help="LSH bands; --dedup_num_perm must be a multiple. More bands find more "
            f"candidate pairs at lower similarity (default {_DEDUP.bands}).")
        group.add_argument(
            "--dedup_threshold", type=fraction, default=_DEDUP.threshold,
            help="Estimated Jaccard similarity of the shingle sets at or above which a "
            f"candidate pair is a near copy (default {_DEDUP.threshold}).")
        group.add_argument(
            "--write_filtered", type=boolean, default=False,
            help="Also write the records dropped by policy (quality, duplicates, too_long) "
            "to filtered/ with their reason (default false: only counted in the manifest).")


@dataclasses.dataclass(frozen=True)
class KnowledgeConfig:
    """The branch's settings; ``normalize`` or ``quality`` None turns that step off."""

    block_size: int
    remainder: str
    normalize: NormalizeConfig | None = dataclasses.field(default_factory=NormalizeConfig)
    quality: QualityConfig | None = dataclasses.field(default_factory=QualityConfig)
    dedup: DedupConfig = dataclasses.field(default_factory=DedupConfig)
    write_filtered: bool = False

    @classmethod
    def from_options(cls, options: PipelineOptions) -> KnowledgeConfig:
        view = options.view_as(KnowledgeOptions)
        return cls(
            block_size=view.block_size,
            remainder=view.remainder,
            normalize=NormalizeConfig(view.collapse_whitespace, view.strip_gutenberg)
            if view.normalize else None,
            quality=QualityConfig(**{name: getattr(view, name) for name, _, _ in
                                     _QUALITY_OPTIONS}) if view.quality_filter else None,
            dedup=DedupConfig(view.dedup, view.dedup_ngram, view.dedup_num_perm,
                                    view.dedup_bands, view.dedup_threshold),
            write_filtered=view.write_filtered,
        )


# --------------------------------------------------------------------------- document steps


class DocumentStep(ChunkStep):
    """A step that keeps, rewrites or drops (as ``filtered``) each document of a chunk."""

    def run(self, chunk: RecordChunk) -> Iterator[RecordChunk]:
        kept = []
        for record in chunk.records:
            verdict = self.judge(record)
            if isinstance(verdict, Record):
                kept.append(verdict)
            else:
                reason, message = verdict
                self.drop(Rejection.of(record, reason, message), kind=FILTERED)
                self.count(f"knowledge.dropped.{reason}")
        if kept:
            yield RecordChunk(chunk.chunk_id, tuple(kept))

    def judge(self, record: Record) -> Record | tuple[str, str]:
        """The record to keep (possibly rewritten) or (reason code, message) to drop it."""
        raise NotImplementedError


class NormalizeDocuments(DocumentStep):
    step_name = "normalize"

    def __init__(self, config: NormalizeConfig):
        self.config = config

    def judge(self, record: Record) -> Record | tuple[str, str]:
        text = normalize_text(record.value, self.config)
        if not text:
            return EMPTY_AFTER_NORMALIZATION, "no text left after normalisation"
        return dataclasses.replace(record, value=text)


class FilterQuality(DocumentStep):
    """The quality rules; a verdict that deduplication's first pass left in ``token_cache``
    is taken from there."""

    step_name = "quality"

    def __init__(self, config: QualityConfig, token_cache: str | None = None):
        self.config = config
        self.token_cache = token_cache

    def process(self, chunk: RecordChunk) -> Iterator[Any]:
        self.known = (read_verdicts(cache_path(self.token_cache, chunk.chunk_id))
                      if self.token_cache is not None else {})
        yield from super().process(chunk)

    def judge(self, record: Record) -> Record | tuple[str, str]:
        stats = TextStats(record.value)
        reason = self.known.get(stats.digest, _UNKNOWN)
        if reason is _UNKNOWN:
            reason = first_failure(stats, self.config)
        return record if reason is None else (reason, describe(reason, self.config))


class DropDuplicates(DocumentStep):
    """Drops the copies that ``FindDuplicateDocuments`` named (its ``DuplicateIndex`` is the
    side input)."""

    step_name = "dedup"

    def process(self, chunk: RecordChunk, duplicates: DuplicateIndex) -> Iterator[Any]:
        self.duplicates = duplicates
        yield from super().process(chunk)

    def judge(self, record: Record) -> Record | tuple[str, str]:
        return self.duplicates.verdict(record) or record


# --------------------------------------------------------------------------- deduplication


class KeyDocuments(BackgroundWriter):
    """Pass one of deduplication: the small keys of each document the main pass would keep.

    It repeats the main pass's decisions with the same pure functions (``classify``,
    ``normalize_text``, the quality rules), but counts nothing: the main pass does that. With a
    ``token_cache`` directory it also writes each verdict and, encoded in the background on the
    core this pass leaves idle, the kept documents' ids, for the main pass to reuse
    (``transforms.token_cache``).
    """

    def __init__(self, specs: Sequence[InputSpec], config: KnowledgeConfig,
                 files: Sequence[str], tokenizer: str, token_cache: str | None = None):
        self.specs = {spec.index: spec for spec in specs}
        self.config = config
        self.file_numbers = {path: number for number, path in enumerate(files)}
        self.tokenizer = tokenizer
        self.token_cache = token_cache

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
        keys = tuple(document_keys(record_key(record, self.file_numbers), stats,
                                   self.config.dedup, self.hasher) for record, stats in kept)
        if keys:
            yield keys  # one element per chunk: a shuffled element costs more than its keys

    def judge(self, record: Record) -> tuple[TextStats, str | None] | None:
        """The normalised document and its quality verdict (a reason code, or None to keep
        it); None for a record that is not a knowledge document the main pass would judge."""
        routed = classify(record, self.specs[record.input_index])
        if isinstance(routed, Rejection) or routed[0] != KNOWLEDGE:
            return None
        text = routed[1].value
        if self.config.normalize is not None:
            text = normalize_text(text, self.config.normalize)
            if not text:
                return None
        stats = TextStats(text)
        quality = self.config.quality
        return stats, None if quality is None else first_failure(stats, quality)

    def _cache(self, path: str, digests: list[bytes], reasons: list[str | None],
               texts: list[str]) -> None:
        encoded = raw_text_encoder(self.tokenizer).encode(texts, parallel=False)
        write_chunk(path, digests, reasons, encoded)


def key_buckets(shards: int) -> int:
    """How many buckets deduplication's keys are grouped in (``FindDuplicates``)."""
    return max(1, -(-shards // SHARDS_PER_KEY_BUCKET))


class FindDuplicateDocuments(beam.PTransform):
    """Pass one: reads the inputs again (those not declared ``branch=instruction``) and returns
    one dict of the record keys to drop."""

    def __init__(self, shards: Sequence[ShardSpec], specs: Sequence[InputSpec],
                 chunk_records: int, max_record_bytes: int, config: KnowledgeConfig,
                 tokenizer: str, token_cache: str | None = None):
        super().__init__()
        instruction_only = {spec.index for spec in specs if spec.branch == INSTRUCTION}
        self.shards = [shard for shard in shards if shard.input_index not in instruction_only]
        self.specs = tuple(specs)
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes
        self.config = config
        self.tokenizer = tokenizer
        self.token_cache = token_cache

    def expand(self, pbegin):
        files = DuplicateIndex.numbering(shard.path for shard in self.shards)
        return (
            pbegin
            | "ReadInputs" >> ReadInputs(self.shards, self.chunk_records, self.max_record_bytes)
            | "KeyDocuments" >> beam.ParDo(KeyDocuments(self.specs, self.config, files,
                                                        self.tokenizer, self.token_cache))
            | "FindDuplicates" >> FindDuplicates(self.config.dedup.threshold,
                                                 key_buckets(len(self.shards)))
            | "Index" >> beam.Map(lambda drops: DuplicateIndex(files, drops)))


# --------------------------------------------------------------------------- tokens and blocks


class RawTextEncoder:
    """Batch encoding of raw documents with the tokenizer's own special-token policy.

    Literal control-token strings (``<|im_start|>`` in a web page) stay plain text, like
    ``split_special_tokens=True``; the flag is set on a private copy of the backend, because the
    shared tokenizer serves the instruction branch, which needs them parsed. The tokenizer adds
    its BOS where its family uses one; an end-of-text it appends itself is removed, since
    ``ConcatenateBlocks`` ends every document with exactly one.

    For the offline default tokenizer, proven by ``fast_raw_encoder``, tiktoken encodes with the
    same ids several times faster, and the private backend is only made if a text needs it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.shared_backend = tokenizer.backend_tokenizer
        self.fast = fast_raw_encoder(self.shared_backend, self._encode_with_backend)
        self.end = None
        if self.fast is None:
            probe = self.backend.encode("a", add_special_tokens=True).ids
            self.end = -1 if probe and probe[-1] == end_of_text_id(tokenizer) else None

    @functools.cached_property
    def backend(self) -> Tokenizer:
        return private_backend(self.shared_backend, encode_special_tokens=True)

    def _encode_with_backend(self, text: str) -> list[int]:
        return self.backend.encode_batch_fast([text], add_special_tokens=True)[0].ids

    def encode(self, texts: list[str], parallel: bool = True) -> tuple[np.ndarray, ...]:
        """Ids per text; ``parallel=False`` keeps tiktoken on the calling thread (a caller
        that runs beside busy Python on the main thread should take one core, not all)."""
        if self.fast is not None:
            return self.fast.encode_arrays(texts, parallel)
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=True)
        return tuple(np.asarray(encoding.ids[:self.end], dtype=np.int32)
                     for encoding in encodings)


@functools.cache
def raw_text_encoder(tokenizer: str) -> RawTextEncoder:
    """One encoder per process and tokenizer, like ``load_tokenizer``."""
    return RawTextEncoder(load_tokenizer(tokenizer))


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
        yield TokenizedChunk(chunk.chunk_id, arrays, tuple(r.origin for r in chunk.records))
        yield beam.pvalue.TaggedOutput(LENGTH_RANGE, (int(lengths.min()), int(lengths.max())))


def length_buckets(lengths: np.ndarray) -> np.ndarray:
    """The power of two at or above each length: the manifest's length histogram.

    >>> length_buckets(np.array([1, 2, 3, 64, 65])).tolist()
    [1, 2, 4, 64, 128]
    """
    _, exponents = np.frexp(np.maximum(lengths - 1, 0))
    return np.left_shift(1, exponents)


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
        tokenizer = load_tokenizer(self.tokenizer_spec)
        self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else end_of_text_id(tokenizer))

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

    ``duplicates`` is ``FindDuplicateDocuments``' output, or None when deduplication is off.
    """

    def __init__(self, tokenizer: str, config: KnowledgeConfig, tails: TailPlan,
                 duplicates: beam.PCollection | None = None,
                 curation: BranchCuration | None = None, token_cache: str | None = None):
        super().__init__()
        self.tokenizer = tokenizer
        self.token_cache = token_cache
        self.config = config
        self.tails = tails
        self.duplicates = duplicates
        self.curation = curation or BranchCuration()

    def expand(self, chunks):
        config = self.config
        steps = []
        documents = chunks
        if config.normalize is not None:
            steps.append(apply_step(documents, "Normalize", NormalizeDocuments(config.normalize)))
            documents = steps[-1].main
        if config.quality is not None:
            steps.append(apply_step(documents, "QualityFilter",
                                    FilterQuality(config.quality, self.token_cache)))
            documents = steps[-1].main
        if self.duplicates is not None:
            steps.append(apply_step(documents, "DropDuplicates", DropDuplicates(),
                                    side_inputs=[beam.pvalue.AsSingleton(self.duplicates)]))
            documents = steps[-1].main
        curation = self.curation
        if curation.decontam is not None:
            steps.append(apply_step(documents, "Decontaminate",
                                    Decontaminate(curation.decontam, KNOWLEDGE, document_texts)))
            documents = steps[-1].main
        tokenized = apply_step(documents, "Tokenize",
                               TokenizeDocuments(self.tokenizer, self.token_cache), LENGTH_RANGE)
        tokens = tokenized.main
        if curation.validation:
            steps.append(tokens | "SplitValidation" >> SplitOff(curation.validation,
                                                                 curation.seed))
            tokens = steps[-1].main
        if curation.mix is not None:
            steps.append(tokens | "MixSources" >> MixSources(curation.mix, UNSELECTED))
            tokens = steps[-1].main
        blocks = apply_step(tokens, "ConcatenateBlocks",
                            ConcatenateBlocks(self.tokenizer, config.block_size), TAILS)
        tails = apply_step(
            blocks[TAILS] | "GatherTails" >> GatherTails(self.tails),
            "ConcatenateTails",
            ConcatenateTails(self.tokenizer, config.block_size, config.remainder))
        length_stats = (
            tokenized[LENGTH_RANGE]
            | "DocumentLengthRange" >> beam.CombineGlobally(length_range)
            | "LengthRangeStats" >> beam.Map(_length_range_stats))
        steps += (tokenized, blocks, tails)
        parts = tuple(s[PARTS] for s in steps)
        stats = ((*(s[STATS] for s in steps), length_stats)
                 | "KnowledgeStats" >> beam.Flatten())
        return parts, stats
