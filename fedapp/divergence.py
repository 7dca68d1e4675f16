"""Divergence of a run: its test loss turns non-finite or grows tenfold over its best so far.

:func:`divergence` is the check on one evaluated round; :class:`DivergenceWatch` applies it to
a run's round records (``loss``, :data:`strategies.contract.LOG_LOSS`) and says so once per
run, with the likely cause (:func:`likely_cause`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from strategies import contract as C

GROWTH = 10.0  # a loss this many times its best so far is divergence
SERVER_STEP_STRATEGIES = frozenset({"fedavgm", "fedadam", "fedyogi", "fedadagrad", "scaffold"})
ALREADY_EXCLUDED = ("It is not a malformed or non-finite client reply: the trust gate "
                    "refuses those before aggregation")


def divergence(loss: float, best: float | None) -> str | None:
    """What is wrong with test loss ``loss`` given the run's best (lowest) loss before it:
    non-finite, or more than ``GROWTH`` times ``best``; None when neither."""
    if not math.isfinite(loss):
        return f"test loss is {loss}"
    if best is not None and best > 0 and loss > GROWTH * best:
        return f"test loss {loss:.4g} is {loss / best:.0f}x its best so far ({best:.4g})"
    return None


def likely_cause(strategy: str, lr: float, server_lr: float = 1.0,
                 cut_work: bool = False) -> str:
    """The most likely cause of a diverging ``strategy`` run and what to try: the learning
    rate, the server step, or (FedNova with clients cut short by a deadline or as
    stragglers, ``cut_work``) tau_eff scaling short work up."""
    causes = [f"the learning rate is too high (lr = {lr:g}; lower it)"]
    if strategy in SERVER_STEP_STRATEGIES:
        causes.append(f"the server step is too large (server-lr = {server_lr:g})")
    if strategy == "fednova" and cut_work:
        causes.insert(0, "FedNova scales the normalised updates by tau_eff (Wang et al. "
                         "eq. 7), extrapolating the short work of clients the deadline or "
                         "straggler-fraction cut (lower lr or give them more time)")
    return "; or ".join(causes) + f". {ALREADY_EXCLUDED}"


class DivergenceWatch:
    """Follows a run's evaluated rounds: :meth:`check` reports the first divergence of the
    run, :meth:`warning` makes it the one log line, with the likely cause."""

    def __init__(self, cause: str = "") -> None:
        self.cause = cause
        self.best: float | None = None
        self.best_round: int | None = None
        self.found: str | None = None

    def check(self, record: Mapping[str, object]) -> str | None:
        """What diverged, naming the round and the values, when ``record``'s loss shows it
        for the first time in this run; None otherwise (rounds without a numeric loss are
        passed over)."""
        loss = record.get(C.LOG_LOSS)
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            return None
        loss = float(loss)
        what = divergence(loss, self.best)
        found = None
        if what is not None and self.found is None:
            best = "" if self.best_round is None else f", best in round {self.best_round}"
            found = self.found = f"round {record.get(C.LOG_ROUND)}: {what}{best}"
        if math.isfinite(loss) and (self.best is None or loss < self.best):
            self.best, self.best_round = loss, record.get(C.LOG_ROUND)
        return found

    def warning(self, found: str) -> str:
        """The log line of a divergence :meth:`check` found."""
        return f"The run is diverging: {found}. Likely cause: {self.cause}"
