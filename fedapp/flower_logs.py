"""Flower log lines that say nothing to a fedhetero run, left out of the ServerApp's log.

* "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.": Flower's FedAvg
  says it when a strategy is built with ``fraction-evaluate = 0``, the app's default (the
  ServerApp evaluates the global model on the test split itself), and the app builds its
  strategy twice (before and after the model is measured). The startup summary still shows
  ``Fraction: ... evaluate (0.00)``. A strategy built outside the app keeps Flower's line.
"""

from __future__ import annotations

import logging

from flwr.common.logger import FLOWER_LOGGER

SKIPPED = ("fraction_evaluate is set to 0.0. Federated evaluation will be skipped.",)


class SkippedLines(logging.Filter):
    """Drops the records whose message is one of :data:`SKIPPED`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in SKIPPED


def quiet_flower_lines() -> None:
    """Install :class:`SkippedLines` on Flower's logger (once)."""
    if not any(isinstance(f, SkippedLines) for f in FLOWER_LOGGER.filters):
        FLOWER_LOGGER.addFilter(SkippedLines())
