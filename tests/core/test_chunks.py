"""Chunks travel with ChunkCoder: decoded as they were, sized close to their pickled size
without pickling them whole, and every step's chunk output is declared so Beam uses it."""

import pickle

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline

from tests.conftest import SHARED_DATA, require_shared_data
from transforms.classify import ClassifyRecords
from transforms.core.chunks import Chunk, ChunkCoder, estimated_size
from transforms.core.records import RecordChunk
from transforms.core.steps import PARTS, STATS, Part
from transforms.instruction.branch import EncodedChunk
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard
from transforms.io.read_inputs import ReadInputs

require_shared_data()

GSM8K = SHARED_DATA / "math" / "gsm8k_train.jsonl"


@pytest.fixture(scope="module")
def gsm8k_chunk() -> RecordChunk:
    spec = parse_input_spec(0, f"{GSM8K}#branch=instruction")
    return next(read_shard(plan_shards([spec])[0], chunk_records=2000))


def test_a_chunk_decodes_to_itself_and_is_sized_near_its_pickled_size(gsm8k_chunk):
    coder = beam.coders.registry.get_coder(RecordChunk)
    assert isinstance(coder, ChunkCoder)
    assert len(gsm8k_chunk.records) == 2000
    assert coder.decode(coder.encode(gsm8k_chunk)) == gsm8k_chunk
    pickled = len(pickle.dumps(gsm8k_chunk, pickle.HIGHEST_PROTOCOL))
    assert 0.5 * pickled < coder.estimate_size(gsm8k_chunk) < 2 * pickled


def test_token_arrays_and_tables_are_sized_by_their_bytes():
    rng = np.random.default_rng(0)
    examples = tuple(
        pickle.loads(pickle.dumps(example))
        for example in _examples(rng, 500))
    chunk = EncodedChunk("c", examples, tuple(("s", i, 0) for i in range(500)))
    pickled = len(pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL))
    assert 0.5 * pickled < ChunkCoder().estimate_size(chunk) < 2 * pickled
    table = pa.table({"input_ids": pa.array(rng.integers(0, 1000, 10_000))})
    assert estimated_size(table) == table.nbytes
    part = Part("sft", "c", "pack", table)
    assert ChunkCoder().decode(ChunkCoder().encode(part)).table.equals(table)


def _examples(rng, count):
    from transforms.instruction.rendering.values import EncodedExample

    for _ in range(count):
        ids = rng.integers(0, 150_000, int(rng.integers(20, 2000)), dtype=np.int32)
        yield EncodedExample(ids, np.where(rng.random(len(ids)) < 0.5, ids, -100).astype(np.int32))


def test_steps_declare_their_chunk_outputs():
    """The reader's chunks, classification's branches, and each step's main output and parts
    are coded by ChunkCoder; the stats stay with Beam's default coder."""
    spec = parse_input_spec(0, f"{GSM8K}#branch=instruction")
    p = test_pipeline.TestPipeline()
    chunks = p | ReadInputs(plan_shards([spec]), chunk_records=100, max_record_bytes=1 << 20)
    routed = chunks | ClassifyRecords([spec])
    coded = {"read": chunks, "main": routed.main, "knowledge": routed["knowledge"],
             "instruction": routed["instruction"], PARTS: routed[PARTS]}
    for name, pcoll in coded.items():
        assert issubclass(pcoll.element_type, Chunk), name
        assert isinstance(beam.coders.registry.get_coder(pcoll.element_type), ChunkCoder), name
    assert not isinstance(beam.coders.registry.get_coder(routed[STATS].element_type), ChunkCoder)
