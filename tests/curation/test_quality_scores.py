"""Model-based quality scores (``--quality_model``, ``transforms/curation/scores.py``): a fastText
model trained here and two small BERT classifiers score every document and conversation through
``RunInference``; each score equals the library's own prediction on the same text, the filter
drops exactly the records under the threshold, and both runner modes write the same rows."""

import json

import numpy as np
import pyarrow.dataset as ds
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.options import config_from_options
from beam_pipeline.running import run
from tests.conftest import EXAMPLES
from tests.support.jsonl_files import filtered_rows
from tests.support.score_models import (
    fasttext_reference,
    hf_reference,
    save_tiny_bert,
    train_fasttext,
)
from transforms.core.vocabulary import LOW_QUALITY_SCORE
from transforms.curation.score_models import HfScores, class_index, length_batches
from transforms.curation.scores import (
    BIN_WIDTH,
    InstructionText,
    ScoreModel,
    parse_model,
    parse_models,
    parse_thresholds,
)

MINIMUM = 0.5  # of the fastText model's hq probability, in both branches
GSM8K = EXAMPLES / "gsm8k_sample.jsonl"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return {"ft": train_fasttext(folder / "fasttext"),
            "edu": save_tiny_bert(folder / "regression", num_labels=1),
            "cls": save_tiny_bert(folder / "classes", num_labels=2, seed=1)}


def _argv(models, output, *extra):
    return [f"--input={EXAMPLES / 'c4_sample.jsonl'}",
            f"--input={EXAMPLES / 'tinyshakespeare_excerpt.txt'}#text_unit=paragraph",
            f"--input={GSM8K}#branch=instruction;prompt=question;response=answer",
            f"--output={output}", "--write_documents=true", "--write_examples=true",
            "--write_filtered=true", "--quality_filter=false",
            f"--quality_model=ft=fasttext:{models['ft']}#label=hq",
            f"--quality_model=edu=hf:{models['edu']}#branch=knowledge,"
            f"cls=hf:{models['cls']}#branch=knowledge",
            f"--min_quality_score=ft={MINIMUM}", *extra]


@pytest.fixture(scope="module")
def scored_runs(models, tmp_path_factory):
    """The same run in memory, and on two worker processes with the fastText model shared
    across processes (one copy per machine)."""
    base = tmp_path_factory.mktemp("scored")
    run(_argv(models, base / "in_memory"))
    shared = [f"--quality_model=ft=fasttext:{models['ft']}#label=hq;share=true"]
    argv = [a for a in _argv(models, base / "workers") if not a.startswith("--quality_model=ft")]
    run([*argv, *shared, "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    return base / "in_memory", base / "workers"


def _read(output, kind):
    return ds.dataset(output / kind, format="parquet").to_table().to_pylist()


def _manifest(output):
    return json.loads((output / "manifest.json").read_text())


def test_every_documents_scores_equal_the_libraries_own(scored_runs, models):
    documents = _read(scored_runs[0], "documents")
    texts = [d["text"] for d in documents]
    assert len(texts) > 100
    expected = {"ft": fasttext_reference(models["ft"], texts, "hq"),
                "edu": hf_reference(models["edu"], texts, None),
                "cls": hf_reference(models["cls"], texts, 1)}
    for name, reference in expected.items():
        found = np.array([d["scores"][name] for d in documents], np.float64)
        np.testing.assert_allclose(found, reference, rtol=1e-4, atol=1e-5, err_msg=name)
    # Long documents are cut at the model's 128 tokens, as the reference cuts them.
    assert max(len(t) for t in texts) > 128 * 8


def test_the_filter_drops_exactly_the_records_under_the_threshold(scored_runs):
    output = scored_runs[0]
    manifest = _manifest(output)
    kept = _read(output, "documents")
    assert all(d["scores"]["ft"] >= MINIMUM for d in kept)
    dropped = [row for row in filtered_rows(output) if row["reason"] == LOW_QUALITY_SCORE]
    scores = [float(r["message"].split()[1]) for r in dropped]
    assert dropped and all(score < MINIMUM for score in scores)
    assert all(f"ft={MINIMUM:g}" in r["message"] for r in dropped)
    knowledge = manifest["quality_scores"]["knowledge"]
    instruction = manifest["quality_scores"]["instruction"]
    assert knowledge["ft"]["filtered"] + instruction["ft"]["filtered"] == len(dropped) \
        == manifest["records"]["filtered"][LOW_QUALITY_SCORE]
    assert manifest["knowledge"]["dropped"][LOW_QUALITY_SCORE] == knowledge["ft"]["filtered"]
    # Every scored document is kept or filtered by its score (no other step comes between).
    assert knowledge["ft"]["scored"] == len(kept) + knowledge["ft"]["filtered"]
    assert manifest["records"]["balanced"]


def test_conversations_are_scored_on_their_user_and_assistant_text(scored_runs, models):
    output = scored_runs[0]
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    texts = [f"{r['question']}\n{r['answer']}" for r in rows]
    reference = fasttext_reference(models["ft"], texts, "hq")
    examples = _read(output, "sft_examples")
    expected = [score for score in reference if score >= MINIMUM]
    assert len(expected) < len(reference)  # the threshold filters some conversations
    np.testing.assert_allclose([e["scores"]["ft"] for e in examples], expected, atol=1e-6)
    assert set(examples[0]["scores"]) == {"ft"}  # the BERT models score knowledge only
    found = _manifest(output)["quality_scores"]["instruction"]["ft"]
    assert found["scored"] == len(reference)
    assert found["filtered"] == len(reference) - len(expected)
    assert found["mean"] == pytest.approx(float(np.mean(reference)), abs=1e-4)


def test_the_manifest_histogram_and_the_report_cover_every_scored_record(scored_runs):
    output = scored_runs[0]
    manifest = _manifest(output)
    for branch, models in manifest["quality_scores"].items():
        for name, found in models.items():
            assert sum(found["histogram"].values()) == found["scored"] > 0, (branch, name)
            assert found["bin_width"] == BIN_WIDTH
    documents = _read(output, "documents")
    edu = np.array([d["scores"]["edu"] for d in documents])
    filtered_edu = manifest["quality_scores"]["knowledge"]["edu"]
    # All kept documents fall into the histogram's bins (filtered ones add to them).
    for edge, count in filtered_edu["histogram"].items():
        inside = np.count_nonzero((edu >= float(edge) - 1e-9) & (edu < float(edge) + BIN_WIDTH))
        assert inside <= count
    report = (output / "report.html").read_text()
    section = report.split('id="quality-scores"')[1].split("</section>")[0]
    assert section.count('<img class="plot"') == 4  # ft in both branches, edu, cls
    assert "<td>instruction</td><td>ft</td><td>fasttext</td>" in section
    card = (output / "README.md").read_text()
    found = manifest["quality_scores"]["knowledge"]["ft"]
    assert (f"| quality model `ft` (knowledge) | fasttext `{found['path']}`: "
            f"{found['scored']:,} scored, mean {found['mean']:.4f}; {found['filtered']:,} "
            f"filtered under {MINIMUM:g} |") in card


def test_both_runner_modes_and_a_shared_model_write_the_same_rows(scored_runs):
    first, second = ([(d["id"], d["input_ids"]) for d in _read(output, "documents")]
                     for output in scored_runs)
    assert first == second
    for name in ("ft", "edu", "cls"):
        a, b = ([d["scores"][name] for d in _read(output, "documents")] for output in scored_runs)
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert _read(scored_runs[0], "sft") == _read(scored_runs[1], "sft")


# --------------------------------------------------------------------------- units


def test_model_values_parse_with_names_labels_branches_and_sharing():
    model = parse_model("dclm=fasttext:gs://bucket/m/dclm.bin#label=hq;share=true")
    assert model == ScoreModel("dclm", "fasttext", "gs://bucket/m/dclm.bin", "hq", None, True)
    named = parse_model("hf:/models/fineweb-edu-classifier/#branch=knowledge")
    assert (named.name, named.branch, named.label) == ("fineweb-edu-classifier", "knowledge", None)
    for bad, why in (("onnx:/m", "KIND one of"), ("fasttext:/m.bin", "needs the label"),
                     ("hf:/m#branch=both", "branch must be"), ("hf:/m#size=1", "is not one of"),
                     ("a b=hf:/m", "must be letters")):
        with pytest.raises(ValueError, match=why):
            parse_model(bad)
    with pytest.raises(ValueError, match="two models are named m"):
        parse_models("hf:/a/m,hf:/b/m")
    assert parse_thresholds("b=0.5, a=3") == (("a", 3.0), ("b", 0.5))
    with pytest.raises(ValueError, match="is not NAME=NUMBER"):
        parse_thresholds("a=high")


def test_a_threshold_needs_its_model_and_tokenize_only_refuses_knowledge_models():
    def config(*argv):
        return config_from_options(PipelineOptions(["--input=x.jsonl", "--output=o", *argv]))

    with pytest.raises(ValueError, match="names no --quality_model: edu"):
        config("--min_quality_score=edu=3")
    with pytest.raises(ValueError, match="--quality_text"):
        config("--quality_model=hf:/m", "--quality_text=user")
    with pytest.raises(ValueError, match="--tokenize_only"):
        config("--quality_model=hf:/m", "--tokenize_only=true")
    config("--quality_model=hf:/m#branch=instruction", "--tokenize_only=true")  # no knowledge


def test_batches_go_shortest_first_within_the_token_budget():
    lengths = [500, 3, 7, 300, 7, 40]
    batches = length_batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    order = [i for b in batches for i in b]
    assert [lengths[i] for i in order] == sorted(lengths)
    assert all(len(b) * max(lengths[i] for i in b) <= 16384 for b in batches)
    assert len(length_batches([512] * 100)) == 4  # 32 texts of 512 tokens fill 16,384


def test_a_class_is_named_or_numbered_and_a_wrong_one_is_refused(models):
    scorer = HfScores(str(models["cls"]), "LABEL_0")
    assert scorer.column == 0
    config = scorer.model.config
    assert class_index(config, None, "m") == 1 and class_index(config, "1", "m") == 1
    with pytest.raises(ValueError, match="no class 'spam'"):
        class_index(config, "spam", "m")


def test_a_conversation_is_scored_on_the_text_asked_for():
    class Conversation:
        messages = ({"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "4"})

    class Row:
        value = {"question": "2+2?", "meta": {"tags": ["math", "easy"]}}

    assert InstructionText()(Row, Conversation) == "2+2?\n4"
    assert InstructionText("assistant")(Row, Conversation) == "4"
    assert InstructionText("field:meta")(Row, Conversation) == "math\neasy"
    assert InstructionText("field:missing")(Row, Conversation) == ""
