"""ReadInputs: planned shards in, ordered record chunks out, spread over the workers.

The shard list is computed when the graph is built from glob expansion alone, so it depends
only on the inputs; the shards are spread over workers, a whole Parquet file is cut into
row-group ranges there (its footer is read inside the job, not by the launcher), and each shard
is read end to end into chunks (seqio's ``Create(shards) | FlatMap(read)`` pattern), so no
data-sized shuffle is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import apache_beam as beam

from transforms.core import progress
from transforms.core.records import RecordChunk, ShardSpec
from transforms.io.planning import DEFAULT_TARGET_SHARD_BYTES, split_shard
from transforms.io.read_formats import read_shard


class ReadInputs(beam.PTransform):
    """Reads the shards; with ``shard_bytes`` (the main read, not deduplication's first pass)
    it also counts the run's progress: records, bytes of the planned total, shards done."""

    def __init__(self, shards: Sequence[ShardSpec], chunk_records: int, max_record_bytes: int,
                 shard_bytes: Sequence[int] | None = None,
                 target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES):
        super().__init__()
        self.shards = list(shards)
        self.chunk_records = chunk_records
        self.max_record_bytes = max_record_bytes
        self.shard_bytes = None if shard_bytes is None else list(shard_bytes)
        self.target_shard_bytes = target_shard_bytes  # for cutting Parquet into row groups

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        sizes = self.shard_bytes or [0] * len(self.shards)
        return (
            pbegin
            | "ListShards" >> beam.Create([_PlannedShards(tuple(
                (shard, size, True) for shard, size in zip(self.shards, sizes, strict=True)))])
            | "EachShard" >> beam.FlatMap(lambda planned: planned.items)
            | "SpreadFiles" >> beam.Reshuffle()
            | "SplitParquet" >> beam.FlatMap(_split, self.target_shard_bytes)
            | "SpreadShards" >> beam.Reshuffle()
            | "ReadShards" >> beam.FlatMap(
                _read, chunk_records=self.chunk_records, max_record_bytes=self.max_record_bytes,
                counted=self.shard_bytes is not None).with_output_types(RecordChunk)
        )


# (shard, bytes it stands for, whether it ends a planned shard): a planned Parquet file counts
# as done when its last row-group range is read.
_Planned = tuple[ShardSpec, int, bool]


@dataclasses.dataclass(frozen=True)
class _PlannedShards:
    """The planned shards as one element. Given a list, ``beam.Create`` infers a type for and
    encodes each element when the graph is built: about 10 s for 100,000 shards, against one
    pickle for this one element (``bench/bench_launch.py``)."""

    items: tuple[_Planned, ...]


def _split(planned: _Planned, target_shard_bytes: int) -> list[_Planned]:
    """A whole Parquet file's row-group ranges, the file's bytes shared among them."""
    shard, nbytes, _ = planned
    parts = split_shard(shard, target_shard_bytes)
    return [(part, nbytes // len(parts) + (i < nbytes % len(parts)), i == len(parts) - 1)
            for i, part in enumerate(parts)]


def _read(planned: _Planned, chunk_records: int, max_record_bytes: int,
          counted: bool) -> Iterator[RecordChunk]:
    shard, nbytes, ends_planned = planned
    chunks = read_shard(shard, chunk_records=chunk_records, max_record_bytes=max_record_bytes)
    if not counted:
        yield from chunks
        return
    # Line formats' positions are byte offsets: the bytes read so far within the shard.
    line_based = shard.format == "jsonl" or (shard.format == "text" and shard.text_unit != "file")
    done = 0
    for chunk in chunks:
        reached = min(nbytes, chunk.records[-1].position - shard.start) if line_based else done
        progress.count(records_read=len(chunk.records), bytes_read=max(0, reached - done))
        done = max(done, reached)
        yield chunk
    progress.count(bytes_read=nbytes - done, shards_done=int(ends_planned))
