"""Quality rules for knowledge documents, in the style of Gopher (Rae et al., 2021) and C4.

Each rule is a small named function ``rule(stats, config) -> reason | None`` with its own
thresholds in ``QualityConfig`` and its own reason code, so a dropped document always says which
rule dropped it and why. ``first_failure`` runs the rules cheapest first and returns the first
reason. ``TextStats`` computes what the rules share (words, lines, paragraphs, n-gram ids) once
per document and only when a rule asks for it. ``first_failure`` remembers its verdicts per
process by a hash of the text: deduplication's first pass and the main pass judge the same
normalised documents, so the second judgement is a lookup.

Words and scripts. Words are ``transforms.knowledge.words``': runs of letters, marks, digits and
underscores (apostrophes inside, as in "don't"), each Han character or kana a word of its own;
punctuation and symbols are not words. Each word has a 64-bit id (equal words, equal ids), so
repeated n-grams are found without a string per word. Hangul is written with spaces and counted
like Latin text. The mean-word-length rule measures Latin-like alphabets (Gopher tuned it on
English, where a character is a letter); it is skipped for documents whose letters are mostly
Han, kana or Hangul (a character is a syllable or a word) or from scripts written without spaces
(Thai, Lao, Khmer, Myanmar, Tibetan). The other rules are script-neutral.

Ratios over a handful of words or lines are noise, so the mean-word-length and symbol rules
need 10 words and the line rules 3 lines; the top n-gram must occur 3 times (a phrase said
twice is style, not keyword stuffing).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import re
from collections.abc import Callable

import numpy as np

from transforms.core.vocabulary import (
    BULLET_LINES,
    DUPLICATE_LINES,
    DUPLICATE_NGRAMS,
    DUPLICATE_PARAGRAPHS,
    ELLIPSIS_LINES,
    LOW_ALPHA,
    MEAN_WORD_LENGTH,
    SYMBOL_RATIO,
    TOO_FEW_WORDS,
    TOO_MANY_WORDS,
    TOP_NGRAM,
)
from transforms.knowledge import words as words_module
from transforms.knowledge.words import IDEOGRAPHS, Words, find_words

# Reason codes (filtered/ files and manifest.json).

# Scripts where the mean word length in characters says nothing about quality (see above):
# kana and Han, Hangul, and Thai, Lao, Tibetan, Myanmar and Khmer.
_SYLLABIC_OR_UNSPACED = re.compile(
    f"[{IDEOGRAPHS}\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7ff"
    "\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff]+")
_COMMON_SPACES = (" ", "\n", "\t", "\u00a0", "\u3000")  # what normalised text has left
_ELLIPSES = ("...", "…")
# Characters that start a bulleted line; "-" and "*" only when a space follows (not "--" or
# "*emphasis*").
_BULLETS = ("•", "●", "○", "◦", "▪", "▫", "■", "□", "‣", "\u2043", "∙", "·", "➢", "➤", "►",
            "▶", "✓", "✔", "- ", "* ", "+ ")
# Ratios over a handful of words or lines are noise ("I am not." has short words, a one-line
# paragraph that ends in "..." has all its lines cut off): those rules need at least this much.
RATIO_MIN_WORDS = 10
RATIO_MIN_LINES = 3
TOP_NGRAM_MIN_COUNT = 3
# A large odd multiplier for polynomial n-gram hashes (wraps modulo 2**64; only equality is used).
_NGRAM_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
# Verdicts remembered per configuration, by text hash; cleared when full, so memory stays
# bounded (about 100 bytes an entry).
_VERDICTS: dict[QualityConfig, dict[bytes, str | None]] = {}
_VERDICTS_MAX = 1 << 19
_NO_VERDICT = object()


def text_hash(text: str) -> bytes:
    """128-bit hash of a text: equal texts, equal hashes (deduplication's exact key too)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class QualityConfig:
    """Thresholds of the quality rules; a bound of 0 turns its check off.

    ``max_top_ngram`` maps n to the largest share of word characters the most frequent n-gram
    may cover; ``max_duplicate_ngrams`` maps n to the largest share of word characters that
    may lie in repeated n-grams (occurrences after the first). Defaults are Gopher's, except
    the word bounds (Gopher keeps 50 to 100,000 words: whole web pages) and the letter
    fraction, which are loose enough for book paragraphs, verse, whole books and
    space-tokenised text.
    """

    min_words: int = 3
    max_words: int = 1_000_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_ellipsis_lines: float = 0.3
    max_bullet_lines: float = 0.9
    min_alpha_fraction: float = 0.5
    max_duplicate_lines: float = 0.3
    max_duplicate_line_chars: float = 0.2
    max_duplicate_paragraphs: float = 0.3
    max_duplicate_paragraph_chars: float = 0.2
    max_top_ngram: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    max_duplicate_ngrams: tuple[tuple[int, float], ...] = (
        (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))


class TextStats:
    """What the rules measure on one document, each computed on first use."""

    def __init__(self, text: str):
        self.text = text
        self._ngrams: dict[int, np.ndarray] = {}
        self._counts: dict[int, tuple[int, int, int, int]] = {}

    @functools.cached_property
    def digest(self) -> bytes:
        return text_hash(self.text)

    @functools.cached_property
    def words(self) -> Words:
        return find_words(self.text)

    @property
    def word_count(self) -> int:
        return len(self.words)

    @property
    def word_lengths(self) -> np.ndarray:
        return self.words.lengths

    @functools.cached_property
    def word_chars(self) -> int:
        return int(self.word_lengths.sum())

    @property
    def letters(self) -> int:
        """Letters and marks: word characters that are not digits or underscores."""
        return self.word_chars - self.words.not_letters

    @functools.cached_property
    def lines(self) -> list[str]:
        return [line for line in map(str.strip, self.text.split("\n")) if line]

    @functools.cached_property
    def paragraphs(self) -> list[str]:
        return [p for p in map(str.strip, self.text.split("\n\n")) if p]

    @property
    def word_ids(self) -> np.ndarray:
        """Each word's id: equal words, equal ids."""
        return self.words.ids

    @functools.cached_property
    def _word_ends(self) -> np.ndarray:
        """Word characters before each word boundary: 0, then the running sum."""
        ends = np.zeros(self.word_count + 1, dtype=np.int64)
        np.cumsum(self.word_lengths, out=ends[1:])
        return ends

    def max_window_chars(self, n: int) -> int:
        """The most word characters any n consecutive words hold."""
        ends = self._word_ends
        return int((ends[n:] - ends[:-n]).max()) if len(ends) > n else 0

    def _counted(self, n: int) -> tuple[int, int, int, int]:
        """The kernel's ``ngrams``: the most frequent n-gram's count, first position and word
        characters, and the word characters that repeated n-grams cover."""
        if n not in self._counts:
            self._counts[n] = words_module._kernel.ngrams(self.word_ids, self.word_lengths, n)
        return self._counts[n]

    def count_bound(self, n: int) -> int:
        """At least the count of the most frequent n-gram: the count itself with the kernel,
        else the fullest of 2**k >= 2 x len hash buckets (see ``_max_count_bound``)."""
        if words_module._kernel is not None:
            return self._counted(n)[0]
        return _max_count_bound(self.ngram_ids(n))

    def repeated_chars(self, n: int) -> int:
        """Word characters inside an n-gram that occurred earlier (each word counted once)."""
        if words_module._kernel is not None:
            return self._counted(n)[3]
        return int(self.word_lengths[_repeated_cover(self.ngram_ids(n), n)].sum())

    def ngram_ids(self, n: int) -> np.ndarray:
        """One uint64 per n-gram of consecutive words (position i covers words i..i+n-1), as
        ``ngram_hashes`` computes them; each n is built from n - 1 in one step."""
        if n not in self._ngrams:
            if n == 1 or not self.word_count:
                self._ngrams[n] = ngram_hashes(self.word_ids, n)
            else:
                shorter = self.ngram_ids(n - 1)[:-1]
                self._ngrams[n] = (shorter * _NGRAM_MULTIPLIER
                                   + self.word_ids[n - 1:].astype(np.uint64))
        return self._ngrams[n]


def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hashes of every window of ``n`` consecutive values, vectorised.

    >>> hashes = ngram_hashes(np.array([7, 8, 7, 8], dtype=np.uint64), 2)
    >>> len(hashes), bool(hashes[0] == hashes[2]), bool(hashes[0] == hashes[1])
    (3, True, False)
    """
    count = len(word_hashes) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    hashes = np.zeros(count, dtype=np.uint64)
    for k in range(n):
        hashes = hashes * _NGRAM_MULTIPLIER + word_hashes[k:k + count]
    return hashes


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _above(value: float, maximum: float) -> bool:
    return bool(maximum) and value > maximum


# --------------------------------------------------------------------------- the measures


def mean_word_chars(stats: TextStats) -> float:
    return _share(stats.word_chars, stats.word_count)


def symbols_per_word(stats: TextStats) -> float:
    """Hash signs and ellipses per word."""
    symbols = stats.text.count("#") + sum(stats.text.count(e) for e in _ELLIPSES)
    return _share(symbols, stats.word_count)


def letter_share(stats: TextStats) -> float:
    """Letters among the visible characters."""
    return _share(stats.letters, len(stats.text) - sum(map(stats.text.count, _COMMON_SPACES)))


def _repeats(items: list[str]) -> tuple[int, int]:
    """How many of ``items`` repeat an earlier one, and their characters."""
    seen: set[str] = set()
    repeated = repeated_chars = 0
    for item in items:
        if item in seen:
            repeated += 1
            repeated_chars += len(item)
        else:
            seen.add(item)
    return repeated, repeated_chars


def repeated_line_share(stats: TextStats) -> float:
    return _share(_repeats(stats.lines)[0], len(stats.lines))


# What ``--write_documents`` records of each kept document, by column: the quantities the rules
# judge, measured on the text as tokenized, so that a user can set new thresholds afterwards.
MEASURES: dict[str, Callable[[TextStats], float]] = {
    "mean_word_length": mean_word_chars,
    "symbols_per_word": symbols_per_word,
    "letter_share": letter_share,
    "repeated_line_share": repeated_line_share,
}


# --------------------------------------------------------------------------- the rules


def word_count(stats: TextStats, config: QualityConfig) -> str | None:
    """Too short to teach anything, or so long it is probably a dump, not a document."""
    n = stats.word_count
    if n < config.min_words:
        return TOO_FEW_WORDS
    return TOO_MANY_WORDS if _above(n, config.max_words) else None


def mean_word_length(stats: TextStats, config: QualityConfig) -> str | None:
    """Very short words mean fragments or tables; very long ones, URLs, hashes or base64."""
    if stats.word_count < RATIO_MIN_WORDS:
        return None
    mean = mean_word_chars(stats)
    if mean < config.min_mean_word_length or _above(mean, config.max_mean_word_length):
        return None if _mostly_syllabic_or_unspaced(stats) else MEAN_WORD_LENGTH
    return None


def _mostly_syllabic_or_unspaced(stats: TextStats) -> bool:
    return 2 * sum(map(len, _SYLLABIC_OR_UNSPACED.findall(stats.text))) > stats.letters


def symbol_ratio(stats: TextStats, config: QualityConfig) -> str | None:
    """Hash signs and ellipses per word: hashtag spam and truncated teasers."""
    if stats.word_count < RATIO_MIN_WORDS:
        return None
    return SYMBOL_RATIO if _above(symbols_per_word(stats), config.max_symbol_word_ratio) else None


def ellipsis_lines(stats: TextStats, config: QualityConfig) -> str | None:
    """Most lines cut off with an ellipsis: snippets of other pages, not text."""
    if len(stats.lines) < RATIO_MIN_LINES:
        return None
    ending = sum(map(str.endswith, stats.lines, itertools.repeat(_ELLIPSES)))
    return ELLIPSIS_LINES if _above(_share(ending, len(stats.lines)), config.max_ellipsis_lines) \
        else None


def bullet_lines(stats: TextStats, config: QualityConfig) -> str | None:
    """Almost every line a bullet point: navigation menus and link lists."""
    if len(stats.lines) < RATIO_MIN_LINES:
        return None
    bulleted = sum(map(str.startswith, stats.lines, itertools.repeat(_BULLETS)))
    return BULLET_LINES if _above(_share(bulleted, len(stats.lines)), config.max_bullet_lines) \
        else None


def alpha_fraction(stats: TextStats, config: QualityConfig) -> str | None:
    """Too few letters among the visible characters: symbol soup, number tables, markup."""
    return LOW_ALPHA if letter_share(stats) < config.min_alpha_fraction else None


def duplicate_lines(stats: TextStats, config: QualityConfig) -> str | None:
    """Many repeated lines (by count or by characters): boilerplate or generated spam."""
    return _duplicates(stats.lines, len(stats.text), config.max_duplicate_lines,
                       config.max_duplicate_line_chars, DUPLICATE_LINES)


def duplicate_paragraphs(stats: TextStats, config: QualityConfig) -> str | None:
    """Many repeated paragraphs (by count or by characters)."""
    return _duplicates(stats.paragraphs, len(stats.text), config.max_duplicate_paragraphs,
                       config.max_duplicate_paragraph_chars, DUPLICATE_PARAGRAPHS)


def _duplicates(items: list[str], text_chars: int, max_items: float, max_chars: float,
                reason: str) -> str | None:
    repeated, repeated_chars = _repeats(items)
    if _above(_share(repeated, len(items)), max_items) or \
            _above(_share(repeated_chars, text_chars), max_chars):
        return reason
    return None


def top_ngram(stats: TextStats, config: QualityConfig) -> str | None:
    """One short phrase repeated over much of the text: keyword stuffing.

    Most documents are far from the limit; an upper bound on the most frequent n-gram's count
    (from hash buckets, no sort) times the longest n words shows that without finding it. An n
    so cleared cannot fail, and when its true count is under 3 no larger n can either, so the
    verdict is the one the exact count gives. The smallest n's bound also bounds every larger
    n's count (each occurrence starts with one of the smaller n-gram), so one bound clears most
    documents for all n at once.
    """
    limits = sorted(config.max_top_ngram)
    if not limits or stats.word_count < limits[0][0]:
        return None
    bound = stats.count_bound(limits[0][0])
    if bound < TOP_NGRAM_MIN_COUNT or not any(
            _above(_share(bound * stats.max_window_chars(n), stats.word_chars), maximum)
            for n, maximum in limits):
        return None
    for n, maximum in limits:
        if stats.word_count < n:  # no n-gram at all
            break
        bound = stats.count_bound(n)
        if bound < TOP_NGRAM_MIN_COUNT:
            break
        if not _above(_share(bound * stats.max_window_chars(n), stats.word_chars), maximum):
            continue
        count, chars = most_frequent_ngram(stats, n)
        if count < TOP_NGRAM_MIN_COUNT:
            break  # a longer n-gram is never more frequent; a phrase said twice is style
        if _above(_share(chars * count, stats.word_chars), maximum):
            return TOP_NGRAM
    return None


def _max_count_bound(values: np.ndarray) -> int:
    """At least the count of the most frequent value: the fullest of 2**k >= 2 x len hash
    buckets (multiply-shift of the values: equal values share a bucket)."""
    bits = max(len(values).bit_length() + 1, 4)
    buckets = (values.astype(np.uint64) * _NGRAM_MULTIPLIER) >> np.uint64(64 - bits)
    return int(np.bincount(buckets.astype(np.intp), minlength=1 << bits).max())


def most_frequent_ngram(stats: TextStats, n: int) -> tuple[int, int]:
    """The count of the most frequent n-gram and its word characters; among n-grams equally
    frequent, the one that occurs first (as datatrove's Gopher filter picks it), so the verdict
    does not depend on how ids are assigned. One stable sort: the first position of each
    distinct n-gram comes first in its run (or the kernel's one pass)."""
    if words_module._kernel is not None:
        count, _, chars, _ = stats._counted(n)
        return count, chars
    ids = stats.ngram_ids(n)
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    counts = np.diff(np.append(starts, len(ordered)))
    count = int(counts.max())
    first = int(order[starts[counts == count]].min())
    return count, int(stats._word_ends[first + n] - stats._word_ends[first])


def duplicate_ngrams(stats: TextStats, config: QualityConfig) -> str | None:
    """Much of the text inside repeated n-grams: repeated passages, loops, templated pages.

    A word counts once however many repeated n-grams cover it; the first occurrence of each
    n-gram is not counted as repeated. The words a repeated (n+1)-gram covers are covered by
    repeated n-grams too, so once the share is under every remaining maximum, larger n cannot
    fail and are skipped: most documents need one n.
    """
    limits = sorted(config.max_duplicate_ngrams)
    for i, (n, maximum) in enumerate(limits):
        if stats.word_count < n:  # no n-gram at all
            break
        share = _share(stats.repeated_chars(n), stats.word_chars)
        if _above(share, maximum):
            return DUPLICATE_NGRAMS
        if all(share <= later for _, later in limits[i + 1:] if later):
            break
    return None


def _repeated_cover(ids: np.ndarray, n: int) -> np.ndarray:
    """Which words lie in an n-gram that occurred earlier (boolean, one per word)."""
    order = np.argsort(ids)
    ordered = ids[order]
    new_value = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    starts = np.flatnonzero(new_value)
    first = np.minimum.reduceat(order, starts)  # first position of each distinct n-gram
    repeated = order[order != first[np.cumsum(new_value) - 1]]
    size = len(ids) + n
    depth = np.bincount(repeated, minlength=size) - np.bincount(repeated + n, minlength=size)
    return np.cumsum(depth)[:len(ids) + n - 1] > 0


Rule = Callable[[TextStats, QualityConfig], "str | None"]
# Cheapest first: a document leaves at its first failed rule.
RULES: tuple[Rule, ...] = (word_count, mean_word_length, symbol_ratio, ellipsis_lines,
                           bullet_lines, alpha_fraction, duplicate_lines, duplicate_paragraphs,
                           top_ngram, duplicate_ngrams)


_MESSAGES = {
    TOO_FEW_WORDS: "fewer than {min_words} words",
    TOO_MANY_WORDS: "more than {max_words} words",
    MEAN_WORD_LENGTH: "mean word length outside {min_mean_word_length}..{max_mean_word_length}",
    SYMBOL_RATIO: "more than {max_symbol_word_ratio} '#' or ellipses per word",
    ELLIPSIS_LINES: "more than {max_ellipsis_lines} of the lines end in an ellipsis",
    BULLET_LINES: "more than {max_bullet_lines} of the lines start with a bullet",
    LOW_ALPHA: "letters are under {min_alpha_fraction} of the visible characters",
    DUPLICATE_LINES: "repeated lines exceed {max_duplicate_lines} of the lines or "
                     "{max_duplicate_line_chars} of the characters",
    DUPLICATE_PARAGRAPHS: "repeated paragraphs exceed {max_duplicate_paragraphs} of the "
                          "paragraphs or {max_duplicate_paragraph_chars} of the characters",
    TOP_NGRAM: "the most frequent n-gram covers more of the words than n:share "
               "{max_top_ngram} allows",
    DUPLICATE_NGRAMS: "repeated n-grams cover more of the words than n:share "
                      "{max_duplicate_ngrams} allows",
}


def describe(reason: str, config: QualityConfig) -> str:
    """The rule behind a reason code, with its thresholds, for filtered/ messages."""
    values = {name: format_ngram_limits(value) if isinstance(value, tuple) else value
              for name, value in dataclasses.asdict(config).items()}
    return _MESSAGES[reason].format(**values)


def format_ngram_limits(limits: tuple[tuple[int, float], ...]) -> str:
    """``((2, 0.2), (3, 0.18))`` as ``2:0.2,3:0.18``, the form the options take."""
    return ",".join(f"{n}:{share:g}" for n, share in limits)


def parse_ngram_limits(text: str) -> tuple[tuple[int, float], ...]:
    """``2:0.2,3:0.18`` as ``((2, 0.2), (3, 0.18))``; an empty string turns the rule off.

    >>> parse_ngram_limits("3:0.18, 2:0.2")
    ((2, 0.2), (3, 0.18))
    """
    limits = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        n, colon, share = item.partition(":")
        try:
            limit = (int(n), float(share))
        except ValueError:
            limit = None
        if not colon or limit is None or limit[0] < 1 or not 0.0 <= limit[1] <= 1.0:
            raise ValueError(f"expected n:share items like 2:0.2 (n >= 1, share in [0, 1]), "
                             f"got {item!r}")
        if limit[0] in limits:
            raise ValueError(f"n={limit[0]} is given twice in {text!r}")
        limits[limit[0]] = limit[1]
    return tuple(sorted(limits.items()))


def first_failure(stats: TextStats, config: QualityConfig) -> str | None:
    """The reason code of the first rule the document fails, or None to keep it.

    Remembered per process by the text's hash (see the module docstring).
    """
    verdicts = _VERDICTS.get(config)
    if verdicts is None:
        verdicts = _VERDICTS.setdefault(config, {})
    found = verdicts.get(stats.digest, _NO_VERDICT)
    if found is not _NO_VERDICT:
        return found
    reason = judge(stats, config)
    if len(verdicts) >= _VERDICTS_MAX:
        verdicts.clear()
    verdicts[stats.digest] = reason
    return reason


def judge(stats: TextStats, config: QualityConfig) -> str | None:
    """``first_failure`` without the memory: every rule in order until one fails."""
    for rule in RULES:
        reason = rule(stats, config)
        if reason is not None:
            return reason
    return None


def quality_reason(text: str, config: QualityConfig = QualityConfig()) -> str | None:
    """``first_failure`` of ``text``."""
    return first_failure(TextStats(text), config)
