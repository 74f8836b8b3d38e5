"""A text's words as arrays: where each lies and a 64-bit id per word, without a Python string
per word.

The quality rules and deduplication look at every word of every document; making a string and
a dictionary entry per word was most of their cost. Here one pass of numpy over the text's code
points finds the words and hashes them.

A word is a run of word characters (``\\w``: letters, digits, underscore) and of the combining
marks that scripts write inside words (Indic and Southeast Asian vowel signs, Arabic and Hebrew
points, combining accents), which ``\\w`` alone would split "हिन्दी" at; an apostrophe between
two such characters joins them ("don't"). Each Han character or kana is a word of its own,
since Chinese and Japanese are written without spaces.

A word's id is the sum, modulo 2**64, of a 64-bit mix (splitmix64's finaliser) of each
character's code point and position in the word. Equal words get equal ids in every process;
two different words share one with a chance of about 2**-64. The folded id, deduplication's,
is the same over each code point's one-to-one lower case (Python's ``str.lower`` where it gives
one character) with the typographic apostrophe (U+2019) read as ``'``.

``_words.c`` finds the words and both ids in one pass over the text's code points, from the
class and lower-case tables built here; ``setup.py`` compiles it where a C compiler is (the
package installs without one). The numpy code below is its reference, used where the kernel is
not built: ``tests/knowledge/test_words_kernel.py`` checks that both give the same arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

try:
    from transforms.knowledge import _words as _kernel
except ImportError:  # built without a C compiler: the numpy reference below
    _kernel = None

# Kana and Han: one word per character.
IDEOGRAPHS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
MARKS = ("\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670"
         "\u06d6-\u06ed\u0900-\u0dff\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff"
         "\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f")
APOSTROPHES = "'\u2019"

# Character classes, one bit each, looked up per code point.
_JOINED = 1  # word characters that join into runs: \w and marks, less ideographs
_IDEOGRAPH = 2
_APOSTROPHE = 4
_NOT_LETTER = 8  # word characters that are not letters or marks: digits and underscore
_CLASS_PATTERNS = ((f"(?:[^\\W{IDEOGRAPHS}]|[{MARKS}])+", _JOINED),
                   (f"[{IDEOGRAPHS}]+", _IDEOGRAPH),
                   (f"[{APOSTROPHES}]+", _APOSTROPHE),
                   (r"[\d_]+", _NOT_LETTER))
_PLANE = 0x10000

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_POSITION_SHIFT = np.uint64(21)  # code points need 21 bits; positions go above them


@functools.cache
def _classes(size: int) -> np.ndarray:
    """The class bits of code points below ``size``, from the patterns above (so they are the
    ``re`` module's own ``\\w`` and ``\\d``). Built per Unicode plane a text reaches: the
    whole range would cost a third of a second."""
    every = "".join(map(chr, range(size)))
    table = np.zeros(size, dtype=np.uint8)
    for pattern, bit in _CLASS_PATTERNS:
        for run in re.finditer(pattern, every):
            table[run.start():run.end()] |= bit
    return table


_LOWER_BLOCK = 256


@functools.cache
def _lower(size: int) -> np.ndarray:
    """Each code point below ``size`` mapped to its one-to-one lower case; U+2019 to '.

    A block of code points is lowered in one call where that keeps one character per code
    point (every block but the few holding a character such as U+0130, whose lower case is two
    characters, which are lowered one by one): the same table, a tenth of the time."""
    table = np.arange(size, dtype=np.uint32)
    for start in range(0, size, _LOWER_BLOCK):
        block = "".join(map(chr, range(start, min(start + _LOWER_BLOCK, size))))
        lowered = block.lower()
        if len(lowered) == len(block):
            table[start:start + len(block)] = np.frombuffer(
                lowered.encode("utf-32-le", "surrogatepass"), dtype="<u4")
            continue
        for point in range(start, start + len(block)):
            lower = chr(point).lower()
            if len(lower) == 1:
                table[point] = ord(lower)
    table[0x2019] = ord("'")
    return table


def _table_size(points: np.ndarray) -> int:
    """The end of the last Unicode plane that ``points`` reach."""
    return (int(points.max()) // _PLANE + 1) * _PLANE if len(points) else _PLANE


def mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place: every input bit affects every output bit."""
    values ^= values >> np.uint64(30)
    values *= _M1
    values ^= values >> np.uint64(27)
    values *= _M2
    values ^= values >> np.uint64(31)
    return values


@dataclasses.dataclass(frozen=True)
class Words:
    """The words of one text: ``starts`` and ``lengths`` in characters, ``ids`` per word."""

    points: np.ndarray  # uint32 code points of the word characters, word after word
    starts: np.ndarray
    lengths: np.ndarray
    not_letters: int  # digits and underscores: all inside words
    hashed: tuple[np.ndarray, np.ndarray] | None = None  # (ids, folded ids), from the kernel

    def __len__(self) -> int:
        return len(self.starts)

    @functools.cached_property
    def _offsets(self) -> np.ndarray:
        """Each word's first character in ``points``."""
        ends = np.cumsum(self.lengths)
        return ends - self.lengths

    @functools.cached_property
    def _positions(self) -> np.ndarray:
        """Each character's position in its word, in the bits above its code point."""
        position = (np.arange(len(self.points), dtype=np.int64)
                    - np.repeat(self._offsets, self.lengths)).astype(np.uint64)
        return position << _POSITION_SHIFT

    def _hash(self, points: np.ndarray) -> np.ndarray:
        if not len(points):
            return np.empty(0, dtype=np.uint64)
        mixed = points.astype(np.uint64)
        mixed |= self._positions
        return np.add.reduceat(mix(mixed), self._offsets)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """uint64 per word: equal words, equal ids."""
        return self._hash(self.points) if self.hashed is None else self.hashed[0]

    @functools.cached_property
    def folded_ids(self) -> np.ndarray:
        """uint64 per word: equal once lower-cased and with U+2019 read as '."""
        if self.hashed is not None:
            return self.hashed[1]
        return self._hash(_lower(_table_size(self.points))[self.points])

    def strings(self, text: str) -> list[str]:
        """The words as strings (for people and tests; the rules use the arrays)."""
        return [text[start:start + length]
                for start, length in zip(self.starts.tolist(), self.lengths.tolist(),
                                         strict=True)]


def find_words(text: str) -> Words:
    """The words of ``text`` (see the module docstring)."""
    if _kernel is None:
        return find_words_numpy(text)
    size = _kernel.plane_end(text)
    points, starts, lengths, not_letters, ids, folded = _kernel.find(
        text, _classes(size), _lower(size))
    return Words(points=np.frombuffer(points, dtype=np.uint32),
                 starts=np.frombuffer(starts, dtype=np.int64),
                 lengths=np.frombuffer(lengths, dtype=np.int64), not_letters=not_letters,
                 hashed=(np.frombuffer(ids, dtype=np.uint64),
                         np.frombuffer(folded, dtype=np.uint64)))


def find_words_numpy(text: str) -> Words:
    """``find_words`` in numpy: the kernel's reference, and the way without it."""
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    classes = _classes(_table_size(points))[points]
    joined = (classes & _JOINED).astype(bool)
    if len(points) > 2:  # an apostrophe between two joined characters joins them
        joined[1:-1] |= ((classes[1:-1] & _APOSTROPHE).astype(bool)
                         & joined[:-2] & joined[2:])
    ideograph = (classes & _IDEOGRAPH).astype(bool)
    after_joined = np.zeros_like(joined)
    after_joined[1:] = joined[:-1]
    before_joined = np.zeros_like(joined)
    before_joined[:-1] = joined[1:]
    starts = np.flatnonzero(ideograph | (joined & ~after_joined))
    ends = np.flatnonzero(ideograph | (joined & ~before_joined)) + 1
    return Words(points=points[joined | ideograph], starts=starts, lengths=ends - starts,
                 not_letters=int(np.count_nonzero(classes & _NOT_LETTER)))


def collapsed(text: str) -> tuple[bytes, int]:
    """``" ".join(text.split())`` as UTF-8 (lone surrogates passed through) and its length in
    characters: a paragraph's key for boilerplate (``dedup/units.py``), made without a string
    per whitespace-separated word where the kernel is built."""
    if _kernel is not None:
        return _kernel.collapsed(text)
    key = " ".join(text.split())
    return key.encode("utf-8", "surrogatepass"), len(key)


def split_words(text: str) -> list[str]:
    """The words of ``text`` as strings.

    >>> split_words("Don't stop: 床前明月光, 좋은 아침!")
    ["Don't", 'stop', '床', '前', '明', '月', '光', '좋은', '아침']
    """
    return find_words(text).strings(text)
