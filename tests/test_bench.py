"""Smoke tests of the benchmark harness's parts on tiny inputs (``make bench`` runs the whole).

No timings are asserted: the harness's numbers depend on the machine.
"""

import collections
import os
import sys

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from bench import checks, corpus, proc, report, spilled_shuffle
from tests.conftest import require_shared_data


def test_clean_is_a_fixed_point_and_removes_what_normalisers_remove():
    text = "\ufeffCafe\u0301  au\u200b lait \r\n\r\n\r\n\r\nNext\t\xa0line\x85 "
    cleaned = corpus.clean(text)
    assert cleaned == "Café au lait\n\nNext line"
    assert corpus.clean(cleaned) == cleaned


def test_copies_keep_every_sentence_but_no_document():
    require_shared_data()  # the bench's corpus is the shared pretraining text
    documents = corpus.base_documents()
    copy = corpus.reshuffled(documents, seed=1)
    assert len(copy) == len(documents)
    assert not set(copy) & set(documents)  # deduplication cannot fold a copy into the corpus

    def words(docs):
        return collections.Counter(w for d in docs for w in d.split())

    assert words(copy) == words(documents)


def test_knowledge_inputs_are_written_once_with_their_record_counts(tmp_path):
    require_shared_data()
    knowledge = corpus.knowledge(tmp_path, 0.01)
    assert sum(pq.read_metadata(f).num_rows for f in knowledge.files) == knowledge.records > 0
    assert corpus.knowledge(tmp_path, 0.01) == knowledge  # cached


def test_peak_memory_counts_the_whole_process_tree():
    child = "import time; x = bytearray(200 * 2**20); time.sleep(1)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    measured = proc.run([sys.executable, "-c", parent], os.environ, os.getcwd(), "tree")
    assert measured.peak_rss_mb > 200
    assert measured.cpu_s >= 0 and measured.others_cpu_s >= 0


def test_cpu_counts_descendants_that_nobody_waits_for():
    """A multiprocessing fork server's helpers are never waited for by the measured process,
    so the kernel's count of waited-for children misses them; the polls must not."""
    busy = "import time; end = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    parent = ("import os, subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {busy!r}]); time.sleep(2.0); os._exit(0)")
    measured = proc.run([sys.executable, "-c", parent], os.environ, os.getcwd(), "orphan")
    assert measured.cpu_s > 0.8


def test_a_failing_command_raises_with_its_output():
    with pytest.raises(RuntimeError, match="boom"):
        proc.run([sys.executable, "-c", "raise SystemExit('boom')"], os.environ, os.getcwd(),
                 "failing")


def test_the_generated_section_is_replaced_and_the_notes_kept(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    report.write_section(path, "first\n")
    assert path.read_text().endswith(f"{report.BEGIN}\nfirst\n{report.END}\n")
    path.write_text(f"notes before\n{report.BEGIN}\nfirst\n{report.END}\nnotes after\n")
    report.write_section(path, "second\n")
    assert path.read_text() == f"notes before\n{report.BEGIN}\nsecond\n{report.END}\nnotes after\n"


def test_checks_refuse_wrong_counts():
    checks.datasets_run({"tokens": 10, "tokens_in_blocks": 8, "blocks": 4, "dropped_tokens": 2},
                        ceiling_tokens=10, block_size=2)
    with pytest.raises(checks.CheckFailed, match="ceiling"):
        checks.datasets_run({"tokens": 9, "tokens_in_blocks": 8, "blocks": 4,
                             "dropped_tokens": 1}, ceiling_tokens=10, block_size=2)
    with pytest.raises(checks.CheckFailed, match="truncated"):
        checks.trl_run({"examples": 3, "packed_tokens": 5, "tokens": 6, "longest_pack": 4},
                       examples=3, seq_len=4)


def test_speed_ratios_use_whole_wall_time_and_show_the_work_less_start_up():
    from bench import run

    def measured(wall, cpu):
        return proc.Measured(wall_s=wall, peak_rss_mb=1.0, cpu_s=cpu, others_cpu_s=0.0, log="")

    ours = run.Run({"knowledge": {"tokens": 1000}}, "out", measured(10.0, 15.0))
    peer = {"tokens": 2000, "seconds": 10.0, "cpu_seconds": 20.0}
    target = run._speed("t", ours, measured(2.0, 2.0), "knowledge", peer, 0.5)
    assert target.measured == "0.50x (per CPU second 0.67x; less start-up 0.62x)"
    assert target.met  # 0.5 >= 0.5: the goal is judged on whole wall time
    assert not run._speed("t", ours, measured(2.0, 2.0), "knowledge", peer, 0.5,
                          strict=True).met
    slow_start = run._speed("t", ours, measured(12.0, 2.0), "knowledge", peer, 0.5)
    assert "less start-up n/a" in slow_start.measured


@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_spilled_shuffles_group_as_beam_does(mode, tmp_path, monkeypatch):
    """The dedup simulation's runner keeps shuffles on disk (bench/spilled_shuffle.py): with
    partitions of 4 KiB, a shuffle is regrouped from many hash partitions and still gives
    every key all its values once, and the PCollections the runner materializes between steps
    (the flatten's inputs here) are read back whole."""
    monkeypatch.setattr(spilled_shuffle, "PARTITION_BYTES", 4096)
    monkeypatch.setattr(spilled_shuffle, "FLUSH_BYTES", 512)
    counts = []
    hash_partitions = spilled_shuffle.SpilledGroupingBuffer._hash_partitions

    def counted(buffer):
        parts = hash_partitions(buffer)
        counts.append(len(parts))
        return parts

    monkeypatch.setattr(spilled_shuffle.SpilledGroupingBuffer, "_hash_partitions", counted)
    n, keys = 20_000, 997
    with spilled_shuffle.spill_shuffles(str(tmp_path)), beam.Pipeline(
            options=PipelineOptions([f"--direct_running_mode={mode}"])) as p:
        pairs = p | beam.Create(range(n)) | beam.Map(lambda x: (x % keys, x))
        grouped = pairs | beam.GroupByKey() | beam.MapTuple(lambda k, v: (k, sorted(v)))
        assert_that(grouped, equal_to([(k, list(range(k, n, keys))) for k in range(keys)]))
        distinct = pairs | beam.Keys() | beam.Distinct()
        both = (grouped | "K" >> beam.Keys(), distinct) | beam.Flatten()
        assert_that(both | beam.combiners.Count.Globally(), equal_to([2 * keys]), label="Both")
    assert max(counts) > 10
