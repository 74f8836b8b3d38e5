"""Normalisation: one canonical text per document, checked on cases and on the real books."""

import doctest
import unicodedata

import pytest

from tests.conftest import SHARED_DATA, require_shared_data
from transforms.knowledge import normalize
from transforms.knowledge.normalize import NormalizeConfig, normalize_text

require_shared_data()

PRETRAIN = SHARED_DATA / "pretrain"
BOOKS = sorted(PRETRAIN.glob("gutenberg_*.txt"))
RAW = NormalizeConfig(collapse_whitespace=False, strip_gutenberg=False)


def test_doctests():
    assert doctest.testmod(normalize).failed == 0


def test_unicode_is_composed():
    decomposed = "Cafe\u0301 nai\u0308ve"
    assert normalize_text(decomposed) == "Café naïve"
    assert unicodedata.is_normalized("NFC", normalize_text(decomposed))


def test_control_zero_width_and_byte_order_marks_go_but_joiners_stay():
    text = "\ufeffa\x00b\x07c\x1bd\u200be\u2060f\u00adg\x9bh\ufeffi"
    assert normalize_text(text, RAW) == "abcdefghi"
    # ZWJ builds emoji sequences, ZWNJ spells Persian: both are part of the text.
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    assert normalize_text(f"{family} {persian}") == f"{family} {persian}"
    assert normalize_text("a\ud800b", RAW) == "ab"  # a lone surrogate from a JSON escape


def test_every_line_break_becomes_lf():
    assert normalize_text("a\r\nb\rc\x0bd\x0ce\x85f\u2028g\u2029h", RAW) == "a\nb\nc\nd\ne\nf\ng\nh"


def test_whitespace_collapses_but_paragraphs_and_indentation_stay():
    text = ("  Title \t\n\n\n\n\nOne  two\u00a0\u00a0three\tfour\u3000five.   \n"
            "    indented  line\n \n\nEnd")
    assert normalize_text(text) == (
        "Title\n\nOne two three four five.\n    indented line\n\nEnd")
    assert normalize_text(text, RAW) == text  # only the always-on steps, none of which apply


@pytest.mark.parametrize("book", BOOKS, ids=lambda p: p.stem)
def test_gutenberg_header_and_footer_are_cut_from_the_real_books(book):
    raw = book.read_text(encoding="utf-8")
    body = normalize_text(raw)
    assert "*** START OF" not in body and "*** END OF" not in body
    assert "Project Gutenberg" not in body[:2000] and "Project Gutenberg" not in body[-2000:]
    assert "gutenberg.org" not in body.lower()
    kept = normalize_text(raw, NormalizeConfig(strip_gutenberg=False))
    assert body in kept and len(body) < len(kept)
    first_words = {"pride": "PRIDE AND PREJUDICE", "sherlock": "THE ADVENTURES OF SHERLOCK",
                   "war": "WAR AND PEACE", "moby": "MOBY-DICK"}
    assert any(title in body[:300] for title in first_words.values()), body[:300]


def test_gutenberg_stripping_leaves_text_without_the_marker_alone():
    paragraph = "End of the Project Gutenberg EBook of Nothing, a paragraph quoted in an essay."
    assert normalize_text(paragraph) == paragraph


@pytest.mark.parametrize("path", sorted(PRETRAIN.glob("*.txt")), ids=lambda p: p.stem)
def test_normalising_twice_changes_nothing(path):
    once = normalize_text(path.read_text(encoding="utf-8"))
    assert once and normalize_text(once) == once
    assert "\r" not in once and "\ufeff" not in once and "\n\n\n" not in once
    assert not any(line.endswith((" ", "\t")) for line in once.split("\n"))


def _always_substituted(text: str, config: NormalizeConfig) -> str:
    """``normalize_text`` without its skips: every substitution runs on every text."""
    text = normalize._LINE_BREAK.sub("\n", normalize._INVISIBLE.sub("", text))
    text = unicodedata.normalize("NFC", text)
    if config.strip_gutenberg:
        text = normalize.strip_gutenberg(text)
    if config.collapse_whitespace:

        def replace(run):
            start, end = run.span()
            if end == len(text) or text[end] == "\n":
                return ""
            if start == 0 or text[start - 1] == "\n":
                return run.group()
            return " "

        text = normalize._BLANK_LINES.sub("\n\n", normalize._SPACE_RUN.sub(replace, text))
        text = text.strip()
    return text


def test_skipping_substitutions_with_nothing_to_change_changes_nothing():
    """Random texts over the characters the patterns care about, and the real books."""
    import random

    rng = random.Random(7)
    alphabet = ["a", "b", " ", " ", "\n", "\t", "\xa0", "\u3000", "\r", "\r\n", "\x0b", "\x0c",
                "\x85", "\u2028", "\u2029", "\u200b", "e\u0301", ".", "1"]
    texts = ["".join(rng.choices(alphabet, k=rng.randint(0, 12))) for _ in range(20_000)]
    texts += [path.read_text(encoding="utf-8") for path in BOOKS[:1]]
    for config in (NormalizeConfig(), RAW, NormalizeConfig(strip_gutenberg=False)):
        for text in texts:
            assert normalize_text(text, config) == _always_substituted(text, config), repr(text)
