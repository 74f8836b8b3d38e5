"""A tiny Qwen2-architecture model with random weights, for examples that must run in seconds on a
CPU: the real architecture and the tokenizer's whole vocabulary, two small layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(vocab_size: int, max_positions: int = 4096, seed: int = 0) -> Qwen2ForCausalLM:
    """Two layers of width 64 over ``vocab_size`` tokens, the same weights for the same seed.

    ``sdpa`` attention: given ``position_ids`` that restart at 0 and no ``attention_mask``,
    transformers keeps attention inside each packed segment (swap in ``flash_attention_2`` on a
    GPU; the batches are the same).
    """
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True)
    return Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa")


def fold_ids(row: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """A row with ``input_ids`` and ``labels`` folded into ``vocab_size`` ids (``-100`` kept).

    Only for smoke runs on a CPU: the output layer over Qwen2's 151,646 tokens costs seconds per
    step there. Which tokens attend to which and which carry loss stay as the pipeline wrote.
    """
    def fold(values: Any) -> np.ndarray:
        values = np.asarray(values, dtype=np.int64)
        return np.where(values >= 0, values % vocab_size, values)

    return {name: fold(values) if name in ("input_ids", "labels") else values
            for name, values in row.items()}
