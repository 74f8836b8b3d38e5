"""A document's boilerplate *units*, hashed: its paragraphs (and optionally the lines of its
paragraphs) long enough to tell boilerplate from a common phrase (``paragraphs`` finds and
removes the units many documents share). Pure text functions without Beam, so that helper
processes that key documents (``text_keys``) import only these, numpy and the words kernel."""

from __future__ import annotations

import hashlib
import re

from transforms.knowledge.dedup.config import BoilerplateConfig
from transforms.knowledge.words import collapsed

# A blank line (spaces allowed) and any more after it: what separates two paragraphs.
_BREAK = re.compile(r"(\n[^\S\n]*\n\s*)")


def unit_hash(text: str, min_chars: int) -> int | None:
    """A 64-bit hash of a paragraph or line with its spacing collapsed; None when shorter than
    ``min_chars``: too short to tell boilerplate from a common phrase."""
    if len(text) < min_chars:  # collapsing spaces never lengthens a text
        return None
    key, length = collapsed(text)
    if length < min_chars:
        return None
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def split_paragraphs(text: str) -> tuple[list[str], list[str]]:
    """The paragraphs of a text and the breaks between them (one fewer), so that joining them
    alternately gives the text back."""
    parts = _BREAK.split(text)
    return parts[0::2], parts[1::2]


def unit_hashes(text: str, config: BoilerplateConfig) -> set[int]:
    """The hashes of a document's units: its long paragraphs and, with ``lines``, the long
    lines of its paragraphs of several lines."""
    found = set()
    for paragraph in split_paragraphs(text)[0]:
        found.add(unit_hash(paragraph, config.min_chars))
        if config.lines and "\n" in paragraph:
            found.update(unit_hash(line, config.min_chars) for line in paragraph.split("\n"))
    found.discard(None)
    return found
