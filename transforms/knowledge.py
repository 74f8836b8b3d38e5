"""The knowledge-corpus branch: documents to fixed-length pretraining blocks.

Documents are tokenized a chunk at a time (one batched call) and concatenated, in input order,
into blocks of exactly ``block_size`` tokens within that chunk; each chunk's leftover tokens are
joined with other chunks' leftovers in a few ordered groups, so at most one partial block per
group is dropped or padded. Rows depend only on the input. Tokens travel as numpy int32 arrays.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from transforms.option_types import positive_int
from transforms.packing import Blocks, blocks_to_table, concat_blocks, cut_blocks, join_streams
from transforms.records import RecordChunk
from transforms.steps import (
    PARTS,
    STATS,
    TAILS,
    ChunkStep,
    GatherTails,
    Part,
    TailGroup,
    apply_step,
)
from transforms.tokenizer import end_of_text_id, load_tokenizer

PRETRAIN = "pretrain"
GROUP = "knowledge branch"


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


@dataclasses.dataclass(frozen=True)
class KnowledgeConfig:
    block_size: int
    remainder: str

    @classmethod
    def from_options(cls, options: PipelineOptions) -> KnowledgeConfig:
        view = options.view_as(KnowledgeOptions)
        return cls(block_size=view.block_size, remainder=view.remainder)


@dataclasses.dataclass(frozen=True)
class TokenizedChunk:
    chunk_id: str
    token_arrays: tuple[np.ndarray, ...]


class TokenizeDocuments(ChunkStep):
    """Tokenizes raw text, with literal special-token strings kept as plain text."""

    step_name = "tokenize"

    def __init__(self, tokenizer: str):
        self.tokenizer_spec = tokenizer

    def setup(self) -> None:
        self.tokenizer = load_tokenizer(self.tokenizer_spec)

    def run(self, chunk: RecordChunk) -> Iterator[TokenizedChunk]:
        # add_special_tokens follows the tokenizer family: BOS where it uses one, none for Qwen.
        encoded = self.tokenizer(
            [record.value for record in chunk.records], add_special_tokens=True,
            split_special_tokens=True, return_attention_mask=False)["input_ids"]
        arrays = tuple(np.asarray(ids, dtype=np.int32) for ids in encoded)
        self.count("knowledge.documents", len(arrays))
        self.count("knowledge.tokens", sum(len(a) for a in arrays))
        yield TokenizedChunk(chunk.chunk_id, arrays)


class ConcatenateBlocks(ChunkStep):
    """Joins a chunk's documents with end-of-text and cuts full ``block_size`` rows.

    The tokens after the last full block go on as the chunk's tail, to be joined with other
    chunks' tails, so at most one partial block per tail group meets the remainder policy.
    """

    step_name = "blocks"

    def __init__(self, tokenizer: str, block_size: int):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size

    def setup(self) -> None:
        self.separator_id = end_of_text_id(load_tokenizer(self.tokenizer_spec))

    def run(self, chunk: TokenizedChunk) -> Iterator[Any]:
        blocks = concat_blocks(chunk.token_arrays, self.block_size, self.separator_id,
                               remainder="carry")
        self.count("knowledge.separator_tokens", len(chunk.token_arrays))
        yield from _emit(self, chunk.chunk_id, blocks)
        if len(blocks.tail.tokens):
            yield beam.pvalue.TaggedOutput(TAILS, (chunk.chunk_id, blocks.tail))


class ConcatenateTails(ChunkStep):
    """Cuts the joined tails of several chunks into blocks; applies the remainder policy."""

    step_name = "tail-blocks"

    def __init__(self, tokenizer: str, block_size: int, remainder: str):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size
        self.remainder = remainder

    def setup(self) -> None:
        tokenizer = load_tokenizer(self.tokenizer_spec)
        self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else end_of_text_id(tokenizer))

    def run(self, group: TailGroup) -> Iterator[Any]:
        blocks = cut_blocks(join_streams(group.items), self.block_size, self.remainder,
                            self.pad_id)
        self.count("knowledge.remainder_tokens", blocks.remainder_tokens)
        self.count("knowledge.pad_tokens", blocks.pad_tokens)
        yield from _emit(self, group.chunk_id, blocks)


def _emit(step: ChunkStep, chunk_id: str, blocks: Blocks) -> Iterator[Any]:
    step.count("knowledge.blocks", len(blocks.input_ids))
    step.count("knowledge.tokens_out", blocks.tokens_out)
    if len(blocks.input_ids):
        yield beam.pvalue.TaggedOutput(
            PARTS, Part(PRETRAIN, chunk_id, step.step_name, blocks_to_table(blocks)))


class KnowledgeBranch(beam.PTransform):
    """Knowledge chunks in; pretraining block parts, dropped-record parts and stats out."""

    def __init__(self, tokenizer: str, config: KnowledgeConfig, tail_buckets: int):
        super().__init__()
        self.tokenizer = tokenizer
        self.block_size = config.block_size
        self.remainder = config.remainder
        self.tail_buckets = tail_buckets

    def expand(self, chunks):
        tokenized = apply_step(chunks, "Tokenize", TokenizeDocuments(self.tokenizer))
        blocks = apply_step(tokenized.main, "ConcatenateBlocks",
                            ConcatenateBlocks(self.tokenizer, self.block_size), TAILS)
        tails = apply_step(
            blocks[TAILS] | "GatherTails" >> GatherTails(self.tail_buckets),
            "ConcatenateTails", ConcatenateTails(self.tokenizer, self.block_size, self.remainder))
        steps = (tokenized, blocks, tails)
        parts = tuple(s[PARTS] for s in steps) | "KnowledgeParts" >> beam.Flatten()
        stats = tuple(s[STATS] for s in steps) | "KnowledgeStats" >> beam.Flatten()
        return parts, stats
