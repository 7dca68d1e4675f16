"""argparse ``type`` functions for the tools' count options: a bad value is a usage error
that names the option (argparse) and what to give, before anything starts."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number >= ``minimum`` (``--replies 0`` is refused, not benchmarked)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= {minimum}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def fraction(text: str) -> float:
    """A number from 0 to 1 (an accuracy target: ``0.8`` for 80 %)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number from 0 to 1 (0.8 for 80 %)")
    return value
