"""The model-based quality-score fixtures themselves (``tests/support/score_models.py``): the
fastText model trains deterministically and tells the bundled curated texts from C4 pages, the
venv's fasttext-predict reads it as the real library does, and the tiny BERTs load offline
through the Auto classes and score texts, long ones truncated."""

import math
import statistics

import pytest

from tests.support.score_models import (
    CC_LABEL,
    HQ_LABEL,
    fasttext_reference,
    held_out_texts,
    hf_reference,
    save_tiny_bert,
    shakespeare_paragraphs,
    train_fasttext,
)

LONG_TEXT = " ".join(shakespeare_paragraphs()[:40])  # far over 128 tokens


@pytest.fixture(scope="module")
def fasttext_model(tmp_path_factory):
    return train_fasttext(tmp_path_factory.mktemp("fasttext"))


@pytest.fixture(scope="module")
def bert_regression(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert1"), num_labels=1)


@pytest.fixture(scope="module")
def bert_binary(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert2"), num_labels=2)


def test_fasttext_trains_deterministically(fasttext_model, tmp_path):
    again = train_fasttext(tmp_path)
    assert fasttext_model.name == "model.bin"
    assert again.read_bytes() == fasttext_model.read_bytes()


def test_fasttext_separates_held_out_texts(fasttext_model):
    held_out = held_out_texts()
    shakespeare = [t for t in held_out[HQ_LABEL] if t in set(shakespeare_paragraphs())]
    hq = fasttext_reference(fasttext_model, held_out[HQ_LABEL], HQ_LABEL)
    cc = fasttext_reference(fasttext_model, held_out[CC_LABEL], HQ_LABEL)
    on_shakespeare = fasttext_reference(fasttext_model, shakespeare, HQ_LABEL)
    assert len(shakespeare) >= 20 and len(cc) >= 20
    assert statistics.mean(on_shakespeare) > statistics.mean(cc) + 0.3
    assert statistics.mean(hq) > statistics.mean(cc) + 0.3
    right = sum(p > 0.5 for p in hq) + sum(p < 0.5 for p in cc)
    assert right / (len(hq) + len(cc)) > 0.85
    # Varied scores, not all 0 or 1: a scorer that mixed texts up would not match them.
    assert statistics.pstdev(hq + cc) > 0.1


def test_fasttext_reference_labels(fasttext_model):
    texts = ["The quick brown fox.", "first line\nsecond line", ""]
    hq = fasttext_reference(fasttext_model, texts, HQ_LABEL)
    cc = fasttext_reference(fasttext_model, texts, CC_LABEL)
    assert fasttext_reference(fasttext_model, texts, "absent") == [0.0, 0.0, 0.0]
    for p, q in zip(hq, cc, strict=True):
        assert 0.0 < p <= 1.0 + 1e-4 and 0.0 < q <= 1.0 + 1e-4
        assert p + q == pytest.approx(1.0, abs=1e-4)  # fastText adds 1e-5 to each probability


def test_fasttext_predict_reads_the_model_as_the_real_library(fasttext_model):
    """The venv's `fasttext` is fasttext-predict, the one a scorer would use; the trainer stays
    out of this process."""
    import fasttext

    assert not hasattr(fasttext, "train_supervised")
    texts = [*held_out_texts()[CC_LABEL][:10], "one\ntwo"]
    model = fasttext.load_model(str(fasttext_model))
    ours = [dict(zip(*model.predict(t.replace("\n", " "), k=-1), strict=True))["__label__hq"]
            for t in texts]
    assert ours == pytest.approx(fasttext_reference(fasttext_model, texts, HQ_LABEL), abs=1e-6)


def test_tiny_bert_loads_through_auto_classes(bert_regression, bert_binary):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    for folder, labels in ((bert_regression, 1), (bert_binary, 2)):
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert model.config.num_labels == labels
        assert model.config.max_position_embeddings == tokenizer.model_max_length == 128
        assert 1000 < len(tokenizer) <= 2000
        ids = tokenizer("To be, or not to be")["input_ids"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert tokenizer.unk_token_id not in ids
    assert AutoModelForSequenceClassification.from_pretrained(
        bert_regression).config.problem_type == "regression"


def test_regression_scores_are_finite_and_varied(bert_regression):
    texts = held_out_texts()[HQ_LABEL][:10] + held_out_texts()[CC_LABEL][:10]
    scores = hf_reference(bert_regression, texts, None)
    assert len(scores) == len(texts)
    assert all(math.isfinite(s) for s in scores)
    assert statistics.pstdev(scores) > 0.05


def test_binary_probabilities_sum_to_one(bert_binary):
    texts = held_out_texts()[HQ_LABEL][:10] + held_out_texts()[CC_LABEL][:10]
    positive = hf_reference(bert_binary, texts, None)
    assert positive == hf_reference(bert_binary, texts, 1)
    negative = hf_reference(bert_binary, texts, 0)
    for p, q in zip(positive, negative, strict=True):
        assert 0.0 <= p <= 1.0 and 0.0 <= q <= 1.0
        assert p + q == pytest.approx(1.0, abs=1e-6)
    assert statistics.pstdev(positive) > 0.01


def test_long_text_is_truncated(bert_regression, bert_binary):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bert_regression)
    assert len(tokenizer(LONG_TEXT)["input_ids"]) > 128
    for folder, index in ((bert_regression, None), (bert_binary, 1)):
        score, longer = hf_reference(folder, [LONG_TEXT, LONG_TEXT + " And more words."], index)
        assert math.isfinite(score)
        assert score == longer  # only the first 128 tokens count


def test_tiny_bert_is_seeded(bert_binary, tmp_path):
    texts = held_out_texts()[CC_LABEL][:5]
    same = save_tiny_bert(tmp_path / "same", num_labels=2)
    other = save_tiny_bert(tmp_path / "other", num_labels=2, seed=1)
    assert hf_reference(same, texts, 1) == hf_reference(bert_binary, texts, 1)
    assert hf_reference(other, texts, 1) != hf_reference(bert_binary, texts, 1)
