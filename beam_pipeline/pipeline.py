"""Graph assembly and the local entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    _BeamArgumentParser,
)

from beam_pipeline.options import DESCRIPTION, PrepConfig, PrepOptions, config_from_options
from transforms.chat_template import MaskOptions
from transforms.classify import ClassifyRecords
from transforms.instruction import InstructionBranch
from transforms.knowledge import KnowledgeBranch
from transforms.manifest import read_manifest, sum_counters, summary_lines
from transforms.read_inputs import ReadInputs
from transforms.readers import plan_shards
from transforms.records import INSTRUCTION, KNOWLEDGE, ShardSpec
from transforms.steps import PARTS, STATS
from transforms.tokenizer import load_tokenizer, tokenizer_identity
from transforms.writers import WriteOutputs, prepare_output_dir

LOG = logging.getLogger("beam_pipeline")
MIB = 1024 * 1024
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def build_graph(p: beam.Pipeline, cfg: PrepConfig, shards: Sequence[ShardSpec],
                tokenizer: dict) -> None:
    """Read -> classify -> the two branches -> sharded files and manifest.json."""
    chunks = p | "ReadInputs" >> ReadInputs(shards, cfg.chunk_records, cfg.max_record_mb * MIB)
    routed = chunks | "ClassifyRecords" >> ClassifyRecords(cfg.inputs)
    knowledge_parts, knowledge_stats = routed[KNOWLEDGE] | "KnowledgeBranch" >> KnowledgeBranch(
        cfg.tokenizer, cfg.block_size, cfg.remainder)
    instruction_parts, instruction_stats = (
        routed[INSTRUCTION] | "InstructionBranch" >> InstructionBranch(
            cfg.tokenizer, cfg.chat_template,
            MaskOptions(last_turn_only=cfg.assistant_turns == "last",
                        train_end_of_turn=cfg.train_end_of_turn),
            cfg.system_prompt, cfg.seq_len, cfg.max_segments_per_pack or None))
    parts = (routed[PARTS], knowledge_parts, instruction_parts) | "AllParts" >> beam.Flatten()
    stats = ((routed[STATS], knowledge_stats, instruction_stats)
             | "AllStats" >> beam.Flatten()
             | "SumStats" >> beam.CombineGlobally(sum_counters))
    _ = (parts, stats) | "WriteOutputs" >> WriteOutputs(
        cfg.output, cfg.num_shards, cfg.target_shard_mb, cfg.row_group_rows,
        {"config": cfg.as_dict(), "tokenizer": tokenizer})


def argument_parser() -> argparse.ArgumentParser:
    """Our options first, then every Beam option, so --help documents them all."""
    parser = _BeamArgumentParser(
        prog="python -m beam_pipeline", description=DESCRIPTION, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    PrepOptions._add_argparse_args(parser)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        if cls is not PrepOptions:
            cls._add_argparse_args(parser)
    return parser


def run(argv: Sequence[str] | None = None) -> PrepConfig:
    """Validates everything that can be checked up front, then builds and runs the graph."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argument_parser().parse_args(argv)  # --help, unknown options and bad values stop here
    options = PipelineOptions(argv)
    options.view_as(SetupOptions).save_main_session = False
    cfg = config_from_options(options)
    tokenizer = tokenizer_identity(load_tokenizer(cfg.tokenizer, cfg.chat_template))
    shards = plan_shards(list(cfg.inputs))
    prepare_output_dir(cfg.output, cfg.overwrite)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    local = runner in LOCAL_RUNNERS
    LOG.info("%d input shard(s) from %d input(s); writing to %s", len(shards), len(cfg.inputs),
             cfg.output)
    pipeline = beam.Pipeline(options=options)
    build_graph(pipeline, cfg, shards, tokenizer)
    result = pipeline.run()
    if local:
        result.wait_until_finish()
        for line in summary_lines(read_manifest(cfg.output)):
            print(line)
    else:
        LOG.info("submitted to %s; the job writes %s/manifest.json when it completes", runner,
                 cfg.output)
    return cfg


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    LOG.setLevel(logging.INFO)
    try:
        run()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
