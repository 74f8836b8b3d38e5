"""OverlappedStep: every chunk's outputs leave exactly once, the last ones at the end of the
bundle, and the next chunk's work starts before a chunk's results are used."""

import dataclasses

import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.windowed_value import WindowedValue

from transforms.steps import PARTS, STATS, OverlappedStep, apply_step, validation_id

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
