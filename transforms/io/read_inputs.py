"""ReadInputs: planned shards in, ordered record chunks out.

The shard list is computed when the graph is built, so it depends only on the inputs; the
shards are spread over workers and each is read end to end into chunks (seqio's
``Create(shards) | FlatMap(read)`` pattern), so no data-sized shuffle is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam

from transforms.core.records import RecordChunk, ShardSpec
from transforms.io.readers import read_shard


class ReadInputs(beam.PTransform):
    def __init__(self, shards: Sequence[ShardSpec], chunk_records: int, max_record_bytes: int):
        super().__init__()
        self.shards = list(shards)
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "ListShards" >> beam.Create(self.shards)
            | "SpreadShards" >> beam.Reshuffle()
            | "ReadShards" >> beam.FlatMap(read_shard, chunk_records=self.chunk_records,
                                           max_record_bytes=self.max_record_bytes,
                                           ).with_output_types(RecordChunk)
        )
