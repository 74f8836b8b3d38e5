"""Batch encoding of raw documents for the knowledge branch: both deduplication's first pass
(ids for the token cache) and the main pass's ``TokenizeDocuments`` encode through it."""

from __future__ import annotations

import functools

import numpy as np
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from transforms.core.fast_encoder import fast_raw_encoder
from transforms.core.tokenizer import end_of_text_id, load_tokenizer, private_backend


class RawTextEncoder:
    """Batch encoding of raw documents with the tokenizer's own special-token policy.

    Literal control-token strings (``<|im_start|>`` in a web page) stay plain text, like
    ``split_special_tokens=True``; the flag is set on a private copy of the backend, because the
    shared tokenizer serves the instruction branch, which needs them parsed. The tokenizer adds
    its BOS where its family uses one; an end-of-text it appends itself is removed, since
    ``ConcatenateBlocks`` ends every document with exactly one.

    For the offline default tokenizer, proven by ``fast_raw_encoder``, tiktoken encodes with the
    same ids several times faster, and the private backend is only made if a text needs it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.shared_backend = tokenizer.backend_tokenizer
        self.fast = fast_raw_encoder(self.shared_backend, self._encode_with_backend)
        self.end = None
        if self.fast is None:
            probe = self.backend.encode("a", add_special_tokens=True).ids
            self.end = -1 if probe and probe[-1] == end_of_text_id(tokenizer) else None

    @functools.cached_property
    def backend(self) -> Tokenizer:
        return private_backend(self.shared_backend, encode_special_tokens=True)

    def _encode_with_backend(self, text: str) -> list[int]:
        return self.backend.encode_batch_fast([text], add_special_tokens=True)[0].ids

    def encode(self, texts: list[str], parallel: bool = True) -> tuple[np.ndarray, ...]:
        """Ids per text; ``parallel=False`` keeps tiktoken on the calling thread (a caller
        that runs beside busy Python on the main thread should take one core, not all)."""
        if self.fast is not None:
            return self.fast.encode_arrays(texts, parallel)
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=True)
        return tuple(np.asarray(encoding.ids[:self.end], dtype=np.int32)
                     for encoding in encodings)


@functools.cache
def raw_text_encoder(tokenizer: str) -> RawTextEncoder:
    """One encoder per process and tokenizer, like ``load_tokenizer``."""
    return RawTextEncoder(load_tokenizer(tokenizer))
