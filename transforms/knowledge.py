"""The knowledge-corpus branch: documents to fixed-length pretraining blocks.

Documents are tokenized a chunk at a time (one batched call) and concatenated, in input order,
into blocks of exactly ``block_size`` tokens within that chunk, so the rows depend only on the
input. Token sequences travel as numpy int32 arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from transforms.packing import blocks_to_table, concat_blocks
from transforms.records import RecordChunk
from transforms.steps import PARTS, STATS, ChunkStep, Part, apply_step
from transforms.tokenizer import end_of_text_id, load_tokenizer

PRETRAIN = "pretrain"


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
    """Joins a chunk's documents with end-of-text and cuts them into ``block_size`` rows."""

    step_name = "blocks"

    def __init__(self, tokenizer: str, block_size: int, remainder: str):
        self.tokenizer_spec = tokenizer
        self.block_size = block_size
        self.remainder = remainder

    def setup(self) -> None:
        tokenizer = load_tokenizer(self.tokenizer_spec)
        self.separator_id = end_of_text_id(tokenizer)
        self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else self.separator_id)

    def run(self, chunk: TokenizedChunk) -> Iterator[Part]:
        blocks = concat_blocks(chunk.token_arrays, self.block_size, self.separator_id,
                               remainder=self.remainder, pad_id=self.pad_id)
        self.count("knowledge.separator_tokens", len(chunk.token_arrays))
        self.count("knowledge.blocks", len(blocks.input_ids))
        self.count("knowledge.tokens_out", blocks.tokens_out)
        self.count("knowledge.remainder_tokens", blocks.remainder_tokens)
        self.count("knowledge.pad_tokens", blocks.pad_tokens)
        if len(blocks.input_ids):
            yield beam.pvalue.TaggedOutput(
                PARTS, Part(PRETRAIN, chunk.chunk_id, self.step_name, blocks_to_table(blocks)))


class KnowledgeBranch(beam.PTransform):
    """Knowledge chunks in; pretraining block parts, dropped-record parts and stats out."""

    def __init__(self, tokenizer: str, block_size: int, remainder: str):
        super().__init__()
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.remainder = remainder

    def expand(self, chunks):
        tokenized = apply_step(chunks, "Tokenize", TokenizeDocuments(self.tokenizer))
        blocks = apply_step(tokenized.main, "ConcatenateBlocks",
                            ConcatenateBlocks(self.tokenizer, self.block_size, self.remainder))
        parts = (tokenized[PARTS], blocks[PARTS]) | "KnowledgeParts" >> beam.Flatten()
        stats = (tokenized[STATS], blocks[STATS]) | "KnowledgeStats" >> beam.Flatten()
        return parts, stats
