"""What pass one keeps of a document: its node in the duplicate graph and, for near copies, a
MinHash signature and its LSH band keys, computed alike by every process and run."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.quality import TextStats, ngram_hashes
from transforms.knowledge.words import mix

if TYPE_CHECKING:  # records imports Beam, which the helpers that key texts never load
    from transforms.core.records import Record

# (input index, file number, position): orders the copies. Files are numbered in path order, so
# this sorts like (input index, source, position) while every shuffled key stays a few ints.
RecordKey = tuple[int, int, int]
# A document in the duplicate graph: its record key, then the number of its chunk (where its
# decision goes) and the hash of its text (which the main pass checks). The record key alone
# orders nodes: it is unique.
Node = tuple[int, int, int, int, bytes]
CHUNK, CONTENT = 3, 4

SEED = 0x5EED  # of the MinHash hash: fixed, so signatures agree across runs and workers
_HALF = np.uint64(32)
_EMPTY = 1 << 32  # a bin no shingle reached: above every 32-bit value


@dataclasses.dataclass(frozen=True)
class DocumentKeys:
    """What pass one keeps of a document: under a kilobyte, however long the text is."""

    node: Node
    bands: tuple[bytes, ...] = ()  # LSH band keys (near mode)
    signature: bytes = b""  # MinHash signature, little-endian uint32 (near mode)


def record_key(record: Record, file_numbers: Mapping[str, int]) -> RecordKey:
    return (record.input_index, file_numbers[record.source], record.position)


def file_numbering(paths: Iterable[str]) -> tuple[str, ...]:
    """File number -> path, in path order: both passes number the files alike."""
    return tuple(sorted(set(paths)))


def chunk_number(chunk_id: str) -> int:
    """A chunk's number in the shuffled nodes (a signed 64-bit hash of its id): it names the
    chunk's decision file. Two chunks that shared one would share a file, which still holds
    only decisions found by record key and text hash."""
    return int.from_bytes(hashlib.blake2b(chunk_id.encode("utf-8"), digest_size=8).digest(),
                          "little", signed=True)


def _stable_uint64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def shingles(stats: TextStats, n: int) -> np.ndarray:
    """64-bit hashes of the word ``n``-grams of a document (one of all its words if fewer).

    Words are the quality rules' words (``transforms.knowledge.words``: punctuation and spacing
    ignored,
    each Han or kana character a word) by their folded ids (case and apostrophe style do not
    count), which every process computes alike.
    """
    if not stats.word_count:
        return np.empty(0, dtype=np.uint64)
    return ngram_hashes(stats.words.folded_ids, min(n, stats.word_count))


class MinHasher:
    """``num_perm`` MinHash values per document from one hash per shingle: one permutation
    hashing (Li, Owen and Zhang, 2012) with optimal densification (Shrivastava, 2017).

    Each shingle's 64-bit hash picks one of ``num_perm`` bins (its high half) and a value (its
    low half); a bin keeps its smallest value. A bin no shingle reached takes the value of the
    first filled bin along its own fixed probe order, so for every bin the chance that two
    documents agree is their Jaccard similarity, as with ``num_perm`` independent hash
    functions, at the cost of one hash per shingle instead of ``num_perm``. The hash is
    splitmix64's finaliser after a seeded offset, and the probe orders come from the same
    mix, so signatures agree across runs, workers and numpy versions.
    """

    def __init__(self, num_perm: int, seed: int = SEED):
        self.bins = num_perm
        self.offset = np.uint64(_stable_uint64(f"{seed}:offset".encode()))
        keys = mix(np.arange(num_perm * num_perm, dtype=np.uint64) + self.offset)
        self.probes = np.argsort(keys.reshape(num_perm, num_perm), axis=1)

    def signature(self, shingle_hashes: np.ndarray) -> np.ndarray:
        """The value of each bin over the shingles, as uint32 (all-ones when empty)."""
        if not len(shingle_hashes):
            return np.full(self.bins, _EMPTY - 1, dtype="<u4")
        hashes = mix(shingle_hashes + self.offset)
        bins = ((hashes >> _HALF) * np.uint64(self.bins)) >> _HALF  # the high half, scaled
        values = np.full(self.bins, _EMPTY, dtype=np.uint64)
        np.minimum.at(values, bins.astype(np.intp), hashes & np.uint64(_EMPTY - 1))
        empty = np.flatnonzero(values == _EMPTY)
        if len(empty):
            probes = self.probes[empty]
            first_filled = np.argmax(values[probes] != _EMPTY, axis=1)
            values[empty] = values[probes[np.arange(len(empty)), first_filled]]
        return values.astype("<u4")


def band_keys(signature: np.ndarray, bands: int) -> tuple[bytes, ...]:
    """One key per band of rows; documents that share any band key are candidates."""
    data = signature.astype("<u4").tobytes()
    width = len(data) // bands
    return tuple(
        hashlib.blake2b(i.to_bytes(2, "little") + data[i * width:(i + 1) * width],
                        digest_size=8).digest()
        for i in range(bands))


def similarity(signature_a: bytes, signature_b: bytes) -> float:
    """Estimated Jaccard similarity: the share of MinHash values that agree."""
    a, b = np.frombuffer(signature_a, "<u4"), np.frombuffer(signature_b, "<u4")
    return float(np.mean(a == b))


def document_keys(key: RecordKey, chunk: int, stats: TextStats, config: DedupConfig,
                  hasher: MinHasher | None) -> DocumentKeys:
    """The keys pass one emits for one document; MinHash keys only with a ``hasher``."""
    node = (*key, chunk, stats.digest)
    if hasher is None:
        return DocumentKeys(node)
    return DocumentKeys(node, *near_keys(stats, config, hasher))


def near_keys(stats: TextStats, config: DedupConfig, hasher: MinHasher
              ) -> tuple[tuple[bytes, ...], bytes]:
    """A document's LSH band keys and MinHash signature; none for a document without words,
    which only an exact copy can match."""
    found = shingles(stats, config.ngram)
    if not len(found):
        return (), b""
    signature = hasher.signature(found)
    return band_keys(signature, config.bands), signature.tobytes()
