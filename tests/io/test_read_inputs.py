"""ReadInputs: every planned shard read into ordered chunks, whatever the runner's order."""

import json

import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import EXAMPLES
from transforms.io.read_inputs import ReadInputs
from transforms.io.readers import parse_input_spec, plan_shards

SAMPLE = EXAMPLES / "c4_sample.jsonl"
CHUNK = 7


def lines_with_offsets() -> list[tuple[int, str]]:
    """Each record's byte offset (its position) and its text."""
    found, offset = [], 0
    for line in SAMPLE.read_bytes().splitlines(keepends=True):
        if line.strip():
            found.append((offset, json.loads(line)["text"]))
        offset += len(line)
    return found


def test_every_record_of_every_shard_is_read_once_in_chunks_of_its_shard():
    shards = plan_shards([parse_input_spec(0, str(SAMPLE))], target_shard_bytes=64 << 10)
    assert len(shards) > 2  # the file is cut into byte ranges
    with test_pipeline.TestPipeline() as p:
        chunks = p | ReadInputs(shards, chunk_records=CHUNK, max_record_bytes=1 << 20)
        records = chunks | beam.FlatMap(lambda chunk: [(r.position, r.value["text"])
                                                        for r in chunk.records])
        assert_that(records, equal_to(lines_with_offsets()), label="records")
        ordered = chunks | beam.Map(lambda chunk: 0 < len(chunk.records) <= CHUNK and [
            r.position for r in chunk.records] == sorted(r.position for r in chunk.records))
        assert_that(ordered | beam.CombineGlobally(all), equal_to([True]), label="chunks")
