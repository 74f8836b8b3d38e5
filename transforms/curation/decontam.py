"""Decontamination: training records that overlap an evaluation set are removed.

Each evaluation set is an input pattern like ``--input`` (same declarations: ``text=question``
picks the field to check; by default every string in a record is checked separately, so a
training record that holds only a GSM8K question, without its answer, is still caught). Texts
are compared as lower-cased word n-grams: a training record is contaminated when it contains at
least ``threshold`` of the n-grams of some evaluation text. Evaluation texts shorter than ``n``
words cannot be matched reliably and are skipped; the manifest counts them per evaluation set
(``EvalIndex.counts``, found when the run is planned). Every worker builds the index
once from the evaluation files; it is small (a benchmark's test split), so no shuffle is needed.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from transforms.core.records import InputSpec, Rejection, strings_in
from transforms.core.steps import ChunkStep
from transforms.core.vocabulary import (
    CONTAMINATED,
    FILTERED,
)
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard

SAMPLE_NAME = "decontamination"
SNIPPET_CHARS = 200
_WORD = re.compile(r"\w+")


@dataclasses.dataclass(frozen=True)
class DecontamConfig:
    eval_sets: tuple[InputSpec, ...]
    ngram: int = 8
    threshold: float = 0.5


@dataclasses.dataclass(frozen=True)
class EvalText:
    source: str
    position: int
    eval_set: int  # index into DecontamConfig.eval_sets
    ngrams: int


@dataclasses.dataclass(frozen=True)
class Match:
    text: EvalText
    overlap: float


def ngrams(text: str, n: int) -> set[str]:
    words = _WORD.findall(text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


class EvalIndex:
    """The n-grams of every evaluation text, and which texts hold each."""

    def __init__(self, config: DecontamConfig):
        self.config = config
        self.texts: list[EvalText] = []
        self.holders: dict[str, list[int]] = collections.defaultdict(list)
        self.too_short: collections.Counter = collections.Counter()  # per eval set
        for number, spec in enumerate(config.eval_sets):
            field = spec.field_map.get("text")
            for shard in plan_shards([spec]):
                for chunk in read_shard(shard):
                    for record in chunk.records:
                        if record.error is None:
                            self._add(record, number, field)

    def _add(self, record, eval_set: int, field: str | None) -> None:
        value = record.value
        if field is not None:
            value = value.get(field) if isinstance(value, dict) else None
        for text in strings_in(value):
            grams = ngrams(text, self.config.ngram)
            if not grams:
                self.too_short[eval_set] += 1
                continue
            self.texts.append(EvalText(record.source, record.position, eval_set, len(grams)))
            for gram in grams:
                self.holders[gram].append(len(self.texts) - 1)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per evaluation set (its pattern): texts indexed, and texts too short to match."""
        indexed = collections.Counter(text.eval_set for text in self.texts)
        return {spec.pattern: {"indexed": indexed[k], "too_short": self.too_short[k]}
                for k, spec in enumerate(self.config.eval_sets)}

    def match(self, text: str) -> Match | None:
        """The evaluation text this text overlaps most, if at or above the threshold."""
        hits: collections.Counter = collections.Counter()
        for gram in ngrams(text, self.config.ngram):
            hits.update(self.holders.get(gram, ()))
        best = None
        for number, count in hits.items():
            overlap = count / self.texts[number].ngrams
            if overlap >= self.config.threshold and (best is None or overlap > best.overlap):
                best = Match(self.texts[number], overlap)
        return best


@functools.cache
def eval_index(config: DecontamConfig) -> EvalIndex:
    """One index per process and configuration."""
    return EvalIndex(config)


class Decontaminate(ChunkStep):
    """Filters the records of a chunk that overlap an evaluation set (reason ``contaminated``).

    ``texts_of`` gives the text to check for each record of a chunk (a document, or a
    conversation's contents); the chunk type provides ``records`` and ``take``.
    """

    step_name = "decontaminate"

    def __init__(self, config: DecontamConfig, branch: str,
                 texts_of: Callable[[Any], Sequence[str]]):
        self.config = config
        self.branch = branch
        self.texts_of = texts_of

    def setup(self) -> None:
        self.index = eval_index(self.config)

    def run(self, chunk: Any) -> Iterator[Any]:
        keep = []
        for number, (record, text) in enumerate(zip(chunk.records, self.texts_of(chunk),
                                                    strict=True)):
            found = self.index.match(text)
            if found is None:
                keep.append(number)
                continue
            eval_set = self.config.eval_sets[found.text.eval_set].pattern
            self.drop(Rejection.of(record, CONTAMINATED,
                                   f"{found.overlap:.0%} of the {self.config.ngram}-grams of "
                                   f"{found.text.source} record {found.text.position}"),
                      kind=FILTERED)
            self.count(f"decontamination.{self.branch}.{found.text.eval_set}")
            self.sample(SAMPLE_NAME, {
                "source": record.source, "position": record.position, "branch": self.branch,
                "eval_set": eval_set, "eval_source": found.text.source,
                "eval_position": found.text.position, "overlap": round(found.overlap, 4),
                "text": text[:SNIPPET_CHARS]})
        if len(keep) == len(chunk.records):
            yield chunk
        elif keep:
            yield chunk.take(keep)
