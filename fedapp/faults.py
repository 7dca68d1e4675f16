"""Client fault injection (run config ``fault-crash-prob``, ``fault-late-prob``).

A train call of the ClientApp draws one uniform number from
``default_rng([seed, server_round, partition_id, FAULT_STREAM])``: below
``fault-crash-prob`` the ClientApp raises :class:`InjectedCrash` (Flower turns it into an
error reply), below ``fault-crash-prob + fault-late-prob`` it answers only after the
round timeout (``round-timeout`` seconds, plus :data:`LATE_MARGIN`), so the server has
stopped waiting for it. The draw depends only on (seed, round, partition), never on
node ids, time or call order: the same faults hit the same clients in every run with
the same seed, which keeps fault runs reproducible and resumable. DynamicFL sends
several chunks per round; every chunk of a faulty (round, partition) faults, so the
first one already takes the client out of the round.

A late client waits with the module's sleeper (``time.sleep``); the in-process test Grid
installs a virtual clock instead with :func:`use_sleeper`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

FAULT_STREAM = 0xFA17  # the fault draw's own stream, apart from every other (seed, round, pid)
LATE_MARGIN = 1.0  # seconds a late client answers after the round timeout

Sleeper = Callable[[float], None]
_sleeper: Sleeper = time.sleep


def set_sleeper(sleeper: Sleeper | None) -> Sleeper:
    """Make late clients wait with ``sleeper(seconds)`` (None: ``time.sleep``); returns
    the previous sleeper. The in-process Grid passes a virtual clock."""
    global _sleeper  # noqa: PLW0603 - the one seam for virtual time
    previous, _sleeper = _sleeper, (sleeper or time.sleep)
    return previous


@contextmanager
def use_sleeper(sleeper: Sleeper) -> Iterator[None]:
    """``set_sleeper(sleeper)`` for the duration of a ``with`` block."""
    previous = set_sleeper(sleeper)
    try:
        yield
    finally:
        set_sleeper(previous)


class InjectedCrash(RuntimeError):
    """A crash the run config asked for (``fault-crash-prob``)."""


def fault_of(
    seed: int, server_round: int, partition_id: int, crash_prob: float, late_prob: float
) -> str | None:
    """``"crash"``, ``"late"`` or None for this (seed, round, partition)."""
    if crash_prob <= 0 and late_prob <= 0:
        return None
    u = float(np.random.default_rng([seed, server_round, partition_id, FAULT_STREAM]).random())
    if u < crash_prob:
        return "crash"
    if u < crash_prob + late_prob:
        return "late"
    return None


def apply_fault(
    seed: int,
    server_round: int,
    partition_id: int,
    crash_prob: float,
    late_prob: float,
    round_timeout: float,
    *,
    packed: bool = False,
) -> None:
    """Raise (crash), sleep past the round timeout (late), or return at once. A late
    virtual client of packed mode (``packed``) raises ``NoReply`` instead of sleeping: it
    never answers, and the others of its share are not held up."""
    fault = fault_of(seed, server_round, partition_id, crash_prob, late_prob)
    if fault == "crash":
        raise InjectedCrash(
            f"injected crash (fault-crash-prob={crash_prob}) of partition {partition_id} "
            f"in round {server_round}"
        )
    if fault == "late" and packed:
        from strategies.client import NoReply  # noqa: PLC0415

        raise NoReply(f"late fault of partition {partition_id} in round {server_round}")
    if fault == "late":
        _sleeper(round_timeout + LATE_MARGIN)
