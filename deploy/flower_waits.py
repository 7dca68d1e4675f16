"""Flower 1.41's fixed SuperNode waits, shortened in the SuperNodes we start.

``flwr/supernode/start_client_internal.py``, the SuperNode's loop, sleeps ``time.sleep(3)``
after a pull that brought no message and ``time.sleep(0.5)`` between checks for a
ClientApp's reply. Here: ``idle`` (default 0.5 s: two pulls a second per idle SuperNode)
and 0.05 s, by replacing the ``time`` module that ``start_client_internal`` sleeps with
(neither wait has an argument or environment variable). The arrays' retry wait is
shortened too (:mod:`fedapp.flower_pulls`). :func:`check_flower_waits` fails loudly when a
Flower upgrade moves them (``tests/test_flower_waits.py``); profile and figures in
docs/deployment.md, "Why a deployed round costs more".
"""

from __future__ import annotations

import time as _time
import types

from flwr.supernode import start_client_internal

from fedapp.flower_pulls import check_object_pulls, shorten_object_pulls

SUPERNODE_IDLE_PULL = 0.5  # seconds; Flower: 3
SUPERNODE_REPLY_CHECK = 0.05  # seconds; Flower: 0.5
FLOWER_IDLE_SLEEP, FLOWER_REPLY_SLEEP = 3, 0.5  # the literals in start_client_internal.py


def check_flower_waits() -> None:
    """Raise if this Flower no longer has the waits this module shortens."""
    check_object_pulls()
    if not isinstance(getattr(start_client_internal, "time", None), types.ModuleType | SleepMap):
        raise RuntimeError("flwr changed: flwr.supernode.start_client_internal no longer "
                           "imports time; update deploy/flower_waits.py")


class SleepMap:
    """The ``time`` module, but ``sleep(s)`` sleeps ``waits.get(s, s)``."""

    def __init__(self, waits: dict[float, float]) -> None:
        self.waits = dict(waits)

    def sleep(self, seconds: float) -> None:
        _time.sleep(self.waits.get(seconds, seconds))

    def __getattr__(self, name: str) -> object:
        return getattr(_time, name)


def shorten_supernode_waits(idle: float = SUPERNODE_IDLE_PULL,
                            reply: float = SUPERNODE_REPLY_CHECK) -> None:
    """In this (SuperNode) process: pull again ``idle`` s after an empty pull, check for a
    ClientApp's reply every ``reply`` s; object pulls as :func:`shorten_object_pulls`."""
    for name, value in (("idle", idle), ("reply", reply)):
        if not 0 < value <= 60:
            raise ValueError(f"{name}={value!r} must be in (0, 60] seconds")
    shorten_object_pulls()
    start_client_internal.time = SleepMap({FLOWER_IDLE_SLEEP: idle, FLOWER_REPLY_SLEEP: reply})
