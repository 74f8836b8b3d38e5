"""Mixing named sources to target shares of a branch's tokens.

Each ``--input`` may carry ``name=SOURCE;weight=W``; a source's target share of its branch's
(training) tokens is its weight over the sum of weights in the branch. Shares are reached by
repeating or leaving out whole records, chosen by a seeded hash of their tokens:

1. one pass over the tokenized records builds, per source, a histogram of tokens over 2^16
   hash buckets (small, fixed size; only these histograms are shuffled);
2. the plan picks the branch total ``T`` (``--mix_scale=down``: the largest total that needs
   no repeats, ``up``: the smallest that drops nothing), so a source at rate
   ``r = share * T / tokens`` keeps every record ``floor(r)`` times plus one more copy of the
   records in the first hash buckets that hold the fractional part's tokens;
3. every chunk applies the plan. Shares are met to within one bucket's tokens per source, the
   same records are chosen on every run and runner, and copies of a record are identical.

Records left out are counted as filtered (``mix_unselected``); the manifest reports each
source's tokens before and after, its target share and the share reached.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np

from transforms.core.records import Rejection
from transforms.core.steps import ChunkStep, StepOutput, apply_step, is_validation
from transforms.core.vocabulary import (
    FILTERED,
    MIX_UNSELECTED,
)

MIX_SCALES = ("down", "up")
BUCKET_BITS = 16
BUCKETS = 1 << BUCKET_BITS


@dataclasses.dataclass(frozen=True)
class MixConfig:
    """One branch's mix: which input feeds which source, and each source's target share."""

    branch: str
    sources: tuple[tuple[int, str], ...]  # (input index, source name)
    shares: tuple[tuple[str, float], ...]  # (source name, share), shares sum to 1
    scale: str = "down"
    seed: int = 0

    @property
    def salt(self) -> str:
        return f"mix:{self.seed}"


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    tokens: int  # the source's tokens before mixing
    rate: float  # copies per record on average
    whole: int  # copies every record gets
    extra_buckets: int  # records in hash buckets below this get one copy more


def bucket_of(digests: np.ndarray) -> np.ndarray:
    return (digests >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)


def plan_mix(histograms: Mapping[str, np.ndarray], config: MixConfig) -> dict[str, SourcePlan]:
    """Copies per record for every source so that tokens reach the target shares."""
    shares = dict(config.shares)
    tokens = {source: int(histograms[source].sum()) if source in histograms else 0
              for source in shares}
    empty = sorted(source for source, n in tokens.items() if n == 0)
    if empty:
        raise ValueError(
            f"mixing the {config.branch} branch: source(s) {', '.join(empty)} have no tokens left "
            "(all records rejected or filtered, or none classified into this branch), so their "
            "target shares cannot be reached")
    pick = min if config.scale == "down" else max
    total = pick(tokens[source] / share for source, share in shares.items())
    plans = {}
    for source, share in shares.items():
        rate = share * total / tokens[source]
        whole = math.floor(rate + 1e-9)
        extra = max(0.0, rate - whole) * tokens[source]
        cumulative = np.cumsum(histograms[source])
        # Include the buckets whose cumulative tokens come closest to the fractional part.
        cut = int(np.searchsorted(cumulative, extra))
        below = int(cumulative[cut - 1]) if cut else 0
        if cut < BUCKETS and abs(int(cumulative[cut]) - extra) < abs(below - extra):
            cut += 1
        plans[source] = SourcePlan(tokens[source], rate, whole, cut)
    return plans


class TokenHistogram(beam.CombineFn):
    """Adds (bucket, tokens) arrays into one dense histogram per source."""

    def create_accumulator(self) -> np.ndarray:
        return np.zeros(BUCKETS, dtype=np.int64)

    def add_input(self, histogram: np.ndarray, found: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        buckets, tokens = found
        np.add.at(histogram, buckets, tokens)
        return histogram

    def merge_accumulators(self, histograms: Iterable[np.ndarray]) -> np.ndarray:
        return sum(histograms, self.create_accumulator())

    def extract_output(self, histogram: np.ndarray) -> np.ndarray:
        return histogram


def source_histograms(chunk: Any, config: MixConfig) -> Iterator[tuple[str, tuple]]:
    """Per source in a training chunk: the hash buckets of its records and their tokens."""
    if is_validation(chunk.chunk_id):
        return
    names = dict(config.sources)
    sources = np.array([names[origin[2]] for origin in chunk.origins])
    buckets = bucket_of(chunk.record_digests(config.salt))
    tokens = chunk.record_tokens()
    for source in sorted(set(sources.tolist())):
        mine = sources == source
        yield source, (buckets[mine], tokens[mine])


class MixChunk(ChunkStep):
    """Repeats or leaves out each record of a training chunk as the plan says."""

    step_name = "mix"

    def __init__(self, config: MixConfig, unselected_counter: str):
        self.config = config
        self.unselected_counter = unselected_counter

    def run(self, chunk: Any, plans: Mapping[str, SourcePlan]) -> Iterator[Any]:
        if is_validation(chunk.chunk_id):
            yield chunk
            return
        names = dict(self.config.sources)
        buckets = bucket_of(chunk.record_digests(self.config.salt))
        tokens = chunk.record_tokens()
        copies = np.zeros(len(tokens), dtype=np.int64)
        totals: collections.Counter = collections.Counter()
        for number, origin in enumerate(chunk.origins):
            source = names[origin[2]]
            plan = plans[source]
            copies[number] = plan.whole + int(buckets[number] < plan.extra_buckets)
            totals[f"{source}.records_in"] += 1
            totals[f"{source}.tokens_in"] += int(tokens[number])
            totals[f"{source}.records_out"] += int(copies[number])
            totals[f"{source}.tokens_out"] += int(copies[number] * tokens[number])
            if not copies[number]:
                path, position, input_index = origin
                self.drop(Rejection(path, position, MIX_UNSELECTED,
                                    f"left out to reach source {source}'s target share",
                                    "", input_index), kind=FILTERED)
        for name, value in totals.items():
            self.count(f"mix.{self.config.branch}.{name}", value)
        self.count(self.unselected_counter, int(np.count_nonzero(copies == 0)))
        if copies.any():
            yield chunk.take(np.repeat(np.arange(len(copies)), copies).tolist())


class MixSources(beam.PTransform):
    """Tokenized chunks in; mixed chunks (main), parts and stats out."""

    def __init__(self, config: MixConfig, unselected_counter: str):
        super().__init__()
        self.config = config
        self.unselected_counter = unselected_counter

    def expand(self, chunks: beam.PCollection) -> StepOutput:
        config = self.config
        plan = (
            chunks
            | "SourceTokens" >> beam.FlatMap(source_histograms, config)
            | "Histograms" >> beam.CombinePerKey(TokenHistogram())
            | "ToDict" >> beam.combiners.ToDict()
            | "Plan" >> beam.Map(plan_mix, config))
        return apply_step(chunks, "Mix", MixChunk(config, self.unselected_counter),
                          side_inputs=[beam.pvalue.AsSingleton(plan)])
