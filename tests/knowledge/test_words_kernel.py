"""The C kernel of words and n-gram counts gives exactly what its numpy reference gives, and is
built: the same word arrays, the same most frequent n-grams and repeated cover, the same
verdicts."""

import random
import shutil

import numpy as np
import pytest

from tests.conftest import other_shared_texts, pretrain_documents
from transforms.knowledge import quality, words
from transforms.knowledge.quality import QualityConfig, TextStats
from transforms.knowledge.words import find_words, find_words_numpy

FIELDS = ("points", "starts", "lengths", "ids", "folded_ids")
# Where the rules change (apostrophes at either end and doubled, marks, ideographs beside
# letters, digits, a lone surrogate) and code points of every plane, the last one included.
ALPHABET = ("ab Z'\u2019_9\u0663\u4e2d\u3042\ud55c\u0301\u093f.-\n\t\U0001f600\U00020000\ud800"
            "\U000e0100\U0010ffff\u00e9")
EDGES = ["", "'", "a'", "'a", "a'b", "a''b", "a'b'c", "\u4e2d'a", "a'\u4e2d", "x\u0301'",
         "\ud800", "_", "1", "\n\n", "\U00020001x", "DON\u2019T Stra\u00dfe"]


def _difference(text: str) -> str | None:
    kernel, reference = find_words(text), find_words_numpy(text)
    for field in FIELDS:
        got, expected = getattr(kernel, field), getattr(reference, field)
        if got.dtype != expected.dtype or not np.array_equal(got, expected):
            return field
    return None if kernel.not_letters == reference.not_letters else "not_letters"


@pytest.fixture(scope="module")
def kernel():
    if words._kernel is None:
        pytest.skip("the C kernel is not built")
    return words._kernel


def test_kernel_is_built_where_a_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: the package finds words with numpy")
    assert words._kernel is not None, (
        "transforms/knowledge/_words.c is not built: reinstall the package (make setup)")


def test_same_arrays_as_numpy_on_every_shared_text(kernel):
    texts = pretrain_documents() + other_shared_texts()
    assert len(texts) > 100_000
    different = [(i, field) for i, text in enumerate(texts) if (field := _difference(text))]
    assert not different, f"{len(different)} texts differ, first {different[0]}"


@pytest.mark.parametrize("seed", range(3))
def test_same_arrays_as_numpy_on_random_strings(kernel, seed):
    rng = random.Random(seed)
    texts = EDGES + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60)))
                     for _ in range(10_000)]
    different = [(text, field) for text in texts if (field := _difference(text))]
    assert not different, f"{len(different)} texts differ, first {different[0]}"


def test_the_kernels_reading_of_the_classes_holds_for_every_code_point():
    """The kernel starts a word at each ideograph and joins an apostrophe only between joined
    characters: no code point may be an ideograph and joined, or an apostrophe and joined."""
    classes = words._classes(0x110000)
    joined = (classes & words._JOINED) != 0
    assert not np.any(joined & ((classes & words._IDEOGRAPH) != 0))
    assert not np.any(joined & ((classes & words._APOSTROPHE) != 0))


def test_tables_too_small_are_refused(kernel):
    with pytest.raises(ValueError, match="beyond the tables"):
        kernel.find("\U00020000", words._classes(0x10000), words._lower(0x10000))
    assert kernel.plane_end("abc\u00e9\u4e2d") == 0x10000
    assert kernel.plane_end("a\U00020000") == 0x30000


def _repetitive_texts(count: int) -> list[str]:
    """Word salads from small vocabularies: many repeated n-grams, ties for the most frequent."""
    rng = random.Random(7)
    vocabulary = pretrain_documents()[0].split()[:40]
    return [" ".join(rng.choice(vocabulary[:rng.randint(1, len(vocabulary))])
                     for _ in range(rng.randint(1, 300))) for _ in range(count)]


def _numpy_counts(stats: TextStats, n: int) -> tuple[int, int, int]:
    """The most frequent n-gram's count and characters and the repeated cover, in numpy."""
    ids = stats.ngram_ids(n)
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    counts = np.diff(np.append(starts, len(ordered)))
    first = int(order[starts[counts == counts.max()]].min())
    chars = int(stats.word_lengths[first:first + n].sum())
    repeated = int(stats.word_lengths[quality._repeated_cover(ids, n)].sum())
    return int(counts.max()), chars, repeated


def test_ngram_counts_equal_numpy(kernel):
    texts = pretrain_documents()[::20] + _repetitive_texts(2_000)
    checked = 0
    for text in texts:
        stats = TextStats(text)
        for n in (1, 2, 3, 5, 10):
            if stats.word_count < n:
                continue
            count, first, chars, repeated = kernel.ngrams(stats.word_ids, stats.word_lengths, n)
            assert (count, chars, repeated) == _numpy_counts(stats, n), (text[:100], n)
            assert chars == int(stats.word_lengths[first:first + n].sum())
            checked += 1
    assert checked > 9_000
    assert kernel.ngrams(np.zeros(2, np.uint64), np.ones(2, np.int64), 3) == (0, -1, 0, 0)


# The defaults, and n-gram rules tight enough that many texts fail them (n = 1 and 11 too).
CONFIGS = (QualityConfig(), QualityConfig(
    max_top_ngram=((1, 0.05), (2, 0.1), (5, 0.05)),
    max_duplicate_ngrams=((1, 0.5), (3, 0.2), (11, 0.05))))


@pytest.mark.parametrize("config", CONFIGS)
def test_same_verdicts_with_and_without_the_kernel(kernel, monkeypatch, config):
    texts = pretrain_documents()[::4] + other_shared_texts()[::4] + _repetitive_texts(3_000)

    def verdicts():
        return [(quality.judge(stats, config), quality.top_ngram(stats, config),
                 quality.duplicate_ngrams(stats, config))
                for stats in map(TextStats, texts)]

    with_kernel = verdicts()
    monkeypatch.setattr(words, "_kernel", None)
    assert verdicts() == with_kernel
    assert sum(found[1] is not None for found in with_kernel) > 200
    assert sum(found[2] is not None for found in with_kernel) > 200


# Every character str.split() splits at, in and beyond ASCII, beside a few that it does not
# (a zero-width space, NUL) and characters of every UTF-8 length, a lone surrogate included.
SPACES = (" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f"
          "\u3000\u200b\x00ab\u00e9\u4e2d\ud800\U0001f600\U0010ffff")


def test_collapsed_is_split_and_join_in_utf8(kernel):
    rng = random.Random(11)
    texts = pretrain_documents() + other_shared_texts() + [
        "".join(rng.choice(SPACES) for _ in range(rng.randint(0, 30))) for _ in range(30_000)]
    different = []
    for text in texts:
        key = " ".join(text.split())
        if kernel.collapsed(text) != (key.encode("utf-8", "surrogatepass"), len(key)):
            different.append(text)
    assert not different, f"{len(different)} texts differ, first {different[0][:100]!r}"


def test_the_lower_case_table_is_each_code_points_own_lower_case():
    """Built a block at a time; the same as lowering every code point alone."""
    table = words._lower.__wrapped__(0x110000)
    for point in range(0x110000):
        lower = chr(point).lower()
        expected = ord("'") if point == 0x2019 else ord(lower) if len(lower) == 1 else point
        assert table[point] == expected, hex(point)
