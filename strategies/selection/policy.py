"""What the participation model tells a selection policy, and what it hears back.

:class:`~strategies.engine.participation.RandomSelection` needs nothing but the number of online
clients (its ``select``). A policy that learns whom to ask (Oort, Power-of-Choice, TiFL)
is an :class:`InformedSelection`: per round it is given the online clients as
:class:`Candidate` records (client key, n_k, expected clock time t_i of eq. 1 of
:mod:`strategies.engine.clock`) and, if it asks, a :data:`LossQuery` that asks clients for their
loss on the global model; after the round it is told each accepted reply's
:class:`Outcome` (reported training loss, n_k, clock time). Its cross-round state is
plain dicts, lists, numbers and strings (``state_dict``), so a checkpoint resumes it bit
for bit. Every draw comes from ``default_rng([seed, round, tag])``.

A policy whose paper also fixes how the chosen clients are averaged says so in a
``weighting`` attribute (Power-of-Choice: ``"uniform"``, Cho, Wang and Joshi 2022, Sec. 2);
:func:`selection_weighting` is the round engine's rule for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import Protocol, runtime_checkable

from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged

__all__ = ["Candidate", "Choice", "InformedSelection", "LossQuery", "Outcome",
           "SELECTIONS", "reported_loss", "selection_weighting", "warn_no_loss"]

SELECTIONS = ("random", "power-of-choice", "oort", "tifl")


@dataclass(frozen=True)
class SelectionSection(Section):
    """A selection policy's inputs and choice (:mod:`strategies.selection.policy`); the policy's own
    fields are None when it has none of them."""

    policy: str = logged(C.LOG_SELECTION, default="")
    candidates: int = logged(C.LOG_SELECTION_CANDIDATES, default=0)
    chosen: list[str] = logged(C.LOG_SELECTION_CHOSEN, default=())
    scores: Mapping[str, float] | None = logged(C.LOG_SELECTION_SCORES)
    epsilon: float | None = logged(C.LOG_OORT_EPSILON)
    preferred_seconds: float | None = logged(C.LOG_OORT_PREFERRED_SECONDS)
    explored: int | None = logged(C.LOG_OORT_EXPLORED)
    blacklisted: int | None = logged(C.LOG_OORT_BLACKLISTED)
    losses: Mapping[str, float | None] | None = logged(C.LOG_POC_LOSSES)
    query_messages: int | None = logged(C.LOG_POC_QUERY_MESSAGES)
    query_bytes: int | None = logged(C.LOG_POC_QUERY_BYTES)
    query_seconds: float | None = logged(C.LOG_POC_QUERY_SECONDS)
    tier: int | None = logged(C.LOG_TIFL_TIER)
    probabilities: list[float] | None = logged(C.LOG_TIFL_PROBABILITIES)
    credits: list[int] | None = logged(C.LOG_TIFL_CREDITS)



@dataclass(frozen=True)
class Candidate:
    """An online client as a policy sees it."""

    key: str
    """Its key in cross-round tables (partition id, else ``node-<id>``)."""
    num_examples: int | None
    """n_k from the client-info query (None: not reported)."""
    seconds: float | None
    """t_i of eq. (1) for the round's full work on the simulated clock (None: no clock)."""


@dataclass(frozen=True)
class Outcome:
    """What an accepted reply told of its client."""

    key: str
    loss: float | None
    """The mean training loss it reported (``train-loss`` / ``train_loss``), None if none."""
    num_examples: int | None
    seconds: float | None
    """Its t_i on the simulated clock (None: no clock)."""


@dataclass(frozen=True)
class Choice:
    """A policy's pick: candidate position -> draws, and its run-log section."""

    picks: dict[int, int]
    section: SelectionSection


LossQuery = Callable[[Sequence[int]], dict[int, float | None]]
"""Asks the candidates at the given positions for their loss on the current global model
(Flower ``evaluate`` messages); position -> loss, None for a client without a usable
answer."""


@runtime_checkable
class InformedSelection(Protocol):
    """A selection policy that sees the candidates' facts and the rounds' outcomes."""

    name: str
    needs_clock: bool
    queries_losses: bool

    def choose(self, server_round: int, candidates: Sequence[Candidate], m: int,
               query: LossQuery | None) -> Choice:
        """The m clients of round ``server_round`` (fewer only if fewer are online)."""

    def feedback(self, server_round: int, outcomes: Sequence[Outcome]) -> None:
        """Learn from the accepted replies of round ``server_round``."""

    def state_dict(self) -> dict:
        """Cross-round state: plain dicts, lists, numbers, strings."""

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`."""


def reported_loss(metrics: Mapping[str, object], keys: Sequence[str] = (
        C.TRAIN_LOSS, C.STOCK_TRAIN_LOSS)) -> float | None:
    """The first of ``keys`` in ``metrics`` that holds a finite number >= 0, else None."""
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def selection_weighting(owner: str, weighting: str, policy: object) -> str:
    """The weighting the round engine averages with under selection ``policy``.

    A policy with a ``weighting`` attribute (:class:`~strategies.selection.power_of_choice.
    PowerOfChoice`: ``"uniform"``, the paper's (1/m) sum over the m chosen, or
    ``"examples"``) decides when the engine's ``weighting`` is its default ``"examples"``
    or the same as the policy's; any other engine weighting is refused (ValueError naming
    both and the fix). A policy without one (random, Oort, TiFL) leaves ``weighting`` as
    it is.
    """
    own = getattr(policy, "weighting", None)
    if own is None or weighting in ("examples", own):
        return own or weighting
    name = type(policy).__name__
    raise ValueError(
        f"{owner}: weighting={weighting!r} with selection {name}(weighting={own!r}): the "
        f"policy fixes how its chosen clients are averaged. Set it on the policy "
        f"({name}(weighting='uniform' or 'examples')) and leave the strategy's weighting "
        f"at 'examples'")


def warn_no_loss(policy: str, key: str, warned: bool, fallback: str) -> bool:
    """One WARNING (the first time) that client ``key`` reported no loss; returns True."""
    if not warned:
        log(WARNING, "%s selection: client %s reported no training loss (metrics '%s' or "
            "'%s'); such clients are %s. Report the mean training loss in the train "
            "reply's metrics", policy, key, C.TRAIN_LOSS, C.STOCK_TRAIN_LOSS, fallback)
    return True
