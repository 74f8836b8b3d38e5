"""Text normalisation for the knowledge branch: one canonical form per document.

Quality rules, exact-duplicate hashes and MinHash shingles all read the normalised text, so two
copies of a page that differ only in line endings, a byte-order mark, invisible characters or
runs of spaces count as the same document. Pure functions over ``str``: compiled regexes and
``str.translate`` tables, so a 3 MB book takes milliseconds.

>>> normalize_text("\\ufeffCafe\\u0301  au\\u200b lait\\r\\n\\r\\n\\r\\n\\r\\nNext\\t \\n")
'Café au lait\\n\\nNext'
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata

# C0 and C1 control characters go, except the tab and the line breaks handled below; so do
# invisible characters that only split words for search engines and copy-paste (zero-width
# space, word joiner, byte-order mark, soft hyphen). The zero-width (non-)joiners U+200C/U+200D
# stay: Persian and Indic spelling and emoji sequences need them. (A character-class regex is
# many times faster than ``str.translate`` on non-ASCII text.) Lone surrogates, which JSON
# escapes can produce, go too: no encoder accepts them.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\xad\u200b\u2060\ufeff\ud800-\udfff]")
# CRLF, CR, next line, line and paragraph separators become LF; so do vertical tab and form
# feed (page breaks in old plain-text files).
_LINE_BREAK = re.compile("\r\n?|[\x0b\x0c\x85\u2028\u2029]")
# A plain character class is scanned several times faster than the alternation above: most
# documents have no line break to change, and then the substitution is skipped.
_LINE_BREAK_CHAR = re.compile("[\r\x0b\x0c\x85\u2028\u2029]")
# Horizontal whitespace other than a single space: every Unicode space separator (no-break,
# ideographic, ...) and tabs. Runs start with one of these or with two characters of it.
_HSPACE = "\t\xa0\u1680\u2000-\u200a\u202f\u205f\u3000"
_SPACE_RUN = re.compile(f"(?:[{_HSPACE}]| (?=[ {_HSPACE}\n])| \\Z)[ {_HSPACE}]*")
# A run above starts with one of these characters, or with "  ", " \n" or a final space; text
# with none of them (most normalised text) has no run, which this class finds out quickly.
_HSPACE_CHAR = re.compile(f"[{_HSPACE}]")
_BLANK_LINES = re.compile("\n\n\n+")
# Every character the three classes above look for, in one class: most text has none, and one
# scan then tells that instead of three.
_SPECIAL_CHAR = re.compile(
    f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u200b\u2060\ufeff\ud800-\udfff\r"
    f"\u2028\u2029{_HSPACE}]")

# Project Gutenberg wraps every e-book in a licence header and footer. The markers have changed
# over the years ("*** START OF THIS/THE PROJECT GUTENBERG EBOOK ...", "*END*THE SMALL PRINT");
# the footer begins with "End of (the) Project Gutenberg ..." shortly before the END marker.
# Each pattern starts with a literal, so the regex engine skips ahead quickly on a whole book.
_GUTENBERG_START = re.compile(
    r"\*\*\* ?(?i:start of (?:this|the) project gutenberg e-?book)[^\n]*(?:\n|\Z)"
    r"|\*END\*THE SMALL PRINT[^\n]*(?:\n|\Z)")
_GUTENBERG_END = re.compile(r"\*\*\* ?(?i:end of (?:this|the) project gutenberg e-?book)")
_GUTENBERG_FOOTER = re.compile(r"(?i:end of (?:the |this )?project gutenberg)")
_FOOTER_WINDOW = 1000  # characters before the END marker searched for the footer line
# Transcriber credits right after the START marker ("Produced by ...", up to a blank line).
_GUTENBERG_CREDITS = re.compile(r"\s*(?:Produced by|E-text prepared by)[^\n]*(?:\n[^\n]+)*")


@dataclasses.dataclass(frozen=True)
class NormalizeConfig:
    """What ``normalize_text`` does beyond the always-on steps (NFC, controls, line breaks)."""

    collapse_whitespace: bool = True
    strip_gutenberg: bool = True


def normalize_text(text: str, config: NormalizeConfig = NormalizeConfig()) -> str:
    """The canonical form of a document (see the module docstring for the steps).

    Always: CRLF and other line breaks to LF, control and zero-width characters (and every
    byte-order mark) removed, Unicode NFC. With ``collapse_whitespace``: trailing spaces cut,
    runs of spaces and tabs inside a line (not its indentation) collapsed to one space, three or
    more line breaks to one blank line, and the document stripped. With ``strip_gutenberg``:
    the Project Gutenberg licence header and footer cut where their markers are present.
    """
    special = _SPECIAL_CHAR.search(text) is not None
    if special:
        text = _INVISIBLE.sub("", text)
        if _LINE_BREAK_CHAR.search(text):
            text = _LINE_BREAK.sub("\n", text)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    if config.strip_gutenberg:
        text = strip_gutenberg(text)
    if config.collapse_whitespace:
        # NFC makes horizontal spaces only of others (U+2000, U+2001), so none if none before.
        text = collapse_whitespace(text, hspace=special)
    return text


def collapse_whitespace(text: str, hspace: bool = True) -> str:
    """One space between words, at most one blank line between paragraphs; indentation stays.

    ``hspace=False`` says the text has no tab or other horizontal space than U+0020, so it is
    not searched for one.

    >>> collapse_whitespace("  a \\u00a0 b\\t\\n\\n\\n\\n    c  \\n")
    'a b\\n\\n    c'
    """

    def replace(run: re.Match) -> str:
        start, end = run.span()
        if end == len(text) or text[end] == "\n":
            return ""  # trailing
        if start == 0 or text[start - 1] == "\n":
            return run.group()  # indentation
        return " "

    if ("  " in text or " \n" in text or text.endswith(" ")
            or (hspace and _HSPACE_CHAR.search(text))):
        text = _SPACE_RUN.sub(replace, text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg e-book, without the licence header and footer.

    Text without the START marker is returned unchanged (a paragraph or line of a book, or any
    other document), so this is safe to run on every document.

    >>> strip_gutenberg("Licence\\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\\n"
    ...                 "Produced by A\\n\\nText.\\nEnd of the Project Gutenberg EBook of X\\n"
    ...                 "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\\nLicence")
    '\\n\\nText.\\n'
    """
    start = _GUTENBERG_START.search(text)
    if start is None:
        return text
    body = text[start.end():]
    end = _GUTENBERG_END.search(body)
    if end is not None:
        footer = _GUTENBERG_FOOTER.search(body, max(0, end.start() - _FOOTER_WINDOW), end.start())
        body = body[:footer.start() if footer else end.start()]
    credits = _GUTENBERG_CREDITS.match(body)
    return body[credits.end():] if credits else body
