"""The knowledge branch's command-line options and the configuration they fill."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from transforms.core.option_types import (
    boolean,
    fraction,
    non_negative_float,
    non_negative_int,
    parsed_by,
    positive_int,
)
from transforms.core.vocabulary import (
    BOILERPLATE_TOO_SHORT,
    DUPLICATE_EARLIER_RUN,
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
    EMPTY_AFTER_NORMALIZATION,
)
from transforms.curation.urls import parse_paths
from transforms.knowledge.dedup.config import MODES, BoilerplateConfig, DedupConfig
from transforms.knowledge.dedup.index import check_earlier_index
from transforms.knowledge.normalize import NormalizeConfig
from transforms.knowledge.quality import QualityConfig, format_ngram_limits, parse_ngram_limits

GROUP = "knowledge branch"
ngram_limits = parsed_by(parse_ngram_limits)

_QUALITY = QualityConfig()
_DEDUP = DedupConfig()
_BOILERPLATE = BoilerplateConfig()
# (QualityConfig field, argparse type, help): each becomes --FIELD=VALUE.
_QUALITY_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("min_words", non_negative_int, "Fewest words a document may have (too_few_words). A word "
     "is a run of letters, marks and digits; each Han or kana character counts as one."),
    ("max_words", non_negative_int, "Most words a document may have (too_many_words); 0: no "
     "limit."),
    ("min_mean_word_length", non_negative_float, "Shortest mean word length, in characters "
     "(mean_word_length). Skipped for documents of under 10 words or written mostly in Han, "
     "kana, Hangul or scripts without spaces."),
    ("max_mean_word_length", non_negative_float, "Longest mean word length (mean_word_length); "
     "0: no limit."),
    ("max_symbol_word_ratio", non_negative_float, "Most '#' signs and ellipses per word "
     "(symbol_ratio); 0: no limit."),
    ("max_ellipsis_lines", fraction, "Largest share of lines that end in an ellipsis "
     "(ellipsis_lines; documents of 3 lines or more); 0: no limit."),
    ("max_bullet_lines", fraction, "Largest share of lines that start with a bullet "
     "(bullet_lines; documents of 3 lines or more); 0: no limit."),
    ("min_alpha_fraction", fraction, "Smallest share of letters among the non-space "
     "characters (low_alpha_fraction)."),
    ("max_duplicate_lines", fraction, "Largest share of lines that repeat an earlier line "
     "(duplicate_lines); 0: no limit."),
    ("max_duplicate_line_chars", fraction, "Largest share of characters in repeated lines "
     "(duplicate_lines); 0: no limit."),
    ("max_duplicate_paragraphs", fraction, "Largest share of paragraphs that repeat an earlier "
     "one (duplicate_paragraphs); 0: no limit."),
    ("max_duplicate_paragraph_chars", fraction, "Largest share of characters in repeated "
     "paragraphs (duplicate_paragraphs); 0: no limit."),
    ("max_top_ngram", ngram_limits, "n:share,...: for each n, the largest share of word "
     "characters that the most frequent word n-gram (if seen 3 times or more) may cover "
     "(repeated_top_ngram); empty: off."),
    ("max_duplicate_ngrams", ngram_limits, "n:share,...: for each n, the largest share of word "
     "characters inside n-grams that occurred before (duplicate_ngrams); empty: off."),
)


def _shown(value: Any) -> str:
    """A default as it is typed on the command line."""
    return format_ngram_limits(value) if isinstance(value, tuple) else str(value)


class KnowledgeOptions(PipelineOptions):
    """Options of the knowledge branch."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(GROUP)
        group.add_argument(
            "--block_size", type=positive_int, default=2048,
            help="Tokens per pretraining block (default 2048).")
        group.add_argument(
            "--remainder", choices=("drop", "pad"), default="drop",
            help="The tokens left after the last full block (at most one block's worth per "
            "group of chunks): drop them (default) or pad the block; the manifest reports the "
            "cost either way.")
        group.add_argument(
            "--write_documents", type=boolean, default=False,
            help="Also write documents/: one row per kept document with its id, source, "
            "position, url, the exact text tokenized, its ids, language and the measures the "
            "curation steps took (default false). A valid --input for --tokenize_only.")
        group.add_argument(
            "--tokenize_only", type=boolean, default=False,
            help="Tokenize knowledge documents as they are read: no normalisation, URL "
            "blocklist, personal-data redaction, language identification, quality rules, "
            "deduplication or decontamination (default false). For re-tokenizing the "
            "documents/ of an earlier run with another tokenizer.")
        group.add_argument(
            "--normalize", type=boolean, default=True,
            help="Normalise documents before anything else (default true): Unicode NFC, "
            "control and zero-width characters and byte-order marks removed, every line break "
            "as LF, plus the two options below. A document left empty is filtered as "
            f"{EMPTY_AFTER_NORMALIZATION}.")
        group.add_argument(
            "--collapse_whitespace", type=boolean, default=True,
            help="With --normalize: one space between words, at most one blank line between "
            "paragraphs, no trailing spaces; indentation is kept (default true; set false for "
            "code or other text whose spacing matters).")
        group.add_argument(
            "--strip_gutenberg", type=boolean, default=True,
            help="With --normalize: cut the Project Gutenberg licence header and footer from "
            "documents that carry their markers (default true).")
        group.add_argument(
            "--quality_filter", type=boolean, default=True,
            help="Drop documents that fail a Gopher/C4-style quality rule (default true); each "
            "rule is set by its own option below and drops with its own reason code.")
        for name, kind, text in _QUALITY_OPTIONS:
            default = _shown(getattr(_QUALITY, name))  # argparse parses a str default with kind
            group.add_argument(f"--{name}", type=kind, default=default,
                               help=f"{text} Default {default}.")
        group.add_argument(
            "--dedup", choices=MODES, default=_DEDUP.mode,
            help="Deduplicate across the whole dataset: 'near' drops exact copies "
            f"({DUPLICATE_EXACT}) and near copies found with MinHash and LSH "
            f"({DUPLICATE_NEAR}), 'exact' only exact copies of the normalised text, "
            "'none' nothing. The copy with the smallest (input, source, position) survives. "
            f"Default {_DEDUP.mode}.")
        group.add_argument(
            "--dedup_ngram", type=positive_int, default=_DEDUP.ngram,
            help=f"Words per MinHash shingle (default {_DEDUP.ngram}).")
        group.add_argument(
            "--dedup_num_perm", type=positive_int, default=_DEDUP.num_perm,
            help=f"MinHash values per document (default {_DEDUP.num_perm}).")
        group.add_argument(
            "--dedup_bands", type=positive_int, default=_DEDUP.bands,
            help="LSH bands; --dedup_num_perm must be a multiple. More bands find more "
            f"candidate pairs at lower similarity (default {_DEDUP.bands}).")
        group.add_argument(
            "--dedup_threshold", type=fraction, default=_DEDUP.threshold,
            help="Estimated Jaccard similarity of the shingle sets at or above which a "
            f"candidate pair is a near copy (default {_DEDUP.threshold}).")
        group.add_argument(
            "--dedup_rounds", type=positive_int, default=_DEDUP.rounds,
            help="Rounds of label propagation that join near copies into clusters: a chain of "
            "k copies, each similar only to the next, needs k + 1; a run whose last round "
            f"still changes a label stops and says so (default {_DEDUP.rounds}).")
        group.add_argument(
            "--write_dedup_index", type=boolean, default=False,
            help="Also write OUTPUT/dedup_index/: each published document's id, text hash and "
            "MinHash keys (no text), for a later run's --dedup_against (default false).")
        group.add_argument(
            "--dedup_against", type=parsed_by(parse_paths),
            help="Comma-separated dedup_index folders of earlier runs (local or gs://): a "
            "document that is an exact or near copy of one they published is filtered as "
            f"{DUPLICATE_EARLIER_RUN}, the earlier one always winning (default none).")
        group.add_argument(
            "--boilerplate", type=boolean, default=True,
            help="Remove boilerplate shared across documents (cookie notices, navigation, "
            "licence footers): a paragraph of --boilerplate_min_chars or more that "
            "--boilerplate_min_documents or more documents hold stays in the first of them, "
            "by (input, source, position), and is removed from the others; a document left "
            f"with fewer than --min_words words is filtered as {BOILERPLATE_TOO_SHORT} "
            "(default true).")
        group.add_argument(
            "--boilerplate_min_chars", type=positive_int, default=_BOILERPLATE.min_chars,
            help="Shortest paragraph (or line), in characters with its spacing collapsed, "
            "that counts as boilerplate: shorter ones are common phrases and headings "
            f"(default {_BOILERPLATE.min_chars}).")
        group.add_argument(
            "--boilerplate_min_documents", type=positive_int,
            default=_BOILERPLATE.min_documents,
            help="Fewest documents that must hold a paragraph for it to be boilerplate; at "
            f"least 2 (default {_BOILERPLATE.min_documents}).")
        group.add_argument(
            "--boilerplate_lines", type=boolean, default=_BOILERPLATE.lines,
            help="Also remove single long lines that many documents share inside paragraphs "
            f"of several lines (default {str(_BOILERPLATE.lines).lower()}).")


@dataclasses.dataclass(frozen=True)
class KnowledgeConfig:
    """The branch's settings; ``normalize``, ``quality`` or ``boilerplate`` None turns that
    step off."""

    block_size: int
    remainder: str
    normalize: NormalizeConfig | None = dataclasses.field(default_factory=NormalizeConfig)
    quality: QualityConfig | None = dataclasses.field(default_factory=QualityConfig)
    dedup: DedupConfig = dataclasses.field(default_factory=DedupConfig)
    boilerplate: BoilerplateConfig | None = dataclasses.field(default_factory=BoilerplateConfig)
    write_documents: bool = False
    tokenize_only: bool = False  # no step before tokenization (see --tokenize_only)
    dedup_index: bool = False  # --write_dedup_index
    dedup_against: tuple[str, ...] = ()  # earlier runs' dedup_index folders

    @property
    def first_pass(self) -> bool:
        """Whether the branch reads its inputs twice: deduplication and boilerplate removal
        need the whole dataset before they can drop or remove anything."""
        return self.dedup.active or self.boilerplate is not None

    @classmethod
    def from_options(cls, options: PipelineOptions) -> KnowledgeConfig:
        view = options.view_as(KnowledgeOptions)
        curates = not view.tokenize_only
        return cls(
            block_size=view.block_size,
            remainder=view.remainder,
            normalize=NormalizeConfig(view.collapse_whitespace, view.strip_gutenberg)
            if view.normalize and curates else None,
            quality=QualityConfig(**{name: getattr(view, name) for name, _, _ in
                                     _QUALITY_OPTIONS}) if view.quality_filter and curates
            else None,
            dedup=DedupConfig(view.dedup if curates else "none", view.dedup_ngram,
                              view.dedup_num_perm, view.dedup_bands, view.dedup_threshold,
                              view.dedup_rounds),
            boilerplate=BoilerplateConfig(view.boilerplate_min_chars,
                                          view.boilerplate_min_documents, view.boilerplate_lines)
            if view.boilerplate and curates else None,
            write_documents=view.write_documents,
            tokenize_only=view.tokenize_only,
            dedup_index=view.write_dedup_index,
            dedup_against=tuple(view.dedup_against or ()),
        )

    def __post_init__(self) -> None:
        for path in self.dedup_against:
            check_earlier_index(path, self.dedup)
