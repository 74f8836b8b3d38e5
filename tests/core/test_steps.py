"""OverlappedStep: every chunk's outputs leave exactly once, the last ones at the end of the
bundle, and the next chunk's work starts before a chunk's results are used. GatherTails: the
leftovers travel through files and come back whole, in chunk order."""

import dataclasses
import os

import apache_beam as beam
import numpy as np
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.windowed_value import WindowedValue

from transforms.core.steps import (
    PARTS,
    STATS,
    GatherTails,
    OverlappedStep,
    TailGroup,
    TailPlan,
    apply_step,
    tail_bucket,
    validation_id,
)

EVENTS: list[str] = []  # what Doubled did, in order (called directly, in this process)


@dataclasses.dataclass(frozen=True)
class Chunk:
    chunk_id: str
    values: tuple[int, ...]


class Doubled(OverlappedStep):
    step_name = "doubled"

    def start(self, chunk: Chunk) -> tuple[int, ...]:
        EVENTS.append(f"start {chunk.chunk_id}")
        return tuple(2 * v for v in chunk.values)

    def run(self, started):
        EVENTS.append(f"run {started.chunk_id}")
        self.count("values", len(started.handle))
        yield Chunk(started.chunk_id, started.handle)
        yield beam.pvalue.TaggedOutput("sums", sum(started.handle))


def test_outputs_leave_once_in_a_pipeline():
    chunks = [Chunk("a", (1, 2)), Chunk("b", (3,)), Chunk(validation_id("c"), (4, 5, 6))]
    with test_pipeline.TestPipeline() as p:
        out = apply_step(p | beam.Create(chunks), "Double", Doubled(), "sums")
        assert_that(out.main, equal_to([Chunk("a", (2, 4)), Chunk("b", (6,)),
                                        Chunk(validation_id("c"), (8, 10, 12))]), label="main")
        assert_that(out["sums"], equal_to([6, 6, 30]), label="sums")
        counts = out[STATS] | beam.Map(lambda stats: sorted(stats.items()))
        assert_that(counts, equal_to([[("values", 2)], [("values", 1)],
                                      [("validation.values", 3)]]), label="stats")
        assert_that(out[PARTS], equal_to([]), label="parts")


def test_a_chunk_is_used_after_the_next_one_started_and_the_last_at_the_end():
    EVENTS.clear()
    step = Doubled()
    step.start_bundle()
    first = list(step.process(Chunk("a", (1,))))
    second = list(step.process(Chunk("b", (2,))))
    last = list(step.finish_bundle())
    assert first == []  # nothing to use yet
    assert EVENTS == ["start a", "start b", "run a", "run b"]
    assert second[0] == Chunk("a", (2,))
    windowed = [(o.tag, o.value) if isinstance(o, beam.pvalue.TaggedOutput) else (None, o)
                for o in last]  # finish_bundle must give Beam windowed values
    assert all(isinstance(value, WindowedValue) for _, value in windowed)
    assert [(tag, value.value) for tag, value in windowed][:2] == [
        (None, Chunk("b", (4,))), ("sums", 4)]
    assert list(step.finish_bundle()) == []  # nothing waits any more


def test_tails_travel_through_files_and_come_back_whole_in_chunk_order(tmp_path):
    """Leftovers with numpy arrays, from chunks in both splits, arriving out of order: each
    group holds its chunks' leftovers sorted by chunk id, equal to what went in; one file per
    chunk is left in the spill directory (the run's staging, removed at the end of a run)."""
    spill = tmp_path / "tails"
    ids = [f"shard-{n:03d}" for n in range(12)] + [validation_id("shard-900")]
    tails = [(chunk_id, (chunk_id, np.arange(n, dtype=np.int32)))
             for n, chunk_id in enumerate(reversed(ids))]
    buckets = 3
    expected = {}
    for chunk_id, leftover in sorted(tails):
        key = (tail_bucket(chunk_id, buckets), chunk_id.endswith(validation_id("")))
        expected.setdefault(key, []).append(leftover)

    def as_plain(group: TailGroup):
        return group.chunk_id, [(name, array.tolist()) for name, array in group.items]

    with test_pipeline.TestPipeline() as p:
        groups = p | beam.Create(tails) | GatherTails(TailPlan(buckets, str(spill)))
        assert_that(groups | beam.Map(as_plain), equal_to([
            (f"~tails-{bucket:05d}{validation_id('') if validation else ''}",
             [(name, array.tolist()) for name, array in leftovers])
            for (bucket, validation), leftovers in expected.items()]))
    assert len(os.listdir(spill)) == len(ids)
