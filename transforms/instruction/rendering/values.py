"""The values that rendering and masking hand on: the mask options, a rendered conversation and
its encoded example. They sit at the bottom of the package, so nothing here imports upward."""

from __future__ import annotations

import dataclasses

import numpy as np

from transforms.core.vocabulary import PREFIX


@dataclasses.dataclass(frozen=True)
class MaskOptions:
    """Which assistant tokens carry loss."""

    last_turn_only: bool = False  # train only the conversation's final assistant message
    train_end_of_turn: bool = True  # train the end-of-turn token(s) that close each turn
    train_reasoning: bool = True  # train the reasoning text the template renders in a reply
    # Find every unmarked template's spans by the general method (docs/masking.md, "The
    # sentinel method"), not only where locating turn by turn fails.
    sentinels_only: bool = False


@dataclasses.dataclass(frozen=True)
class EncodedExample:
    """One rendered conversation; ``labels`` is ``input_ids`` with -100 where no loss."""

    input_ids: np.ndarray  # int32
    labels: np.ndarray  # int32
    tokens_cut: int = 0  # tokens the overflow policy removed (0: the whole conversation)
    mask_method: str = PREFIX  # how the trained spans were found (MASK_METHODS)

    def __reduce__(self) -> tuple:
        """Pickled as one bytes object: about half the time of two pickled arrays, and Beam
        pickles examples between steps and to estimate their size."""
        ids, labels = self.input_ids, self.labels
        if ids.dtype != _INT32_LE or labels.dtype != _INT32_LE or ids.ndim != 1 or labels.ndim != 1:
            return (EncodedExample, (ids, labels, self.tokens_cut, self.mask_method))
        return (_unpickle_example, (ids.tobytes() + labels.tobytes(), len(ids), self.tokens_cut,
                                    self.mask_method))


_INT32_LE = np.dtype("<i4")


def _unpickle_example(data: bytes, n_ids: int, tokens_cut: int,
                      mask_method: str = PREFIX) -> EncodedExample:
    values = np.frombuffer(bytearray(data), dtype=_INT32_LE)  # writeable, like the originals
    return EncodedExample(values[:n_ids], values[n_ids:], tokens_cut, mask_method)


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A conversation's full text and what to train in it, before its tokens."""

    text: str
    spans: list[tuple[int, int]]  # character spans [start, end) of trained text
    marked: str | None  # the text with control-token text from content marked, if it has any
    method: str = PREFIX  # how the spans were found
