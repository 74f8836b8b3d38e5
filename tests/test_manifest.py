"""The manifest's arithmetic: every record read is kept, filtered or rejected."""

from transforms.manifest import build_manifest, sum_counters, summary_lines

CONFIG = {"instruction": {"seq_len": 100}, "knowledge": {"block_size": 8, "remainder": "drop"}}


def test_counters_sum_across_chunks_and_empty_input_sums_to_nothing():
    assert sum_counters([{"a": 1, "b": 2}, {"a": 3}]) == {"a": 4, "b": 2}
    assert sum_counters([]) == {}


def test_manifest_balances_when_every_record_is_accounted_for():
    stats = {
        "records_read": 10,
        "knowledge.documents": 4,
        "instruction.examples": 3,
        "instruction.tokens": 150,
        "instruction.packs": 2,
        "filtered.too_long": 1,
        "rejected.malformed_json": 1,
        "rejected.unclassifiable": 1,
    }
    manifest = build_manifest(
        stats, [{"kind": "sft", "path": "/o/sft/a", "rows": 2}], CONFIG, {"name": "t"}
    )
    records = manifest["records"]
    assert records["accounted"] == 10
    assert records["balanced"] is True
    assert records["rejected"] == {"malformed_json": 1, "unclassifiable": 1}
    assert records["filtered"] == {"too_long": 1}
    assert manifest["instruction"]["packing_efficiency"] == 0.75
    assert manifest["outputs"] == {"sft": [{"path": "/o/sft/a", "rows": 2}]}
    assert "balanced" in summary_lines(manifest)[0]


def test_manifest_shows_a_lost_record():
    manifest = build_manifest({"records_read": 2, "knowledge.documents": 1}, [], CONFIG, {})
    assert manifest["records"]["balanced"] is False
    assert manifest["instruction"]["packing_efficiency"] is None
    assert "NOT BALANCED" in summary_lines(manifest)[0]
