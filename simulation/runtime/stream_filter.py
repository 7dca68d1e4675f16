"""What a launch shows of ``flwr run --stream``: Flower's and Ray's messages that do not
apply to a fedhetero run are left out, and colour codes when the output is not a terminal.

Left out (the full stream stays in the launch's captured output and in Flower's own log):

* "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2." and the "To change
  federation size" hint with its command: every launch gives ``num-supernodes`` itself;
  the "Federation ... (N simulated SuperNodes)" line that says how many stays;
* Ray's "FutureWarning: Tip: In future versions of Ray, Ray will no longer override
  accelerator visible devices ..." (and its ``warnings.warn(`` line): about a future
  default, nothing a user of this run sets.
"""

from __future__ import annotations

import re

__all__ = ["ANSI", "StreamFilter"]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DROPPED = (
    re.compile(r"default simulated SuperNodes changed from 10 to 2"),
    re.compile(r"To change federation size, use the following command"),
    re.compile(r"flwr federation simulation-config .*--num-supernodes"),
    re.compile(r"FutureWarning: Tip: In future versions of Ray"),
)
FOLLOWED_BY = re.compile(r"^\s+warnings\.warn\($")  # the source line Python prints after one


class StreamFilter:
    """Line -> the line to show, or None (module docstring)."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour
        self.dropped_last = False

    def __call__(self, line: str) -> str | None:
        plain = ANSI.sub("", line)
        dropped = any(p.search(plain) for p in DROPPED) or (
            self.dropped_last and FOLLOWED_BY.match(plain.rstrip("\n")) is not None)
        self.dropped_last = dropped
        if dropped:
            return None
        return line if self.colour else plain
