"""The steps that keep, rewrite or drop each knowledge document of a chunk, in their own module
because both passes judge by them: the main pass as steps, deduplication's first pass
(``KeyDocuments``) document by document."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from transforms.core.records import Record, RecordChunk, Rejection
from transforms.core.steps import ChunkStep
from transforms.core.vocabulary import EMPTY_AFTER_NORMALIZATION, FILTERED, Drop
from transforms.knowledge.dedup.decisions import ChunkDecisions, decisions_path
from transforms.knowledge.dedup.minhash import chunk_number
from transforms.knowledge.normalize import NormalizeConfig, normalize_text
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import QualityConfig, TextStats, describe, first_failure
from transforms.knowledge.token_cache import cache_path, read_verdicts

_UNKNOWN = object()  # no verdict from the first pass


class DocumentStep(ChunkStep):
    """A step that keeps, rewrites or drops (as ``filtered``) each document of a chunk."""

    def run(self, chunk: RecordChunk) -> Iterator[RecordChunk]:
        kept = []
        for record in chunk.records:
            verdict = self.judge(record)
            if isinstance(verdict, Record):
                kept.append(verdict)
            else:
                self.drop(Rejection.of(record, verdict.reason, verdict.message), kind=FILTERED)
                self.count(f"knowledge.dropped.{verdict.reason}")
        if kept:
            yield RecordChunk(chunk.chunk_id, tuple(kept))

    def judge(self, record: Record) -> Record | Drop:
        """The record to keep (possibly rewritten) or the ``Drop`` that says why it goes."""
        raise NotImplementedError


class NormalizeDocuments(DocumentStep):
    step_name = "normalize"

    def __init__(self, config: NormalizeConfig):
        self.config = config

    def judge(self, record: Record) -> Record | Drop:
        text = normalize_text(record.value, self.config)
        if not text:
            return Drop(EMPTY_AFTER_NORMALIZATION, "no text left after normalisation")
        return dataclasses.replace(record, value=text)


class FilterQuality(DocumentStep):
    """The quality rules; a verdict that deduplication's first pass left in ``token_cache``
    is taken from there."""

    step_name = "quality"

    def __init__(self, config: QualityConfig, token_cache: str | None = None):
        self.config = config
        self.token_cache = token_cache
        self.known: dict[bytes, str | None] = {}  # verdicts the first pass left for this chunk

    def process(self, chunk: RecordChunk) -> Iterator[Any]:
        self.known = (read_verdicts(cache_path(self.token_cache, chunk.chunk_id))
                      if self.token_cache is not None else {})
        yield from super().process(chunk)

    def verdict(self, stats: TextStats) -> str | None:
        """The first rule the document fails (a reason code), or None to keep it."""
        reason = self.known.get(stats.digest, _UNKNOWN)
        return first_failure(stats, self.config) if reason is _UNKNOWN else reason

    def judge(self, record: Record) -> Record | Drop:
        reason = self.verdict(TextStats(record.value))
        return record if reason is None else Drop(reason, describe(reason, self.config))


def document_steps(config: KnowledgeConfig, token_cache: str | None = None
                   ) -> list[tuple[str, DocumentStep]]:
    """The steps a knowledge document meets before deduplication, in order, with their labels.

    The main pass applies them as steps; deduplication's first pass judges every document by the
    same steps (``KeyDocuments``), so a step added here is taken by both.
    """
    steps: list[tuple[str, DocumentStep]] = []
    if config.normalize is not None:
        steps.append(("Normalize", NormalizeDocuments(config.normalize)))
    if config.quality is not None:
        steps.append(("QualityFilter", FilterQuality(config.quality, token_cache)))
    return steps


class DropDuplicates(DocumentStep):
    """Drops the copies that ``FindDuplicateDocuments`` named in the chunk's decision file.

    The side input is only the number of decision files written, so that the chunk is judged
    after every file is there; each chunk reads its own file alone.
    """

    step_name = "dedup"

    def __init__(self, files: Sequence[str], decisions: str):
        self.files = tuple(files)
        self.decisions = decisions

    def setup(self) -> None:
        self.file_numbers = {path: number for number, path in enumerate(self.files)}

    def process(self, chunk: RecordChunk, written: int) -> Iterator[Any]:
        self.found = (ChunkDecisions.read(decisions_path(self.decisions,
                                                         chunk_number(chunk.chunk_id)))
                      if written else ChunkDecisions({}))
        yield from super().process(chunk)

    def judge(self, record: Record) -> Record | Drop:
        return self.found.verdict(record, self.files, self.file_numbers) or record
