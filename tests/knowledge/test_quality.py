"""Quality rules: each drops its junk and keeps real prose, in English, Korean and Chinese."""

import collections
import dataclasses
import doctest
import json
import re

import pytest

from tests.conftest import ROOT, SHARED_DATA, require_shared_data
from transforms.core.records import InputSpec
from transforms.core.vocabulary import (
    TOP_NGRAM,
)
from transforms.io.planning import plan_shards
from transforms.io.read_formats import read_shard
from transforms.knowledge import quality, words
from transforms.knowledge.normalize import normalize_text
from transforms.knowledge.quality import (
    RULES,
    QualityConfig,
    TextStats,
    first_failure,
    format_ngram_limits,
    parse_ngram_limits,
    quality_reason,
)
from transforms.knowledge.words import split_words

require_shared_data()


@pytest.fixture(params=["kernel", "numpy"], autouse=True)
def way(request, monkeypatch):
    """Every test here runs on the C kernel's n-gram counts and on their numpy reference, each
    with a verdict memory of its own (neither answers from the other's)."""
    monkeypatch.setattr(quality, "_VERDICTS", {})
    if request.param == "numpy":
        monkeypatch.setattr(words, "_kernel", None)
    elif words._kernel is None:
        pytest.skip("the C kernel is not built (tests/knowledge/test_words_kernel.py says why)")

PRETRAIN = SHARED_DATA / "pretrain"
MULTILINGUAL = SHARED_DATA / "multilingual"
JUNK = [json.loads(line)
        for line in (ROOT / "tests/data/knowledge/junk.jsonl").read_text().splitlines()]
CONFIG = QualityConfig()


def documents(path, text_unit="file") -> list[str]:
    """The normalised knowledge documents of a file, read by the pipeline's own readers."""
    spec = InputSpec(0, str(path), text_unit=text_unit)
    texts = []
    for record in (r for s in plan_shards([spec]) for c in read_shard(s) for r in c.records):
        text = record.value["text"] if isinstance(record.value, dict) else record.value
        if text.strip():
            texts.append(normalize_text(text))
    return texts


def keep_rate(texts: list[str]) -> tuple[float, collections.Counter]:
    reasons = collections.Counter(quality_reason(text) for text in texts if text)
    return reasons[None] / sum(reasons.values()), reasons


def klue_premises() -> list[str]:
    rows = json.loads((MULTILINGUAL / "ko_klue_nli_v1.1_dev.json").read_text())
    return sorted({row["premise"] for row in rows})


def tang_poems() -> list[str]:
    rows = json.loads((MULTILINGUAL / "zh_quantangshi_poet.tang.0.json").read_text())
    return ["\n".join(row["paragraphs"]) for row in rows]


def test_doctests():
    assert doctest.testmod(quality).failed == 0


@pytest.mark.parametrize("doc", [d for d in JUNK if d["expected"] != "empty_after_normalization"],
                         ids=lambda d: str(d["expected"]))
def test_each_kind_of_junk_is_dropped_by_its_rule(doc):
    assert quality_reason(normalize_text(doc["text"])) == doc["expected"]


RULE_OF = {rule.__name__: rule for rule in RULES}
REASON_RULE = {
    "too_few_words": "word_count", "mean_word_length": "mean_word_length",
    "symbol_ratio": "symbol_ratio", "ellipsis_lines": "ellipsis_lines",
    "bullet_lines": "bullet_lines", "low_alpha_fraction": "alpha_fraction",
    "duplicate_lines": "duplicate_lines", "duplicate_paragraphs": "duplicate_paragraphs",
    "repeated_top_ngram": "top_ngram", "duplicate_ngrams": "duplicate_ngrams",
}


@pytest.fixture(scope="module")
def real_prose() -> list[str]:
    """Whole real documents in three scripts: a novel, encyclopedia articles, web pages (the
    first ten C4 records), Korean sentences and Chinese poems."""
    novel = documents(PRETRAIN / "gutenberg_1342_pride_and_prejudice.txt")
    articles = documents(PRETRAIN / "llamafactory_wiki_demo.txt", "line")[:10]
    pages = documents(PRETRAIN / "llamafactory_c4_demo.jsonl")[:10]
    return [*novel, *articles, *pages, "\n".join(klue_premises()[:40]), *tang_poems()[:20]]


@pytest.mark.parametrize("reason", sorted(REASON_RULE))
def test_each_rule_drops_its_junk_and_keeps_real_prose(reason, real_prose):
    rule = RULE_OF[REASON_RULE[reason]]
    junk = next(d for d in JUNK if d["expected"] == reason)
    assert rule(TextStats(normalize_text(junk["text"])), CONFIG) == reason
    assert [text[:60] for text in real_prose if rule(TextStats(text), CONFIG)] == []


def test_too_many_words_and_each_bound_is_an_option():
    novel = documents(PRETRAIN / "gutenberg_1342_pride_and_prejudice.txt")[0]
    assert quality_reason(novel) is None
    assert quality_reason(novel, QualityConfig(max_words=100_000)) == "too_many_words"
    assert quality_reason("Hello world", QualityConfig(min_words=0)) is None
    spam = next(d["text"] for d in JUNK if d["expected"] == "repeated_top_ngram")
    relaxed = dataclasses.replace(CONFIG, max_top_ngram=(), max_duplicate_ngrams=())
    assert quality_reason(spam, relaxed) is None


def test_whole_real_documents_are_all_kept():
    files = [(PRETRAIN / "llamafactory_wiki_demo.txt", "line"),
             *((path, "file") for path in sorted(PRETRAIN.glob("*.txt"))
               if "wiki_demo" not in path.name)]
    for path, unit in files:
        rate, reasons = keep_rate(documents(path, unit))
        assert rate == 1.0, (path.name, reasons)


def test_nearly_all_web_pages_are_kept_and_the_drops_are_repetitive_pages():
    rate, reasons = keep_rate(documents(PRETRAIN / "llamafactory_c4_demo.jsonl"))
    assert rate >= 0.93, reasons
    assert set(reasons) - {None} <= {"duplicate_ngrams", "repeated_top_ngram", "symbol_ratio"}


@pytest.mark.parametrize(("name", "floor"), [("gutenberg_1342_pride_and_prejudice.txt", 0.95),
                                             ("tinyshakespeare.txt", 0.97)])
def test_nearly_all_book_paragraphs_are_kept(name, floor):
    """Paragraphs of books, down to one line of verse; most drops are chapter headings."""
    texts = documents(PRETRAIN / name, "paragraph")
    rate, reasons = keep_rate(texts)
    assert rate >= floor, reasons
    assert reasons["too_few_words"] > (len(texts) - reasons[None]) / 2


def test_space_tokenised_wikitext_paragraphs_lose_only_headings():
    texts = documents(PRETRAIN / "wikitext2_valid.txt", "paragraph")
    dropped = [text for text in texts if quality_reason(text)]
    body = [text for text in texts if not text.lstrip().startswith("=")]
    assert sum(quality_reason(text) is None for text in body) / len(body) >= 0.97
    assert sum(text.lstrip().startswith("=") for text in dropped) / len(dropped) >= 0.9


def test_korean_and_chinese_text_is_kept():
    premises, poems = klue_premises(), tang_poems()
    assert keep_rate(premises)[0] == 1.0
    assert keep_rate(poems)[0] >= 0.99
    # Korean words (eojeol) are short in characters: a Latin-tuned mean-word-length rule
    # would drop these; it is skipped for Hangul, Han and kana.
    short = [p for p in premises
             if len(split_words(p)) >= 10 and TextStats(p).word_chars / len(split_words(p)) < 3]
    assert short and all(quality_reason(p) is None for p in short)


def test_han_characters_count_as_words():
    poem = tang_poems()[0]
    words = split_words(poem)
    assert words == [c for c in poem if "\u4e00" <= c <= "\u9fff"]
    assert len(poem.split()) < CONFIG.min_words * 2 < len(words)


def test_indic_vowel_signs_stay_inside_words():
    assert split_words("हिन्दी भाषा, don't stop") == ["हिन्दी", "भाषा", "don't", "stop"]


def test_first_failure_reports_the_cheapest_rule_first():
    assert first_failure(TextStats("Hi"), CONFIG) == "too_few_words"


def test_ngram_limits_parse_and_format():
    assert parse_ngram_limits(format_ngram_limits(CONFIG.max_top_ngram)) == CONFIG.max_top_ngram
    assert parse_ngram_limits("") == ()
    for bad in ("2", "2:x", "0:0.1", "2:1.5", "2:0.1,2:0.2"):
        with pytest.raises(ValueError):
            parse_ngram_limits(bad)


def test_messages_name_the_thresholds():
    assert quality.describe("too_few_words", CONFIG) == "fewer than 3 words"
    assert "2:0.2,3:0.18,4:0.16" in quality.describe("repeated_top_ngram", CONFIG)


# --------------------------------------------------------------------------- fast paths


def _exact_top_ngram(stats, config):
    """``top_ngram`` without its bound or its sort: n-grams counted in a dict, every n."""
    for n, maximum in sorted(config.max_top_ngram):
        ids = stats.ngram_ids(n)
        if not len(ids):
            break
        counts = collections.Counter(ids.tolist())
        count = max(counts.values())
        if count < quality.TOP_NGRAM_MIN_COUNT:
            break
        first = next(i for i, value in enumerate(ids.tolist()) if counts[value] == count)
        chars = count * int(stats.word_lengths[first:first + n].sum())
        if quality._above(quality._share(chars, stats.word_chars), maximum):
            return TOP_NGRAM
    return None


def _stuffed(phrase: str, times: int, filler: list[str]) -> str:
    return " ".join([phrase] * times + filler)


def test_the_top_ngram_bound_never_changes_a_verdict(real_prose):
    filler = documents(PRETRAIN / "llamafactory_c4_demo.jsonl")[0].split()
    texts = [*real_prose, *(normalize_text(d["text"]) for d in JUNK)]
    # Around each limit: a phrase repeated over a share of the words close to it.
    for phrase in ("buy now", "best cheap shoes", "click here to win"):
        for times in range(1, 80, 3):
            texts.append(_stuffed(phrase, times, filler[:300]))
    configs = [CONFIG, dataclasses.replace(CONFIG, max_top_ngram=((1, 0.05), (2, 0.02))),
               dataclasses.replace(CONFIG, max_top_ngram=((3, 0.0), (5, 0.01)))]
    verdicts = collections.Counter()
    for config in configs:
        for text in texts:
            found = quality.top_ngram(TextStats(text), config)
            assert found == _exact_top_ngram(TextStats(text), config), text[:80]
            verdicts[found] += 1
    assert verdicts[TOP_NGRAM] > 20 and verdicts[None] > 100


def test_letters_count_every_script_like_the_digit_pattern():
    texts = ["abc_def 123", "٣٤٥ arabic-indic ٦", "fullwidth \uff11\uff12\uff13 digits", "ok", "",
             "mixed 4_2 ߁߂ devanagari २३ and thai ๓"]
    for text in texts:
        stats = TextStats(text)
        expected = stats.word_chars - sum(map(len, re.findall(r"[\d_]+", text)))
        assert stats.letters == expected, text


def test_verdicts_are_remembered_per_text_and_configuration(monkeypatch):
    monkeypatch.setattr(quality, "_VERDICTS", {})
    spam = next(d["text"] for d in JUNK if d["expected"] == "repeated_top_ngram")
    relaxed = dataclasses.replace(CONFIG, max_top_ngram=(), max_duplicate_ngrams=())
    for _ in range(2):  # the second round answers from memory
        assert quality_reason(spam) == "repeated_top_ngram"
        assert quality_reason(spam, relaxed) is None
    assert quality._VERDICTS[CONFIG][TextStats(spam).digest] == "repeated_top_ngram"
    monkeypatch.setattr(quality, "_VERDICTS_MAX", 2)  # full: cleared, still right
    for text in ("Hi", spam, "Hello there my friend", "Hi", spam):
        assert quality_reason(text) == quality.judge(TextStats(text), CONFIG)
        assert len(quality._VERDICTS[CONFIG]) <= 2
