"""``--write_documents``: a row for every kept knowledge document, written to ``documents/``.

Each row holds exactly the text that was tokenized, its ids, where it came from and what the
curation steps found in it (language, personal data, the quantities the quality rules judge,
the copies deduplication dropped in its favour), so that a user can run ablations, set new
thresholds, or switch tokenizer by reading ``documents/`` back with ``--tokenize_only`` instead
of curating again. The rows are staged
where the documents are last whole (after every filter, split and mix), so they are the ones
the blocks hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from transforms.core.packing import join_documents
from transforms.core.records import Record
from transforms.core.vocabulary import DUPLICATE_EXACT, DUPLICATE_NEAR
from transforms.curation.pii import KINDS
from transforms.knowledge.quality import MEASURES, TextStats

COPY_REASONS = (DUPLICATE_EXACT, DUPLICATE_NEAR)  # a column each, named by the reason code
PII_TYPE = pa.struct([(kind, pa.int32()) for kind in KINDS])
DOCUMENT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("input", pa.int32()),  # the index of its --input in the manifest's inputs
    ("source", pa.string()),
    ("position", pa.int64()),
    ("url", pa.string()),
    ("text", pa.string()),
    ("language", pa.string()),
    ("language_score", pa.float32()),
    ("tokens", pa.int32()),  # its own tokens, without the end-of-text that follows it
    ("words", pa.int32()),
    *((name, pa.float32()) for name in MEASURES),
    ("pii", PII_TYPE),
    # copies dropped in its favour by deduplication, by reason: its cluster is it and them
    *((reason, pa.int32()) for reason in COPY_REASONS),
    ("input_ids", pa.list_(pa.int32())),  # its tokens and the end-of-text, as blocks hold them
])


def document_id(source: str, position: int) -> str:
    """A document's id, the same on every run and runner that reads the same input: a hash of
    where it was read (16 hex digits)."""
    where = f"{source}\n{position}".encode("utf-8", "backslashreplace")
    return hashlib.blake2b(where, digest_size=8).hexdigest()


def ids_column(token_arrays: Sequence[np.ndarray], separator_id: int) -> pa.ListArray:
    """Each document's tokens and the end-of-text token."""
    stream = join_documents(token_arrays, separator_id)
    offsets = np.zeros(len(stream.piece_lengths) + 1, np.int32)
    np.cumsum(stream.piece_lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(stream.tokens, pa.int32()))


def ids_table(token_arrays: Sequence[np.ndarray], separator_id: int) -> pa.Table:
    """Only the ids, one row per document: what Megatron's document layout needs."""
    return pa.table({"input_ids": ids_column(token_arrays, separator_id)})


def document_schema(score_names: Sequence[str] = ()) -> pa.Schema:
    """``DOCUMENT_SCHEMA``, and with ``--quality_model`` a ``scores`` struct: a field per model,
    in the order given."""
    if not score_names:
        return DOCUMENT_SCHEMA
    return DOCUMENT_SCHEMA.append(
        pa.field("scores", pa.struct([(name, pa.float32()) for name in score_names])))


def documents_table(records: Sequence[Record], token_arrays: Sequence[np.ndarray],
                    separator_id: int, score_names: Sequence[str] = ()) -> pa.Table:
    """The ``document_schema`` rows of a chunk's documents, in order."""
    stats = [TextStats(record.value) for record in records]
    copies = [dict(record.duplicates) for record in records]
    columns = {
        "id": [document_id(r.source, r.position) for r in records],
        "input": [r.input_index for r in records],
        "source": [r.source for r in records],
        "position": [r.position for r in records],
        "url": [r.url for r in records],
        "text": [r.value for r in records],
        "language": [r.language for r in records],
        "language_score": [r.language_score for r in records],
        "tokens": [len(a) for a in token_arrays],
        "words": [s.word_count for s in stats],
        **{name: [measure(s) for s in stats] for name, measure in MEASURES.items()},
        "pii": [dict.fromkeys(KINDS, 0) | dict(r.pii) for r in records],
        **{reason: [found.get(reason, 0) for found in copies] for reason in COPY_REASONS},
        "input_ids": ids_column(token_arrays, separator_id),
    }
    if score_names:
        columns["scores"] = [dict(r.scores) for r in records]
    return pa.table(columns, schema=document_schema(score_names))
