"""Words as arrays: the same words as a plain regular expression finds, and ids that are equal
exactly when the words are."""

import doctest
import random
import re

import numpy as np
import pytest

from tests.conftest import other_shared_texts, pretrain_documents
from transforms.knowledge import words
from transforms.knowledge.words import APOSTROPHES, IDEOGRAPHS, MARKS, find_words, split_words

# The definition, written as regular expressions: a run of \w and marks (apostrophes inside);
# with ideographs in the text, each ideograph alone and the runs without them.
_CHAR = f"[\\w{MARKS}]"
_SPACED_WORD = re.compile(f"{_CHAR}+(?:[{APOSTROPHES}]{_CHAR}+)*")
_NON_IDEOGRAPH = f"(?:[^\\W{IDEOGRAPHS}]|[{MARKS}])"
_ANY_WORD = re.compile(
    f"[{IDEOGRAPHS}]|{_NON_IDEOGRAPH}+(?:[{APOSTROPHES}]{_NON_IDEOGRAPH}+)*")


@pytest.fixture(params=["kernel", "numpy"], autouse=True)
def way(request, monkeypatch):
    """Every test here runs on the C kernel and on its numpy reference."""
    if request.param == "numpy":
        monkeypatch.setattr(words, "_kernel", None)
    elif words._kernel is None:
        pytest.skip("the C kernel is not built (tests/knowledge/test_words_kernel.py says why)")


def reference_words(text: str) -> list[str]:
    pattern = _ANY_WORD if re.search(f"[{IDEOGRAPHS}]", text) else _SPACED_WORD
    return pattern.findall(text)


def assert_like_reference(texts):
    different = [t for t in texts if split_words(t) != reference_words(t)]
    assert not different, f"{len(different)} texts differ, first {different[0][:200]!r}"


def test_doctests():
    assert doctest.testmod(words).failed == 0


def test_same_words_as_the_regex_on_every_shared_text():
    texts = pretrain_documents() + other_shared_texts()
    assert len(texts) > 100_000
    assert_like_reference(texts)


# Characters where the rules change: apostrophes at either end and doubled, marks, digits of
# other scripts, ideographs beside letters, Hangul, emoji and a Han character outside the BMP,
# a lone surrogate.
ALPHABET = "ab Z'\u2019_9\u0663\u4e2d\u3042\ud55c\u0301\u093f.-\n\t\U0001f600\U00020000\ud800"


@pytest.mark.parametrize("seed", range(4))
def test_same_words_as_the_regex_on_random_strings(seed):
    rng = random.Random(seed)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
             for _ in range(5_000)]
    assert_like_reference(texts)


def _ids_match_words(texts, ids_of, key):
    """Over all texts, one id per distinct key(word) and one key(word) per id."""
    id_of_word, word_of_id = {}, {}
    for text in texts:
        found = find_words(text)
        for word, word_id in zip(found.strings(text), ids_of(found).tolist(), strict=True):
            assert id_of_word.setdefault(key(word), word_id) == word_id, word
            assert word_of_id.setdefault(word_id, key(word)) == key(word), word
    return len(id_of_word)


def test_equal_words_have_equal_ids_and_different_words_different_ones():
    texts = pretrain_documents()[:3000]
    assert _ids_match_words(texts, lambda w: w.ids, lambda word: word) > 50_000


def test_folded_ids_ignore_case_and_apostrophe_style():
    texts = [*pretrain_documents()[:3000], "Don\u2019t DON'T don't", "Straße STRASSE"]

    def fold(word):
        return "".join(c.lower() if len(c.lower()) == 1 else c for c in word).replace(
            "\u2019", "'")

    assert _ids_match_words(texts, lambda w: w.folded_ids, fold) > 40_000
    found = find_words("Don\u2019t DON'T don't")
    assert len(set(found.folded_ids.tolist())) == 1 and len(set(found.ids.tolist())) == 3


def test_ids_depend_on_order_and_length():
    found = find_words("ab ba a aa aaa abab")
    assert len(set(found.ids.tolist())) == 6


def test_lengths_and_counts():
    found = find_words("It's 42 o'clock_now, 中文 ok\u0301")
    assert found.strings("It's 42 o'clock_now, 中文 ok\u0301") == [
        "It's", "42", "o'clock_now", "中", "文", "ok\u0301"]
    assert found.lengths.tolist() == [4, 2, 11, 1, 1, 3]
    assert found.not_letters == 3  # 4, 2 and _
    assert len(find_words("")) == 0 and find_words("").ids.dtype == np.uint64
