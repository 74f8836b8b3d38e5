"""WriteOutputs, the composite that ends every run: staged parts in, sharded files and, last of
all, manifest.json out (the path is its one output element)."""

import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.options import config_from_options
from transforms.core.steps import Part
from transforms.io.manifest import RowCountError
from transforms.io.writers import STAGING_DIR, StagePart, WriteOutputs

BLOCK = 4


def blocks(first: int, rows: int) -> pa.Table:
    """``rows`` blocks of BLOCK consecutive token ids starting at ``first``."""
    ids = [list(range(first + BLOCK * i, first + BLOCK * (i + 1))) for i in range(rows)]
    return pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))})


# Three chunks arrive out of order; c1 also rejected one record.
PARTS = [
    Part("pretrain", "c1", "blocks", blocks(100, 2)),
    Part("pretrain", "c0", "blocks", blocks(0, 3)),
    Part("rejected", "c1", "classify",
         pa.table({"source": ["in.jsonl"], "position": [7], "reason": ["malformed_json"]})),
    Part("pretrain", "c2", "blocks", blocks(200, 1)),
]
STATS = {"records_read": 4, "knowledge.records_in": 3, "knowledge.documents": 3,
         "knowledge.tokens": 24, "knowledge.blocks": 6, "knowledge.tokens_out": 24,
         "rejected.malformed_json": 1}


def write(output, stats: dict, lose: tuple[str, ...] = ()) -> None:
    """WriteOutputs on PARTS; the runner's notices of the chunks in ``lose`` go missing."""
    cfg = config_from_options(PipelineOptions(
        ["--input=in.jsonl", f"--output={output}", f"--block_size={BLOCK}"]))
    fields = {"config": cfg.as_dict(), "tokenizer": {"name": "test"}}
    with test_pipeline.TestPipeline() as p:
        staged = (p | "Parts" >> beam.Create(PARTS)
                  | "Stage" >> beam.ParDo(StagePart(f"{output}/{STAGING_DIR}"))
                  | "Lose" >> beam.Filter(lambda note: note.order[0] not in lose))
        stats_in = p | "Stats" >> beam.Create([stats])
        shards = p | "Shards" >> beam.Create(["c0", "c1", "c2"])  # shard_of each chunk id
        manifest = (staged, stats_in, shards) | WriteOutputs(
            str(output), num_shards=2, target_shard_mb=1, row_group_rows=1024,
            manifest_fields=fields)
        assert_that(manifest, equal_to([f"{output}/manifest.json"]))


def rows(output) -> dict[str, list]:
    return {f"{kind}/{f.name}": pq.read_table(f).to_pylist() if kind == "pretrain"
            else f.read_text() for kind in ("pretrain", "rejected")
            for f in sorted((output / kind).glob("*.*"))}


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    out = tmp_path_factory.mktemp("write_outputs") / "out"
    write(out, STATS)
    return out


def test_rows_land_in_chunk_order_across_the_requested_shards(output):
    files = sorted((output / "pretrain").glob("*.parquet"))
    assert [f.name for f in files] == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    rows = [pq.read_table(f).column("input_ids").to_pylist() for f in files]
    assert rows == [blocks(0, 3).column("input_ids").to_pylist(),
                    blocks(100, 2).column("input_ids").to_pylist()
                    + blocks(200, 1).column("input_ids").to_pylist()]
    [rejected] = (output / "rejected").glob("*.jsonl")
    assert [json.loads(line) for line in rejected.read_text().splitlines()] == [
        {"source": "in.jsonl", "position": 7, "reason": "malformed_json"}]


def test_the_manifest_lists_the_files_and_balances_and_staging_is_gone(output):
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["records"]["balanced"] is True
    assert manifest["knowledge"]["blocks"] == 6
    assert {kind: [f["rows"] for f in files] for kind, files in manifest["outputs"].items()} == {
        "pretrain": [3, 3], "rejected": [1]}
    assert not (output / STAGING_DIR).exists()


def test_counts_that_disagree_with_the_files_leave_no_manifest(tmp_path):
    """A lost or doubled part must fail the run, never pass as a smaller dataset."""
    with pytest.raises(RowCountError, match="pretrain: 6 rows written, 7 counted"):
        write(tmp_path / "out", {**STATS, "knowledge.blocks": 7})
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_shard_whose_notices_all_went_missing_is_found_in_staging(output, tmp_path, caplog):
    """The local runner once lost staged-file notices; a chunk that loses every one of them
    (its pretrain blocks and the only rejected record) is still written, in its place."""
    with caplog.at_level("WARNING", logger="beam_pipeline"):
        write(tmp_path / "out", STATS, lose=("c1",))
    assert rows(tmp_path / "out") == rows(output)
    assert sum("did not deliver" in r.message for r in caplog.records) == 2  # pretrain, rejected
