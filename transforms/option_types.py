"""Argparse value types shared by every options group, so bad values fail before any work.

Every option takes a value (``--name=value``), booleans included, so that a Dataflow Flex
Template, whose parameters are plain strings, can pass each one unchanged.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def fraction(text: str) -> float:
    """A float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
