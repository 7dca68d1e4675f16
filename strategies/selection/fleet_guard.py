"""What an informed selection policy may believe of a client's own reports.

Oort ranks by n_i L_i, Power-of-Choice by the loss a candidate answers and draws its
candidates by n_k, TiFL by its tiers' reported losses: every one of those numbers comes
from the client. A client that reports a training loss of 1e9 and 4,194,304 examples
would be chosen nearly every round (and its model with it). :class:`FleetGuard` stands
between the participation model and the policy:

* **Bounded reports.** A reported size is capped at ``size_factor`` x the fleet's median
  size (the client-info answers of every known client), a reported loss at
  ``loss_factor`` x the median of the fleet's last losses (each client's last bounded
  report, and the other answers of the same query). The median is the lower one
  (``sorted(v)[(n - 1) // 2]``), so one liar among three or more moves it by at most one
  rank. Honest reports within the bound are passed unchanged.
* **A fair-share quota.** A candidate earns m / K of a selection each round it is online
  (m chosen of K candidates); one whose selections would exceed ``share_factor`` x its
  earned share + 1 sits the round out, unless that leaves fewer than m candidates. With
  the default 1.5, no client is chosen more than 1.5 times its fair share plus one,
  whatever it reports (a liar at the cap is then chosen at most about twice as often as
  the honest clients' mean). This is a trade: a policy's preference for one honest client
  is capped the same way (Oort's exploitation and Power-of-Choice's largest losses pick
  among those within their share). ``FleetGuard(0, 0, 0)`` is the policies as published.

Its state (sizes, last losses, selections, earned shares) goes into the participation
model's checkpointed state, so a resumed run chooses as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from .policy import Candidate, Outcome

__all__ = ["FleetGuard", "capped", "fleet_median"]

SIZE_FACTOR = 4.0
LOSS_FACTOR = 4.0
SHARE_FACTOR = 1.5


def fleet_median(values: Sequence[float]) -> float | None:
    """The lower median of ``values`` (None when there are none)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def capped(value: float | None, median: float | None, factor: float) -> float | None:
    """``value`` at most ``factor`` x ``median`` (unchanged when either is unknown)."""
    if value is None or median is None or factor <= 0:
        return value
    return min(value, factor * median)


def _check_factor(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value == 0 or 1 <= value < math.inf):
        raise ValueError(f"FleetGuard: {name} must be 0 (off) or a number >= 1, got {value!r}")
    return float(value)


class FleetGuard:
    """Bounds on self-reports and a fair-share quota (module docstring).

    Parameters
    ----------
    size_factor, loss_factor : float
        Caps as multiples of the fleet's median size and loss (4; 0: no cap).
    share_factor : float
        Most selections as a multiple of a client's earned fair share, plus one (1.5;
        0: no quota).
    """

    def __init__(self, size_factor: float = SIZE_FACTOR, loss_factor: float = LOSS_FACTOR,
                 share_factor: float = SHARE_FACTOR) -> None:
        self.size_factor = _check_factor("size_factor", size_factor)
        self.loss_factor = _check_factor("loss_factor", loss_factor)
        self.share_factor = _check_factor("share_factor", share_factor)
        self.sizes: dict[str, int] = {}  # key -> reported n_k (client-info answer)
        self.losses: dict[str, float] = {}  # key -> last bounded loss
        self.chosen: dict[str, int] = {}
        self.earned: dict[str, float] = {}

    # ------------------------------------------------------------------ bounded reports
    def candidates(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """``candidates`` with their sizes capped against the fleet's."""
        self.sizes.update({c.key: c.num_examples for c in candidates if c.num_examples})
        median = fleet_median(list(self.sizes.values()))
        return [dataclasses.replace(c, num_examples=self.size(c.num_examples, median))
                for c in candidates]

    def size(self, n: int | None, median: float | None) -> int | None:
        bounded = capped(n, median, self.size_factor)
        return None if bounded is None else max(int(bounded), 1)

    def answers(self, keys: Mapping[int, str], losses: Mapping[int, float | None]
                ) -> dict[int, float | None]:
        """A loss query's answers (position -> loss) capped against the fleet's last losses
        and the other answers."""
        known = {**self.losses, **{keys[k]: v for k, v in losses.items() if v is not None}}
        median = fleet_median(list(known.values()))
        return {k: capped(v, median, self.loss_factor) for k, v in losses.items()}

    def outcomes(self, outcomes: Sequence[Outcome]) -> list[Outcome]:
        """A round's accepted replies with loss and size capped; their losses remembered."""
        known = {**self.losses, **{o.key: o.loss for o in outcomes if o.loss is not None}}
        loss_median = fleet_median(list(known.values()))
        size_median = fleet_median(list(self.sizes.values()))
        bounded = [dataclasses.replace(o, loss=capped(o.loss, loss_median, self.loss_factor),
                                       num_examples=self.size(o.num_examples, size_median))
                   for o in outcomes]
        self.losses.update({o.key: o.loss for o in bounded if o.loss is not None})
        return bounded

    # ------------------------------------------------------------------ quota
    def eligible(self, keys: Sequence[str], m: int) -> list[int]:
        """Positions of ``keys`` within their quota this round (every position when fewer
        than m are)."""
        every = list(range(len(keys)))
        if self.share_factor == 0 or not keys:
            return every
        share = min(m, len(keys)) / len(keys)
        within = [k for k in every if self.chosen.get(keys[k], 0) + 1
                  <= self.share_factor * (self.earned.get(keys[k], 0.0) + share) + 1]
        return within if len(within) >= min(m, len(keys)) else every

    def record(self, keys: Sequence[str], chosen: Sequence[str], m: int) -> None:
        """The round's candidates earn m / K each; the chosen spend one."""
        if not keys:
            return
        share = min(m, len(keys)) / len(keys)
        for key in keys:
            self.earned[key] = self.earned.get(key, 0.0) + share
        for key in chosen:
            self.chosen[key] = self.chosen.get(key, 0) + 1

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"sizes": dict(self.sizes), "losses": dict(self.losses),
                "chosen": dict(self.chosen), "earned": dict(self.earned)}

    def load_state_dict(self, state: Mapping) -> None:
        self.sizes = {str(k): int(v) for k, v in state["sizes"].items()}
        self.losses = {str(k): float(v) for k, v in state["losses"].items()}
        self.chosen = {str(k): int(v) for k, v in state["chosen"].items()}
        self.earned = {str(k): float(v) for k, v in state["earned"].items()}
