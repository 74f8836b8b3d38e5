"""Cost of each knowledge curation step beside the tokenizer's, on the same documents.

The bench corpus's knowledge documents (``bench.corpus.base_documents``: C4, Wikipedia,
Gutenberg, Shakespeare and WikiText pages of ``../shared/data/pretrain``) go through each step
alone, as the branch calls it, timed as the best of ``--repeats`` runs in one process. The
reference is the pipeline's own encoder for the offline default tokenizer over the same texts:
the knowledge branch keeps up with the tokenizer only while the steps it runs on the main
thread (everything but ``Tokenize``, which runs on a background thread) cost less than it.

    .venv/bin/python -m bench.bench_curation [--repeats 3] [--numpy]

``--numpy`` runs the word and n-gram code on its numpy reference instead of the C kernel
(``transforms/knowledge/_words.c``), to measure what the kernel saves. Quality verdicts are
judged afresh in every repeat: the branch's memory of verdicts by text hash is cleared.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

from bench.corpus import base_documents
from transforms.core.records import Record
from transforms.core.tokenizer import DEFAULT_TOKENIZER
from transforms.curation.language import DEFAULT_SAMPLE_CHARS, identify
from transforms.curation.pii import PiiConfig, redact
from transforms.knowledge import quality as quality_rules
from transforms.knowledge import words
from transforms.knowledge.dedup.config import BoilerplateConfig, DedupConfig
from transforms.knowledge.dedup.text_keys import KeyTexts
from transforms.knowledge.dedup.units import unit_hashes
from transforms.knowledge.document_records import documents_table
from transforms.knowledge.encoding import raw_text_encoder
from transforms.knowledge.normalize import NormalizeConfig, normalize_text
from transforms.knowledge.quality import QualityConfig, TextStats, judge


def best_of(repeats: int, work: Callable[[], object]) -> float:
    """The fastest of ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def steps(texts: Sequence[str]) -> dict[str, tuple[Callable[[], object], str]]:
    """Each step over every text, as the branch calls it, and when it runs."""
    pii, quality, boilerplate = PiiConfig(), QualityConfig(), BoilerplateConfig()
    normalize = NormalizeConfig()
    encoder = raw_text_encoder(DEFAULT_TOKENIZER)
    arrays = encoder.encode(list(texts))
    records = [Record("bench", i, 0, text) for i, text in enumerate(texts)]
    keys = KeyTexts(quality, DedupConfig(), boilerplate)
    return {
        "tokenize (reference)": (lambda: encoder.encode(list(texts)), "background thread"),
        "normalize": (lambda: [normalize_text(t, normalize) for t in texts], "default on"),
        "personal data (redact)": (lambda: [redact(t, pii) for t in texts], "default on"),
        "language id (fastText lid.176)": (
            lambda: [identify(t, DEFAULT_SAMPLE_CHARS) for t in texts], "default on"),
        "language id, whole documents": (lambda: [identify(t) for t in texts],
                                         "--language_sample_chars=0"),
        "quality rules": (lambda: [judge(TextStats(t), quality) for t in texts],
                          "default on"),
        "boilerplate keys": (lambda: [unit_hashes(t, boilerplate) for t in texts],
                             "default on, first pass"),
        "first-pass keys (rules, MinHash, boilerplate)": (
            lambda: (quality_rules._VERDICTS.clear(), keys(texts)), "default on, helpers"),
        "document records": (lambda: documents_table(records, arrays, 0),
                             "--write_documents only"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--numpy", action="store_true",
                        help="words and n-gram counts in numpy, without the C kernel")
    args = parser.parse_args(argv)
    if args.numpy:
        words._kernel = None
    texts = base_documents()
    chars = sum(map(len, texts))
    measured = {name: (best_of(args.repeats, work), when)
                for name, (work, when) in steps(texts).items()}
    reference = measured["tokenize (reference)"][0]
    print(f"{len(texts):,} documents, {chars / 1e6:.1f} M characters, best of {args.repeats}\n")
    print("| step | runs | s | M chars/s | x the tokenizer's time |")
    print("|---|---|---:|---:|---:|")
    for name, (seconds, when) in measured.items():
        print(f"| {name} | {when} | {seconds:.2f} | {chars / seconds / 1e6:.2f} | "
              f"{seconds / reference:.2f} |")
    on_main = [s for name, (s, when) in measured.items() if when == "default on"]
    print(f"\nDefault steps on the main thread together: {np.sum(on_main) / reference:.2f}x "
          "the tokenizer's time (under 1 keeps the branch at the tokenizer's pace).")


if __name__ == "__main__":
    main()
