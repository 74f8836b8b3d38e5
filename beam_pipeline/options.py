"""Command-line options: the pipeline's general ones, validated before any work starts,
``OPTION_GROUPS``, the one list of option groups, and the argument parser built from it.

Each part of the graph declares its options beside the configuration they fill
(``transforms/knowledge/options.py``, ``transforms/instruction/options.py``,
``transforms/curation/options.py``). The argument parser (``--help``), the Flex Template
metadata (``scripts/gen_flex_metadata.py``) and the options reference read ``OPTION_GROUPS``, so
a new group is one class added there. Beam's options are parsed beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import shlex
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline import beam_internals
from transforms.core.option_types import boolean, fraction, non_negative_int, positive_int
from transforms.core.records import InputSpec
from transforms.core.tokenizer import DEFAULT_TOKENIZER
from transforms.core.vocabulary import KNOWLEDGE
from transforms.curation import options as curation_options
from transforms.curation.options import (
    CurationConfig,
    CurationOptions,
    LanguageOptions,
    PersonalDataOptions,
    ScoreOptions,
    UrlOptions,
)
from transforms.instruction import options as instruction_options
from transforms.instruction.options import InstructionConfig, InstructionOptions
from transforms.io.formats import PARQUET, parse_formats
from transforms.io.input_specs import parse_input_spec, split_input_values
from transforms.knowledge import options as knowledge_options
from transforms.knowledge.options import KnowledgeConfig, KnowledgeOptions

DESCRIPTION = """\
Turn raw text and instruction data into training-ready, sharded Parquet.

Every input record is classified into the knowledge branch (tokenized and concatenated into
fixed-length pretraining blocks), the instruction branch (chat template, assistant-only loss
mask, packed sequences) or rejected/ with a reason code. OUTPUT gets pretrain/, sft/,
rejected/ and manifest.json, which accounts for every input record.
"""

PREP_GROUP = "data preparation"

INPUT_HELP = """\
Input files: a local path, a glob or a gs:// URI; repeat the option or give a
comma-separated list. Formats come from the extension (.jsonl .json .parquet .txt
.csv .tsv, optionally .gz or .zst). Append '#key=value;key=value' to declare
what the detector should not guess: branch=knowledge|instruction,
format=jsonl|json|parquet|text|csv, text_unit=file|line|paragraph (how a text
file splits into documents; default file), name=SOURCE, weight=W (the source's
relative share of its branch's tokens), phase=NAME (curriculum phase: written to
OUTPUT/NAME/), license=ID (e.g. cc-by-4.0, for the dataset card), and field
mappings CANONICAL=FIELD (e.g. 'gsm8k.jsonl#branch=instruction;prompt=question;response=answer')."""


class PrepOptions(PipelineOptions):
    """The pipeline's own options; Beam's (runner, project, ...) are parsed beside them."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(PREP_GROUP)
        group.add_argument("--input", action="append", help=INPUT_HELP)
        group.add_argument(
            "--output", help="Output directory, local or gs://. Gets pretrain/, sft/, rejected/ "
            "and manifest.json (written last: its presence marks a complete run).")
        group.add_argument(
            "--tokenizer", default=DEFAULT_TOKENIZER,
            help="Tokenizer: a local directory, a gs:// directory (copied once per worker), a "
            f"Hugging Face hub id, or '{DEFAULT_TOKENIZER}' (default: a Qwen2-compatible "
            "tokenizer built offline and cached on disk).")
        group.add_argument(
            "--num_shards", type=non_negative_int, default=0,
            help="Parquet files per output branch; 0 (default) picks the count from "
            "--target_shard_mb.")
        group.add_argument(
            "--target_shard_mb", type=positive_int, default=256,
            help="Target size of one output file when --num_shards is 0 (default 256).")
        group.add_argument(
            "--output_format", default=PARQUET,
            help="Formats to write, comma-separated: parquet (always written; the manifest, "
            "report and card describe it), megatron (pretraining as Megatron's indexed dataset "
            "of documents, .bin/.idx per shard; SFT as NeMo's packed-sequence .npy), mds "
            "(MosaicML Streaming shards with index.json), litdata (LitData's optimized "
            "format). Each goes to OUTPUT/FORMAT/KIND/, cut into files like the Parquet "
            "output (--num_shards, --target_shard_mb). Default parquet.")
        group.add_argument(
            "--row_group_rows", type=positive_int, default=1024,
            help="Rows per Parquet row group, the unit a streaming reader loads (default 1024).")
        group.add_argument(
            "--chunk_records", type=positive_int, default=4096,
            help="Records per processing chunk: the bounded, deterministic group within which "
            "documents are concatenated and examples packed (default 4096).")
        group.add_argument(
            "--max_record_mb", type=positive_int, default=16,
            help="Records larger than this are rejected as record_too_large; it also bounds a "
            "whole .json document, which is parsed at once (default 16).")
        group.add_argument(
            "--max_reject_fraction", type=fraction, default=0.5,
            help="Fail the run (no manifest.json) when more than this fraction of one input's "
            "records is rejected: a sign of a wrong format, mapping or branch (default 0.5).")
        group.add_argument(
            "--strict", type=boolean, default=False,
            help="Fail the run (no manifest.json) when it has warnings: an empty input, or an "
            "instruction input whose examples mostly train on a one- or two-token reply or "
            "train on under 3%% of their tokens, signs of a response mapped onto the wrong "
            "field (default false: the warnings are printed and kept in the manifest).")
        group.add_argument(
            "--overwrite", type=boolean, default=False,
            help="Replace the outputs of an earlier run in --output (default false: refuse).")
        group.add_argument(
            "--write_filtered", type=boolean, default=False,
            help="Also write the records dropped by policy (quality, duplicates, too_long, "
            "decontamination, mixing) to filtered/ with their reason (default false: only "
            "counted in the manifest).")


@dataclasses.dataclass(frozen=True)
class PrepConfig:
    """The validated configuration that the graph is built from and the manifest records."""

    inputs: tuple[InputSpec, ...]
    output: str
    tokenizer: str
    knowledge: KnowledgeConfig
    instruction: InstructionConfig
    curation: CurationConfig
    output_format: tuple[str, ...]
    num_shards: int
    target_shard_mb: int
    row_group_rows: int
    chunk_records: int
    max_record_mb: int
    max_reject_fraction: float
    strict: bool
    overwrite: bool
    write_filtered: bool

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_from_options(options: PipelineOptions) -> PrepConfig:
    """Validates the pipeline's options; raises ValueError with a message a user can act on."""
    prep = options.view_as(PrepOptions)
    if not prep.input:
        raise ValueError("--input is required (a path, glob or gs:// URI; repeat for more)")
    if not prep.output:
        raise ValueError("--output is required (a local directory or gs:// URI)")
    values = split_input_values(prep.input)
    if not values:
        raise ValueError("--input names no files")
    curation = CurationConfig.from_options(options)
    formats = parse_formats(prep.output_format)
    knowledge = KnowledgeConfig.from_options(options)
    if knowledge.tokenize_only and (curation.language.filters or curation.urls.active):
        raise ValueError("--tokenize_only skips every step before tokenization: drop "
                         "--languages and --url_blocklist, or curate in this run")
    instruction = InstructionConfig.from_options(options)
    if ((knowledge.dedup_index or knowledge.dedup_against) and not knowledge.dedup.active
            and instruction.dedup == "none"):
        raise ValueError("--write_dedup_index and --dedup_against need deduplication on: "
                         "--dedup=exact or near (and no --tokenize_only), or --instruction_dedup")
    if knowledge.tokenize_only and curation.scores.for_branch(KNOWLEDGE).models:
        raise ValueError("--tokenize_only skips every step before tokenization, scores too: "
                         "give the knowledge branch's --quality_model in the curating run")
    if curation.partitions and formats != (PARQUET,):
        raise ValueError("--partition_by_language writes Parquet only: drop --output_format, or "
                         "run once per language with --languages=XX for another format")
    return PrepConfig(
        inputs=tuple(parse_input_spec(i, value) for i, value in enumerate(values)),
        output=prep.output.rstrip("/"),
        tokenizer=prep.tokenizer,
        knowledge=knowledge,
        instruction=instruction,
        curation=curation,
        output_format=formats,
        num_shards=prep.num_shards,
        target_shard_mb=prep.target_shard_mb,
        row_group_rows=prep.row_group_rows,
        chunk_records=prep.chunk_records,
        max_record_mb=prep.max_record_mb,
        max_reject_fraction=prep.max_reject_fraction,
        strict=prep.strict,
        overwrite=prep.overwrite,
        write_filtered=prep.write_filtered,
    )


# Every option group, in the order --help lists them: (title, the class that declares it).
OPTION_GROUPS: tuple[tuple[str, type[PipelineOptions]], ...] = (
    (PREP_GROUP, PrepOptions),
    (knowledge_options.GROUP, KnowledgeOptions),
    (instruction_options.GROUP, InstructionOptions),
    (curation_options.GROUP, CurationOptions),
    (curation_options.PII_GROUP, PersonalDataOptions),
    (curation_options.URL_GROUP, UrlOptions),
    (curation_options.LANGUAGE_GROUP, LanguageOptions),
    (curation_options.SCORE_GROUP, ScoreOptions),
)
OWN_OPTIONS = tuple(options for _, options in OPTION_GROUPS)
OWN_GROUPS = tuple(title for title, _ in OPTION_GROUPS)
CONSOLE_GROUP = "terminal output (local runs)"


def argument_parser() -> argparse.ArgumentParser:
    """Our options first, then every Beam option, so --help documents them all."""
    parser = beam_internals.argument_parser(
        prog="python -m beam_pipeline", description=DESCRIPTION, allow_abbrev=False,
        usage="%(prog)s --input PATTERN [--input PATTERN ...] --output DIR [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    beam_internals.set_default_group_title(
        parser, "Beam options (runner, Dataflow, worker environment, ...)")
    for cls in OWN_OPTIONS:
        cls._add_argparse_args(parser)
    console = parser.add_argument_group(CONSOLE_GROUP)
    console.add_argument("--quiet", action="store_true",
                         help="Print no progress while a local run works (the summary still "
                              "comes at the end).")
    console.add_argument("--verbose", action="store_true",
                         help="On failure, print the full traceback and Beam's own log lines "
                              "as well as the one-line error.")
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        if cls not in OWN_OPTIONS:
            cls._add_argparse_args(parser)
    # List our groups first in --help, ahead of Beam's many options.
    beam_internals.order_groups(
        parser, lambda group: group.title not in (*OWN_GROUPS, CONSOLE_GROUP))
    return parser


def check_command_line(argv: Sequence[str]) -> None:
    """Parses ``argv`` as --help shows it: --help, bad values and unknown options stop here (exit
    2), and an unknown option is answered with the closest known one (``--block-size`` ->
    ``--block_size``)."""
    parser = argument_parser()
    _, unknown = parser.parse_known_args(argv)
    options = [arg.split("=", 1)[0] for arg in unknown if arg.startswith("--")]
    if not options:
        parser.parse_args(argv)  # stray values: argparse's own message
        return
    known = [name for name in parser._option_string_actions if name.startswith("--")]
    advice = []
    for option in options:
        spelled = "--" + option[2:].replace("-", "_")
        close = [spelled] if spelled in known else difflib.get_close_matches(option, known, 1)
        advice.append(f"{option} (did you mean {close[0]}?)" if close else option)
    parser.error(f"unknown option(s): {', '.join(advice)}")


def launch_command(argv: Sequence[str]) -> str:
    """The command that runs ``argv``, with the interpreter that is running now: a bare
    ``python`` would fail outside the virtual environment the pipeline is installed in."""
    return shlex.join([sys.executable, "-m", "beam_pipeline", *argv])
