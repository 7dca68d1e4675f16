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
