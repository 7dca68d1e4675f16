"""TiFL's tier-based selection (Chai et al., "TiFL: A Tier-based Federated Learning System",
HPDC 2020, Sec. 4: profiling and tiering; Algorithm 2: adaptive tier selection).

* Tiering (Sec. 4, profiling and tiering): the clients sorted by their expected round
  time on the simulated clock (eq. 1 of :mod:`strategies.engine.clock`; the paper profiles
  response latencies) and cut into ``tiers`` consecutive groups whose sizes differ by at
  most one, tier 0 the fastest: with K = q tiers + r, the r fastest tiers hold q + 1
  clients and the others q (10 clients in 3 tiers: 4/3/3). The paper groups clients of
  similar latency into m tiers and publishes no code; chunks of ceil(K / tiers) would
  leave the slowest tiers short or empty (10 in 3: 4/4/2; 7 in 5: 2/2/2/1/0).
* Each tier starts with ``credits`` credits (ceil(R / tiers) for a run of R rounds) and
  probability 1 / tiers. Every ``interval`` rounds the probabilities are recomputed
  (Alg. 2, ChangeProbs): the n tiers with credits left, sorted by accuracy ascending,
  get (n - j) / (n (n + 1) / 2) for j = 0..n-1 (the least accurate tier the most); a
  tier without credits gets 0.
* Per round a tier with credits is drawn with those probabilities, one of its credits
  spent, and m of its online clients drawn uniformly (fewer online: the rest from the
  other online clients, uniformly).

A tier's accuracy is the paper's per-tier test accuracy of the global model; here,
without a per-tier evaluation, it is the negative mean of its clients' last reported
training losses (a tier without any counts as least accurate). Clients that report no
loss are left out of that mean; the policy says so once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .policy import SelectionSection, Candidate, Choice, LossQuery, Outcome, warn_no_loss

__all__ = ["TiFLSelection", "change_probabilities", "make_tiers", "tier_sizes"]

TIFL_TAG = 0x71F  # rng stream of the tier and client draws
STATE_VERSION = 1


def tier_sizes(clients: int, tiers: int) -> list[int]:
    """Balanced tier sizes (module docstring): K = q tiers + r gives r tiers of q + 1, then
    tiers - r of q (the faster tiers the larger)."""
    q, r = divmod(clients, tiers)
    return [q + 1] * r + [q] * (tiers - r)


def make_tiers(seconds: Mapping[str, float], tiers: int) -> dict[str, int]:
    """Client key -> tier: sorted by time (ties by key), cut into :func:`tier_sizes`."""
    ordered = sorted(seconds, key=lambda k: (seconds[k], k))
    tier_of, start = {}, 0
    for tier, size in enumerate(tier_sizes(len(ordered), tiers)):
        tier_of.update((key, tier) for key in ordered[start:start + size])
        start += size
    return tier_of


def change_probabilities(accuracy: Sequence[float], credits: Sequence[int]) -> list[float]:
    """Alg. 2's ChangeProbs: tiers with credits, by accuracy ascending (ties by tier), get
    (n - j) / (n (n + 1) / 2); tiers without credits 0."""
    live = sorted((t for t in range(len(accuracy)) if credits[t] > 0),
                  key=lambda t: (accuracy[t], t))
    n = len(live)
    probabilities = [0.0] * len(accuracy)
    for j, tier in enumerate(live):
        probabilities[tier] = (n - j) / (n * (n + 1) / 2)
    return probabilities


class TiFLSelection:
    """TiFL (module docstring).

    Parameters
    ----------
    seed : int
        Draws from ``default_rng([seed, round, TIFL_TAG])``.
    tiers : int
        Number of tiers (5, the paper's setting).
    credits : int, optional
        Credits per tier (ceil(R / tiers) for R rounds; None: unlimited).
    interval : int, optional
        I, rounds between probability updates (default: ``tiers``).
    """

    name = "tifl"
    needs_clock = True
    queries_losses = False

    def __init__(self, seed: int = 0, tiers: int = 5, credits: int | None = None,
                 interval: int | None = None) -> None:
        for name, value in (("tiers", tiers), ("credits", credits), ("interval", interval)):
            if value is None and name != "tiers":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TiFLSelection: {name} must be a whole number >= 1, "
                                 f"got {value!r}")
        self.seed, self.num_tiers = int(seed), int(tiers)
        self.interval = int(interval or tiers)
        self.tier_of: dict[str, int] = {}
        self.tier_seconds: dict[str, float] = {}  # the expected times the tiers come from
        self.credits = [credits if credits is not None else -1] * self.num_tiers  # -1: no cap
        self.probabilities = [1.0 / self.num_tiers] * self.num_tiers
        self.losses: dict[str, float] = {}
        self.warned = False

    def tier_accuracy(self) -> list[float]:
        """Per tier, minus the mean last reported training loss (-inf: none reported)."""
        sums, counts = [0.0] * self.num_tiers, [0] * self.num_tiers
        for key, loss in self.losses.items():
            if key in self.tier_of:
                sums[self.tier_of[key]] += loss
                counts[self.tier_of[key]] += 1
        return [-sums[t] / counts[t] if counts[t] else -math.inf for t in range(self.num_tiers)]

    def choose(self, server_round: int, candidates: Sequence[Candidate], m: int,
               query: LossQuery | None) -> Choice:
        """Alg. 2: maybe new probabilities, a tier drawn among those with credits, m of its
        online clients."""
        new = {c.key: c.seconds for c in candidates if c.key not in self.tier_of}
        if any(s is None for s in new.values()):
            raise ValueError("TiFLSelection needs every client's expected time on the "
                             "simulated clock: give the participation model a clock")
        if new:  # tiers from the profiles, computed over every client seen so far
            times = {**self.tier_seconds, **new}
            self.tier_of = make_tiers(times, self.num_tiers)
            self.tier_seconds = times
        if server_round % self.interval == 0 and server_round > 1:
            self.probabilities = change_probabilities(
                self.tier_accuracy(), [1 if c != 0 else 0 for c in self.credits])
        rng = np.random.default_rng([self.seed, server_round, TIFL_TAG])
        live = [t for t in range(self.num_tiers) if self.credits[t] != 0]
        if not live:  # every credit spent: all tiers again, uniformly
            live = list(range(self.num_tiers))
        p = np.array([self.probabilities[t] for t in live], dtype=np.float64)
        p = p / p.sum() if p.sum() > 0 else np.full(len(live), 1.0 / len(live))
        tier = int(live[int(rng.choice(len(live), p=p))])
        if self.credits[tier] > 0:
            self.credits[tier] -= 1
        inside = [k for k, c in enumerate(candidates) if self.tier_of[c.key] == tier]
        m = min(m, len(candidates))
        chosen = sorted(int(i) for i in rng.choice(inside, size=min(m, len(inside)),
                                                   replace=False)) if inside else []
        if len(chosen) < m:
            taken = set(chosen)
            rest = [k for k in range(len(candidates)) if k not in taken]
            chosen += sorted(int(i) for i in rng.choice(rest, size=m - len(chosen),
                                                        replace=False))
        keys = [c.key for c in candidates]
        section = SelectionSection(
            policy=self.name, candidates=len(candidates), chosen=[keys[k] for k in chosen],
            tier=tier, probabilities=[float(v) for v in self.probabilities],
            credits=[int(c) for c in self.credits])
        return Choice({k: 1 for k in chosen}, section)

    def feedback(self, server_round: int, outcomes: Sequence[Outcome]) -> None:
        """Each accepted client's last training loss (its tier's accuracy)."""
        for o in outcomes:
            if o.loss is None:
                self.warned = warn_no_loss(self.name, o.key, self.warned,
                                           "left out of their tier's accuracy")
                continue
            self.losses[o.key] = float(o.loss)

    def state_dict(self) -> dict:
        """Tiers, credits, probabilities and the clients' last losses."""
        return {"tifl-state-version": STATE_VERSION, "tier-of": dict(self.tier_of),
                "tier-seconds": dict(self.tier_seconds), "credits": list(self.credits),
                "probabilities": list(self.probabilities), "losses": dict(self.losses)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`."""
        if state.get("tifl-state-version") != STATE_VERSION:
            raise ValueError(f"TiFLSelection: the checkpoint's selection state has version "
                             f"{state.get('tifl-state-version')!r}, not {STATE_VERSION}")
        self.tier_of = {str(k): int(v) for k, v in state["tier-of"].items()}
        self.tier_seconds = {str(k): float(v) for k, v in state["tier-seconds"].items()}
        self.credits = [int(c) for c in state["credits"]]
        self.probabilities = [float(p) for p in state["probabilities"]]
        self.losses = {str(k): float(v) for k, v in state["losses"].items()}
