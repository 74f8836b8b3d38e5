"""The manifest's arithmetic: every record read is kept, filtered or rejected."""

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that

from transforms.io.manifest import (
    FILES_LISTED,
    MIN_RECORDS_JUDGED_PER_FILE,
    KeepWorstFiles,
    RejectRateError,
    RowCountError,
    build_manifest,
    check_reject_fraction,
    check_rows_written,
    sum_counters,
    summary_lines,
)

CONFIG = {"instruction": {"seq_len": 100}, "knowledge": {"block_size": 8, "remainder": "drop"},
          "inputs": [{"index": 0, "pattern": "a.jsonl"}, {"index": 1, "pattern": "b/*.json"}]}


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
        "instruction.packed_tokens": 150,
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


def test_manifest_counts_per_input_and_the_reject_guard_names_the_culprit():
    stats = {"records_read": 10, "input.0.read": 6, "input.1.read": 4,
             "input.1.rejected.unclassifiable": 3, "input.1.rejected.malformed_json": 1,
             "input.0.filtered.too_long": 1,
             "source.0.instruction.records": 5, "source.0.instruction.tokens": 700,
             "source.0.instruction.le_128": 3, "source.0.instruction.le_256": 2,
             "source.0.instruction.trained_tokens": 210, "source.0.instruction.short_replies": 1,
             "source.0.instruction.truncated": 2, "source.0.instruction.truncated_tokens": 90}
    manifest = build_manifest(stats, [], CONFIG, {})
    assert manifest["inputs"] == [
        {"index": 0, "pattern": "a.jsonl", "name": None, "read": 6, "rejected": {},
         "filtered": {"too_long": 1},
         "tokenized": {"instruction": {"records": 5, "tokens": 700,
                                       "histogram": {"<=128": 3, "<=256": 2},
                                       "trained_tokens": 210, "short_replies": 1,
                                       "truncated": 2, "truncated_tokens": 90}}},
        {"index": 1, "pattern": "b/*.json", "name": None, "read": 4,
         "rejected": {"malformed_json": 1, "unclassifiable": 3}, "filtered": {},
         "tokenized": {}},
    ]
    check_reject_fraction(manifest, 1.0)
    with pytest.raises(RejectRateError, match=r"4 of 4 records of --input b/\*\.json .*"
                       r"top reasons: unclassifiable 3, malformed_json 1"):
        check_reject_fraction(manifest, 0.5)


def file_stats(counts: dict) -> dict:
    """A chunk's per-file counters as the steps and the read count leave them."""
    return {"files": {key: dict(value) for key, value in counts.items()}}


def test_per_file_counters_are_summed_file_by_file_and_stay_out_of_the_totals():
    total = sum_counters([
        {"records_read": 3, **file_stats({(0, "d/a"): {"read": 2}, (0, "d/b"): {"read": 1}})},
        file_stats({(0, "d/a"): {"rejected.malformed_json": 1}}),
        sum_counters([file_stats({(0, "d/a"): {"read": 5}, (1, "d/a"): {"read": 1}})]),
    ])
    assert total == {"records_read": 3, "files": {
        (0, "d/a"): {"read": 7, "rejected.malformed_json": 1}, (0, "d/b"): {"read": 1},
        (1, "d/a"): {"read": 1}}}


def test_an_input_of_several_files_lists_the_most_rejected_first_up_to_a_cap():
    files = {(1, f"b/{i:03d}.json"): {"read": 10, "rejected.unclassifiable": i % 7,
                                      "filtered.too_long": 1} for i in range(FILES_LISTED + 20)}
    files[0, "a.jsonl"] = {"read": 6}
    stats = {"input.0.read": 6, "input.1.read": 10 * len(files), **file_stats(files)}
    facts = {0: {"file_count": 1, "skipped": {}, "skipped_examples": {}},
             1: {"file_count": FILES_LISTED + 20, "skipped": {"hidden": 1},
                 "skipped_examples": {"hidden": ["b/.x"]}}}
    single, several = build_manifest(stats, [], CONFIG, {}, input_files=facts)["inputs"]
    assert "files" not in single and single["file_count"] == 1
    assert several["skipped"] == {"hidden": 1}
    listed = several["files"]
    assert len(listed) == FILES_LISTED
    expected = sorted((-(i % 7), f"b/{i:03d}.json") for i in range(FILES_LISTED + 20))
    assert [entry["path"] for entry in listed] == [path for _, path in expected][:FILES_LISTED]
    first = listed[0]
    assert first == {"path": "b/006.json", "read": 10, "kept": 3,
                     "rejected": {"unclassifiable": 6}, "filtered": {"too_long": 1}}


def test_the_reject_guard_judges_each_file_of_enough_records():
    judged = MIN_RECORDS_JUDGED_PER_FILE
    stats = {"input.1.read": 10 * judged, "input.1.rejected.unclassifiable": judged,
             **file_stats({(1, "b/small.json"): {"read": judged - 1,
                                                 "rejected.unclassifiable": judged - 1},
                           (1, "b/wrong.json"): {"read": judged,
                                                 "rejected.unclassifiable": 1},
                           (1, "b/good.json"): {"read": 8 * judged + 1}})}
    manifest = build_manifest(stats, [], CONFIG, {})
    check_reject_fraction(manifest, 0.5, stats)  # the small file is judged with its input only
    stats["files"][1, "b/wrong.json"]["rejected.unclassifiable"] = judged // 2 + 1
    with pytest.raises(RejectRateError, match=rf"{judged // 2 + 1} of {judged} records of "
                       r"b/wrong\.json \(--input b/\*\.json\) were rejected"):
        check_reject_fraction(manifest, 0.5, stats)


def test_the_global_sum_gets_the_worst_files_per_input_and_always_one_over_the_fraction():
    """Many files, each counted in several chunks: per input only FILES_LISTED files reach the
    global sum, and a file over the fraction is among them though others rejected more."""
    judged = MIN_RECORDS_JUDGED_PER_FILE
    chunks = [{"records_read": 1, **file_stats({(0, f"many/{i:04d}"): {"read": 50 * judged}})}
              for i in range(FILES_LISTED + 30)]
    chunks += [file_stats({(0, f"many/{i:04d}"): {"rejected.unclassifiable": 20}})
               for i in range(FILES_LISTED + 30) for _ in range(3)]  # 60 rejected: 1.2%
    chunks += [file_stats({(0, "many/wrong"): {"read": judged, "rejected.unclassifiable": 3}}),
               file_stats({(1, "one"): {"read": 4}})]
    chunks += [file_stats({(0, "many/wrong"): {"rejected.unclassifiable": 1}})
               for _ in range(judged // 2 - 2)]  # 51 of 100

    def check(summed):
        (stats,) = summed
        assert stats["records_read"] == FILES_LISTED + 30
        assert len(stats["files"]) == FILES_LISTED + 1
        assert stats["files"][0, "many/wrong"] == {"read": judged,
                                                   "rejected.unclassifiable": judged // 2 + 1}
        assert stats["files"][1, "one"] == {"read": 4}
        assert all(counts == {"read": 50 * judged, "rejected.unclassifiable": 60}
                   for key, counts in stats["files"].items() if key[1].startswith("many/0"))
        config = {**CONFIG, "inputs": [{"index": 0, "pattern": "many/"},
                                       {"index": 1, "pattern": "one"}]}
        with pytest.raises(RejectRateError, match="many/wrong"):
            check_reject_fraction(build_manifest(stats, [], config, {}), 0.5, stats)

    with beam.Pipeline() as pipeline:
        summed = (pipeline | beam.Create(chunks) | KeepWorstFiles(0.5)
                  | beam.CombineGlobally(sum_counters))
        assert_that(summed, check)


def test_a_run_whose_files_lost_rows_is_not_marked_complete():
    stats = {"records_read": 3, "knowledge.documents": 1, "knowledge.blocks": 2,
             "instruction.examples": 1, "instruction.packs": 1, "rejected.malformed_json": 1}
    config = {**CONFIG, "write_filtered": False}
    files = [{"kind": "pretrain", "path": "/o/pretrain/a", "rows": 2},
             {"kind": "sft", "path": "/o/sft/a", "rows": 1},
             {"kind": "rejected", "path": "/o/rejected/a", "rows": 1}]
    check_rows_written(build_manifest(stats, files, config, {}))
    with pytest.raises(RowCountError, match="sft: 0 rows written, 1 counted"):
        check_rows_written(build_manifest(stats, files[:1] + files[2:], config, {}))
