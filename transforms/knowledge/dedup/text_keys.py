"""What deduplication's first pass computes from a prepared document's text alone: its quality
verdict, its MinHash keys and its boilerplate units' hashes (about three quarters of that pass's
Python on the bench corpus).

``KeyTexts`` does it for a batch of texts as a picklable callable, so that the first pass sends a
large chunk to helper processes (``transforms.core.helpers``) while its main thread prepares the
next chunk; its background thread meanwhile encodes the chunk before. The answers are those of
the calling process: the same functions on the same texts. This module and what it imports load
no Beam, so a helper starts in a fraction of a second with numpy alone.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from transforms.knowledge.dedup.config import BoilerplateConfig, DedupConfig
from transforms.knowledge.dedup.minhash import MinHasher, near_keys
from transforms.knowledge.dedup.units import unit_hashes
from transforms.knowledge.quality import QualityConfig, TextStats, first_failure


@dataclasses.dataclass(frozen=True)
class TextKeys:
    """One text's keys: the hash of the text, the first quality rule it fails (None to keep it)
    and, for a kept text, its MinHash band keys and signature (near mode) and unit hashes."""

    digest: bytes
    reason: str | None
    bands: tuple[bytes, ...] = ()
    signature: bytes = b""
    units: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class KeyTexts:
    """``TextKeys`` of each text, in order. ``quality`` None judges nothing (every text is
    kept), ``near`` None computes no MinHash keys, ``boilerplate`` None no unit hashes."""

    quality: QualityConfig | None
    near: DedupConfig | None
    boilerplate: BoilerplateConfig | None

    def __call__(self, texts: Sequence[str]) -> list[TextKeys]:
        return [self.keys(text) for text in texts]

    def keys(self, text: str) -> TextKeys:
        stats = TextStats(text)
        reason = None if self.quality is None else first_failure(stats, self.quality)
        if reason is not None:
            return TextKeys(stats.digest, reason)
        bands, signature = ((), b"") if self.near is None else near_keys(
            stats, self.near, _hasher(self.near.num_perm))
        units = (frozenset(unit_hashes(text, self.boilerplate)) if self.boilerplate is not None
                 else frozenset())
        return TextKeys(stats.digest, None, bands, signature, units)


@functools.cache
def _hasher(num_perm: int) -> MinHasher:
    """One hasher per process and size: its probe orders take a moment to build."""
    return MinHasher(num_perm)
