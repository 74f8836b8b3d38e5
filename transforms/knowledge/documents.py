"""The steps that keep, rewrite or drop each knowledge document of a chunk, in their own module
because both passes judge by them: the main pass as steps, deduplication's first pass
(``KeyDocuments``) document by document."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from transforms.core.records import Record, RecordChunk, Rejection, replaced
from transforms.core.steps import ChunkStep, OverlappedStep, Started
from transforms.core.vocabulary import (
    BOILERPLATE_TOO_SHORT,
    EMPTY_AFTER_NORMALIZATION,
    FILTERED,
    KNOWLEDGE,
    LANGUAGE_NOT_SELECTED,
    LOW_LANGUAGE_SCORE,
    URL_BLOCKLISTED,
    Drop,
)
from transforms.curation.language import LanguageConfig, identify, start_identifying
from transforms.curation.options import BranchCuration
from transforms.curation.pii import PiiConfig, count_found, redact
from transforms.curation.urls import UrlConfig, blocked_by, load_blocklist, url_domain
from transforms.knowledge.dedup.decisions import ChunkDecisions, decisions_path
from transforms.knowledge.dedup.minhash import chunk_number, record_key
from transforms.knowledge.dedup.paragraphs import remove_units
from transforms.knowledge.normalize import NormalizeConfig, normalize_text
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import (
    QualityConfig,
    TextStats,
    describe,
    first_failure,
    text_hash,
)
from transforms.knowledge.token_cache import Prepared, cache_path, read_prepared, read_verdicts

_UNKNOWN = object()  # no verdict from the first pass
BOILERPLATE = "knowledge.boilerplate"  # counters of what boilerplate removal took out of documents


class DocumentStep(ChunkStep):
    """A step that keeps, rewrites or drops (as ``filtered``) each document of a chunk."""

    # Whether the step may drop a document or change its text: deduplication's first pass
    # takes only such steps, as the others cannot change what it keys.
    changes_documents = True

    def run(self, chunk: RecordChunk, *side_inputs: Any) -> Iterator[RecordChunk]:
        known = self.known(chunk, *side_inputs)
        kept = []
        for record in chunk.records:
            verdict = self.judge(record, known)
            if isinstance(verdict, Record):
                kept.append(verdict)
            else:
                self.drop(Rejection.of(record, verdict.reason, verdict.message), kind=FILTERED)
                self.count(f"knowledge.dropped.{verdict.reason}")
        self.tally(known)
        if kept:
            yield RecordChunk(chunk.chunk_id, tuple(kept))

    def known(self, chunk: RecordChunk, *side_inputs: Any) -> Any:
        """What the step knows of a chunk before it judges its documents (what deduplication's
        first pass left for it), handed to each ``judge`` of the chunk; None by default."""
        return None

    def tally(self, known: Any) -> None:
        """Counts what ``judge`` noted in ``known`` over the chunk; nothing by default.
        Deduplication's first pass judges with ``known`` None and counts nothing."""

    def judge(self, record: Record, known: Any) -> Record | Drop:
        """The record to keep (possibly rewritten) or the ``Drop`` that says why it goes."""
        raise NotImplementedError

    def reused(self, record: Record, known: Any) -> None:
        """Notes in ``known`` what ``judge`` would have for ``record``, which ``ReuseFirstPass``
        took as deduplication's first pass left it; nothing by default."""


class FilterBlockedUrls(DocumentStep):
    """Drops a document whose URL's domain, or a parent of it, is on ``--url_blocklist``; a
    document without a URL is kept."""

    step_name = "urls"

    def __init__(self, config: UrlConfig):
        self.config = config

    def setup(self) -> None:
        self.blocklist = load_blocklist(self.config.blocklist)

    def judge(self, record: Record, known: None) -> Record | Drop:
        domain = url_domain(record.url)
        listed = None if domain is None else blocked_by(domain, self.blocklist)
        if listed is None:
            return record
        return Drop(URL_BLOCKLISTED, f"{domain} is blocked by the listed domain {listed}")


class NormalizeDocuments(DocumentStep):
    step_name = "normalize"

    def __init__(self, config: NormalizeConfig):
        self.config = config

    def judge(self, record: Record, known: None) -> Record | Drop:
        text = normalize_text(record.value, self.config)
        if not text:
            return Drop(EMPTY_AFTER_NORMALIZATION, "no text left after normalisation")
        return replaced(record, value=text)


class RedactPersonalData(DocumentStep):
    """Replaces (or, with ``tag``, only counts) personal data and secrets in each document
    (``transforms.curation.pii``); keeps every document."""

    step_name = "pii"

    def __init__(self, config: PiiConfig):
        self.config = config

    def known(self, chunk: RecordChunk) -> collections.Counter:
        return collections.Counter()  # what the chunk's documents hold, by kind

    def judge(self, record: Record, found: collections.Counter | None) -> Record:
        text, spans = redact(record.value, self.config)
        if not spans:
            return record
        record = replaced(record, value=text, pii=tuple(sorted(spans.items())))
        self.reused(record, found)
        return record

    def reused(self, record: Record, found: collections.Counter | None) -> None:
        if record.pii and found is not None:
            found.update(dict(record.pii))
            found["documents"] += 1

    def tally(self, found: collections.Counter) -> None:
        for name, count in count_found(KNOWLEDGE, found).items():
            self.count(name, count)


class ReuseFirstPass(DocumentStep):
    """The text steps (normalisation, personal data) in the main pass, once deduplication's
    first pass has run them: their result for each document that pass judged is in its chunk's
    file (``token_cache.Prepared``), found by the hash of the text as read, so only the other
    documents (those it dropped before the quality rules, or all of a chunk whose file is
    missing) go through the steps themselves. Either way the record, its drop and its counters
    are the steps' own: the steps count through this one."""

    def __init__(self, steps: Sequence[DocumentStep], token_cache: str):
        self.steps = tuple(steps)
        self.token_cache = token_cache
        self.step_name = self.steps[0].step_name  # where its drops sort in filtered/

    def setup(self) -> None:
        for step in self.steps:
            step.setup()
            step.count = self.count  # type: ignore[method-assign]

    def known(self, chunk: RecordChunk) -> tuple[dict[bytes, Prepared], list[Any]]:
        return (read_prepared(cache_path(self.token_cache, chunk.chunk_id)),
                [step.known(chunk) for step in self.steps])

    def judge(self, record: Record, known: tuple[dict[bytes, Prepared], list[Any]]
              ) -> Record | Drop:
        prepared, states = known
        found = prepared.get(text_hash(record.value)) if prepared else None
        if found is not None:
            record = replaced(record, value=record.value if found.text is None else found.text,
                              pii=found.pii)
            for step, state in zip(self.steps, states, strict=True):
                step.reused(record, state)
            return record
        for step, state in zip(self.steps, states, strict=True):
            judged = step.judge(record, state)
            if not isinstance(judged, Record):
                return judged
            record = judged
        return record

    def tally(self, known: tuple[dict[bytes, Prepared], list[Any]]) -> None:
        for step, state in zip(self.steps, known[1], strict=True):
            step.tally(state)


class IdentifyLanguage(OverlappedStep, DocumentStep):
    """Labels each document with its language and the model's score for it
    (``transforms.curation.language``); with ``--languages``, drops the documents in other
    languages or scored under ``--min_language_score``.

    In the main pass a chunk's documents are identified in helper processes while the steps
    before prepare the next chunk (``OverlappedStep``); deduplication's first pass judges
    document by document (``judge`` without labels)."""

    step_name = "language"

    def __init__(self, config: LanguageConfig):
        self.config = config
        self.changes_documents = config.filters

    def start(self, chunk: RecordChunk) -> Callable[[], list[tuple[str, float]]]:
        return start_identifying([record.value for record in chunk.records],
                                 self.config.sample_chars)

    def run(self, started: Started) -> Iterator[RecordChunk]:
        return DocumentStep.run(self, started.chunk, started.handle)

    def known(self, chunk: RecordChunk, labels: Callable[[], list[tuple[str, float]]]
              ) -> Iterator[tuple[str, float]]:
        """The chunk's labels, in the order ``run`` judges its documents."""
        return iter(labels())

    def judge(self, record: Record, labels: Iterator[tuple[str, float]] | None
              ) -> Record | Drop:
        language, score = (identify(record.value, self.config.sample_chars) if labels is None
                           else next(labels))
        config = self.config
        if config.filters and language not in config.languages:
            return Drop(LANGUAGE_NOT_SELECTED, f"identified as {language} (score {score:.2f}), "
                        f"not one of --languages {','.join(config.languages)}")
        if config.filters and score < config.min_score:
            return Drop(LOW_LANGUAGE_SCORE, f"{language} with score {score:.2f} < "
                        f"--min_language_score {config.min_score}")
        return replaced(record, language=language, language_score=score)


class FilterQuality(DocumentStep):
    """The quality rules; a verdict that deduplication's first pass left in ``token_cache``
    is taken from there."""

    step_name = "quality"

    def __init__(self, config: QualityConfig, token_cache: str | None = None):
        self.config = config
        self.token_cache = token_cache

    def known(self, chunk: RecordChunk) -> dict[bytes, str | None]:
        """The verdicts the first pass left for this chunk, by text hash."""
        return (read_verdicts(cache_path(self.token_cache, chunk.chunk_id))
                if self.token_cache is not None else {})

    def verdict(self, stats: TextStats, known: Mapping[bytes, str | None]) -> str | None:
        """The first rule the document fails (a reason code), or None to keep it; a verdict in
        ``known`` is taken from there."""
        reason = known.get(stats.digest, _UNKNOWN)
        return first_failure(stats, self.config) if reason is _UNKNOWN else reason

    def judge(self, record: Record, known: Mapping[bytes, str | None]) -> Record | Drop:
        reason = self.verdict(TextStats(record.value), known)
        return record if reason is None else Drop(reason, describe(reason, self.config))


def document_steps(config: KnowledgeConfig, curation: BranchCuration | None = None,
                   token_cache: str | None = None) -> list[tuple[str, DocumentStep]]:
    """The steps a knowledge document meets before deduplication, in order, with their labels.

    The main pass applies them as steps; deduplication's first pass judges every document by the
    same steps (``KeyDocuments``), so a step added here is taken by both, and a blocked or
    filtered copy can never be the one that survives its cluster. The blocklist comes first (it
    costs a set lookup), the quality rules last: the first pass keys and tokenizes the text they
    judge. With the first pass's ``token_cache``, the main pass takes normalisation and the
    personal-data scan as one step that reuses the first pass's result (``ReuseFirstPass``).
    """
    curation = curation or BranchCuration()
    steps: list[tuple[str, DocumentStep]] = []
    if curation.urls.active:
        steps.append(("FilterBlockedUrls", FilterBlockedUrls(curation.urls)))
    text_steps: list[tuple[str, DocumentStep]] = []
    if config.normalize is not None:
        text_steps.append(("Normalize", NormalizeDocuments(config.normalize)))
    if curation.pii.active:
        text_steps.append(("RedactPersonalData", RedactPersonalData(curation.pii)))
    if text_steps and token_cache is not None:
        text_steps = [("And".join(label for label, _ in text_steps),
                       ReuseFirstPass([step for _, step in text_steps], token_cache))]
    steps += text_steps
    if curation.language.identify:
        steps.append(("IdentifyLanguage", IdentifyLanguage(curation.language)))
    if config.quality is not None:
        steps.append(("QualityFilter", FilterQuality(config.quality, token_cache)))
    return steps


@dataclasses.dataclass
class ChunkWork:
    """What ``DropDuplicates`` knows of a chunk (its decisions) and what it removed from it."""

    decisions: ChunkDecisions
    removed: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class DropDuplicates(DocumentStep):
    """Drops the copies that ``FindDuplicateDocuments`` named in the chunk's decision file,
    tells each survivor how many copies went in its favour (``Record.duplicates``, for
    ``--write_documents``), and takes the boilerplate units it named out of every document but
    the one that keeps each; a document left with fewer than ``--min_words`` words (at least
    one) is filtered.

    The side input is only the number of decision files written, so that the chunk is judged
    after every file is there; each chunk reads its own file alone. A document whose text
    changes is tokenized afresh: the token cache is found by the hash of the text.
    """

    step_name = "dedup"

    def __init__(self, files: Sequence[str], decisions: str, config: KnowledgeConfig):
        self.files = tuple(files)
        self.decisions = decisions
        self.earlier = config.dedup_against
        self.boilerplate = config.boilerplate
        self.min_words = max(1, config.quality.min_words) if config.quality is not None else 1

    def setup(self) -> None:
        self.file_numbers = {path: number for number, path in enumerate(self.files)}

    def known(self, chunk: RecordChunk, written: int) -> ChunkWork:
        """The chunk's decisions (none when no decision file was written)."""
        return ChunkWork(
            ChunkDecisions.read(decisions_path(self.decisions, chunk_number(chunk.chunk_id)))
            if written else ChunkDecisions({}))

    def judge(self, record: Record, known: ChunkWork) -> Record | Drop:
        decisions = known.decisions
        dropped = decisions.verdict(record, self.files, self.file_numbers, self.earlier)
        if dropped is not None:
            return dropped
        if decisions.survivors:
            record = decisions.credited(record, self.file_numbers)
        if not decisions.units or self.boilerplate is None:
            return record
        key = record_key(record, self.file_numbers)
        removal = remove_units(record.value, self.boilerplate,
                               lambda unit: decisions.units.get(unit, key) != key)
        if removal.text is record.value:
            return record
        words = TextStats(removal.text).word_count
        if words < self.min_words:
            return Drop(BOILERPLATE_TOO_SHORT, f"{words} words left once {removal.paragraphs} "
                        f"paragraphs and {removal.lines} lines of boilerplate are removed "
                        f"(--min_words {self.min_words})")
        known.removed.update(documents_changed=1, paragraphs_removed=removal.paragraphs,
                             lines_removed=removal.lines,
                             chars_removed=len(record.value) - len(removal.text))
        return replaced(record, value=removal.text)

    def tally(self, known: ChunkWork) -> None:
        for name, count in known.removed.items():
            self.count(f"{BOILERPLATE}.{name}", count)
