"""ReadInputs: every planned shard read into ordered chunks, whatever the runner's order."""

import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import EXAMPLES
from transforms.core import progress
from transforms.core.records import ShardSpec
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_inputs, plan_shards
from transforms.io.read_inputs import ReadInputs

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


def test_the_main_read_counts_progress_as_beam_metrics_with_parquet_split_in_the_job(tmp_path):
    """Dataflow shows these counters on the job page; the Parquet file is planned whole (no
    footer read at launch) and cut into its row groups by the job, and still counts as the one
    planned shard it was, with the bytes planned for it."""
    table = pa.table({"text": [f"document {i}" for i in range(10)]})
    parquet = tmp_path / "rows.parquet"
    pq.write_table(table, parquet, row_group_size=3)
    plan = plan_inputs([parse_input_spec(0, str(SAMPLE)), parse_input_spec(1, str(parquet))],
                       target_shard_bytes=64 << 10)
    assert plan.shards[-1] == ShardSpec(1, str(parquet), "parquet")  # whole at planning
    pipeline = test_pipeline.TestPipeline()
    chunks = pipeline | ReadInputs(plan.shards, chunk_records=CHUNK, max_record_bytes=1 << 20,
                                   shard_bytes=plan.shard_bytes, target_shard_bytes=1)
    parquet_chunks = chunks | beam.Filter(lambda chunk: chunk.records[0].input_index == 1)
    assert_that(parquet_chunks | beam.Map(lambda chunk: [r.position for r in chunk.records]),
                equal_to([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]))  # one chunk per row group
    result = pipeline.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        MetricsFilter().with_namespace(progress.NAMESPACE))["counters"]}
    assert counters == {"records_read": len(lines_with_offsets()) + 10,
                        "bytes_read": SAMPLE.stat().st_size + parquet.stat().st_size,
                        "shards_done": len(plan.shards)}
