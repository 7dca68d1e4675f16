"""Oort's participant selection (Lai et al., "Oort: Efficient Federated Learning via Guided
Participant Selection", OSDI 2021, Algorithm 1), on the simulated clock.

Per round R, for the online clients:

* statistical utility U_i = |B_i| sqrt(1/|B_i| sum_{k in B_i} Loss(k)^2) of the client's
  last round, B_i its trained samples. Stock clients report only the mean loss L_i and
  n_i, so U_i is taken as n_i L_i: the formula with every Loss(k) = L_i (a lower bound,
  since the root mean square is at least the mean);
* the utility of an explored client (Alg. 1 line 17, with the reference code's
  normalisation): Util(i) = (min(U_i, clip) - U_min) / (U_max - U_min)
  + sqrt(0.1 log R / L(i)), L(i) the last round it took part in (temporal uncertainty).
  U_min (x 0.999), U_max and the clip (the ``clip_bound`` quantile, outliers clipped) are
  taken, as the reference code's ``getTopK`` / ``get_norm`` do, over the reward of every
  online, not blacklisted client that has one > 0: an explored client's U_i and an
  unexplored client's initial reward, its size n_i (the code registers each client with
  reward min(size, samples trained per round), i.e. |B_i|; here n_i, the |B_i| of U_i);
* system utility (line 19): Util(i) *= (T / t_i)^alpha when t_i > T, t_i the client's
  clock time (eq. 1 of :mod:`strategies.engine.clock`), T the developer-preferred duration;
* the pacer (lines 12-14): every W rounds (R >= 2W), when the summed utility of the
  exploited clients over the last W rounds is within 10% of the W before, T is relaxed to
  the clock time ``pacer_delta`` percentile points higher in the fleet (the reference
  code's step); when it changed more than fivefold, tightened by as much;
* exploitation (lines 21-22): (1 - eps) m clients, drawn with probability proportional
  to Util among those above ``cut_off`` x the utility of the (1 - eps) m-th best;
* exploration (line 24): the other eps m among unexplored clients, drawn with
  probability proportional to n_i (x the system penalty) among the ``sample_window`` x
  eps m largest; slots left over (too few unexplored online) are filled uniformly among
  the other online clients. eps = max(eps_0 decay^R', eps_min), R' the policy's
  selection count (the paper's 0.9, 0.98, 0.2): the reference code decays eps before
  each selection (``self.exploration = max(self.exploration * decay, min)``), so the
  first uses 0.9 x 0.98 = 0.882. Once every client the policy has seen online has been
  explored, eps is 0 for the rest of the run (the code sets ``exploration`` and
  ``exploration_min`` to 0 when its unexplored set is empty), the leftover slots of
  that selection still filled uniformly;
* blacklisting (robustness): a client that took part more than ``blacklist_rounds``
  times is left out, at most ``blacklist_max_len`` of the clients (off by default, as in
  the reference code).

A client whose replies carry no training loss is treated as unexplored (drawn by n_i);
the policy says so once. Defaults: alpha = 2, W = 20 rounds, pacer step 5 percentile
points, clip at the 95th percentile, cut-off 0.95 (the paper's); the arithmetic follows
the authors' reference code (SymbioticLab/Oort, ``oort/oort.py``) where the paper leaves
it open.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .policy import SelectionSection, Candidate, Choice, LossQuery, Outcome, warn_no_loss

__all__ = ["OortSelection", "exploration_factor", "normalisation", "oort_utilities",
           "pacer_move", "preferred_after_pacer", "statistical_utility", "system_factor"]

OORT_TAG = 0x007  # rng stream of Oort's draws
STATE_VERSION = 2  # 2: "seen" and "exploration-over" (version 1 loads: see load_state_dict)


# ------------------------------------------------------------------ the formulas
def statistical_utility(num_examples: int, mean_loss: float) -> float:
    """U_i = |B_i| sqrt(mean Loss(k)^2) with every Loss(k) = the mean loss: n_i L_i."""
    return float(num_examples) * float(mean_loss)


def system_factor(preferred: float, seconds: float | None, alpha: float) -> float:
    """(T / t_i)^alpha when t_i > T, else 1 (Alg. 1 line 19)."""
    if seconds is None or not seconds > preferred:
        return 1.0
    return (preferred / max(seconds, 1e-4)) ** alpha


def exploration_factor(selections: int, start: float = 0.9, decay: float = 0.98,
                       minimum: float = 0.2) -> float:
    """eps of the ``selections``-th selection (1-based): max(start decay^n, minimum), the
    reference code's eps <- max(eps decay, minimum) applied before each selection."""
    return max(start * decay ** selections, minimum)


def pacer_move(history: Sequence[float], window: int, selections: int) -> int:
    """+1 (relax T), -1 (tighten) or 0 (Alg. 1 lines 12-14, the reference code's rule):
    every ``window`` selections from 2 ``window`` on, compare the summed exploited utility
    of the last ``window`` rounds with the ``window`` before."""
    if selections < 2 * window or selections % window != 0 or len(history) < 2 * window:
        return 0
    before = sum(history[-2 * window:-window])
    last = sum(history[-window:])
    if abs(last - before) <= 0.1 * before:
        return 1
    if abs(last - before) >= 5 * before:
        return -1
    return 0


def preferred_after_pacer(preferred: float, seconds: Sequence[float], move: int,
                          delta: float) -> float:
    """T moved ``move`` x ``delta`` percentile points within the clients' clock times."""
    if move == 0 or not seconds:
        return preferred
    ordered = sorted(seconds)
    at = 100.0 * sum(s <= preferred for s in ordered) / len(ordered)
    q = min(max(at + move * delta, 0.0), 100.0)
    return float(ordered[min(int(len(ordered) * q / 100.0), len(ordered) - 1)])


def normalisation(pool: Sequence[float], clip_bound: float) -> tuple[float, float, float]:
    """U_min x 0.999, max(U_max - that, 1e-4) and the clip (the ``clip_bound`` quantile,
    sorted[min(int(n clip_bound), n - 1)]) of the rewards in ``pool`` that are > 0 (the
    reference code's ``get_norm``); an empty pool gives (0, 1e-4, 0)."""
    u = np.sort(np.asarray([r for r in pool if r > 0], dtype=np.float64))
    if u.size == 0:
        return 0.0, 1e-4, 0.0
    low = float(u[0]) * 0.999
    return low, max(float(u[-1]) - low, 1e-4), float(u[min(int(u.size * clip_bound),
                                                           u.size - 1)])


def oort_utilities(rewards: Sequence[float], last_rounds: Sequence[int],
                   seconds: Sequence[float | None], server_round: int, preferred: float,
                   alpha: float, clip_bound: float, *, pool: Sequence[float]) -> np.ndarray:
    """Util(i) of explored clients (Alg. 1 lines 16-19; module docstring), normalised over
    ``pool``: the rewards of every online, not blacklisted client (explored: U_i,
    unexplored: n_i)."""
    u = np.asarray(rewards, dtype=np.float64)
    if u.size == 0:
        return u
    low, spread, clip = normalisation(pool, clip_bound)
    util = (np.minimum(u, clip) - low) / spread
    last = np.maximum(np.asarray(last_rounds, dtype=np.float64), 1.0)
    util += np.sqrt(0.1 * math.log(max(server_round, 1)) / last)
    return util * np.array([system_factor(preferred, s, alpha) for s in seconds])


def _draw(rng: np.random.Generator, pool: list[int], weights: np.ndarray, k: int) -> list[int]:
    """k of ``pool`` without replacement, probability proportional to ``weights``."""
    k = min(k, len(pool))
    if k <= 0:
        return []
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    if not w.sum() > 0 or np.count_nonzero(w) < k:
        w = np.ones(len(pool))
    picked = rng.choice(len(pool), size=k, replace=False, p=w / w.sum())
    return [pool[int(i)] for i in picked]


# ------------------------------------------------------------------ the policy
class OortSelection:
    """Oort's training selector (module docstring).

    Parameters
    ----------
    seed : int
        Draws from ``default_rng([seed, round, OORT_TAG])``.
    preferred_duration : float
        T in simulated seconds; 0: the median clock time of the first round's candidates.
    alpha : float
        Straggler penalty exponent (2).
    exploration, exploration_decay, exploration_min : float
        eps_0, its decay per selection and its floor (0.9, 0.98, 0.2).
    pacer_window : int
        W, rounds between pacer steps (20).
    pacer_delta : float
        Pacer step, in percentile points of the clients' clock times (5).
    clip_bound : float
        Quantile at which statistical utilities are clipped (0.95).
    cut_off : float
        c: exploitation admits clients above c x the cut-off utility (0.95).
    sample_window : float
        Exploration draws among the ``sample_window`` x eps m largest unexplored (5).
    blacklist_rounds : int
        Leave out clients that took part more than this many times (-1: never).
    blacklist_max_len : float
        Most clients blacklisted, as a fraction of those known (0.3).
    """

    name = "oort"
    needs_clock = True
    queries_losses = False

    def __init__(self, seed: int = 0, preferred_duration: float = 0.0, *, alpha: float = 2.0,
                 exploration: float = 0.9, exploration_decay: float = 0.98,
                 exploration_min: float = 0.2, pacer_window: int = 20,
                 pacer_delta: float = 5.0, clip_bound: float = 0.95, cut_off: float = 0.95,
                 sample_window: float = 5.0, blacklist_rounds: int = -1,
                 blacklist_max_len: float = 0.3) -> None:
        for name, value, low, high in (("preferred_duration", preferred_duration, 0, math.inf),
                                       ("alpha", alpha, 0, math.inf),
                                       ("exploration", exploration, 0, 1),
                                       ("exploration_decay", exploration_decay, 0, 1),
                                       ("exploration_min", exploration_min, 0, 1),
                                       ("pacer_delta", pacer_delta, 0, 100),
                                       ("clip_bound", clip_bound, 0, 1),
                                       ("cut_off", cut_off, 0, 1),
                                       ("sample_window", sample_window, 1, math.inf),
                                       ("blacklist_max_len", blacklist_max_len, 0, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (low <= value <= high) or math.isnan(value):
                raise ValueError(f"OortSelection: {name} must be a number in [{low}, {high}], "
                                 f"got {value!r}")
        if isinstance(pacer_window, bool) or not isinstance(pacer_window, int) \
                or pacer_window < 1:
            raise ValueError(f"OortSelection: pacer_window must be a whole number of rounds "
                             f">= 1, got {pacer_window!r}")
        self.seed, self.alpha = int(seed), float(alpha)
        self.exploration = (float(exploration), float(exploration_decay), float(exploration_min))
        self.pacer_window, self.pacer_delta = pacer_window, float(pacer_delta)
        self.clip_bound, self.cut_off = float(clip_bound), float(cut_off)
        self.sample_window = float(sample_window)
        self.blacklist_rounds, self.blacklist_max_len = int(blacklist_rounds), blacklist_max_len
        self.preferred = float(preferred_duration)  # 0: not set yet
        self.clients: dict[str, dict] = {}  # key -> reward, last-round, count, seconds
        self.seen: set[str] = set()  # every client that was ever a candidate
        self.exploration_over = False  # every client seen has been explored (eps = 0)
        self.selections = 0
        self.history: list[float] = []  # mean utility of the exploited clients, per round
        self.exploited: list[str] = []  # last round's exploited clients
        self.exploited_round = 0
        self.warned = False

    # ------------------------------------------------------------------ choose
    def choose(self, server_round: int, candidates: Sequence[Candidate], m: int,
               query: LossQuery | None) -> Choice:
        """Algorithm 1's SelectParticipant (module docstring)."""
        self.selections += 1
        keys = [c.key for c in candidates]
        seconds = [c.seconds for c in candidates]
        known = [s for s in seconds if s is not None]
        if self.preferred <= 0:
            self.preferred = float(np.median(known)) if known else math.inf
        self.history.append(self.exploited_utility())
        move = pacer_move(self.history, self.pacer_window, self.selections)
        self.preferred = preferred_after_pacer(self.preferred, known, move, self.pacer_delta)
        self.seen.update(keys)
        eps = 0.0 if self.exploration_over else \
            exploration_factor(self.selections, *self.exploration)
        blacklist = self.blacklist()
        rng = np.random.default_rng([self.seed, server_round, OORT_TAG])
        explored = [k for k, key in enumerate(keys)
                    if self.clients.get(key, {}).get("count", 0) > 0 and key not in blacklist]
        unexplored = [k for k, key in enumerate(keys) if key not in self.clients
                      or self.clients[key].get("count", 0) == 0]
        rewards = [self.clients[keys[k]]["reward"] for k in explored]
        util = oort_utilities(rewards, [self.clients[keys[k]]["last-round"] for k in explored],
                              [seconds[k] for k in explored], server_round, self.preferred,
                              self.alpha, self.clip_bound,
                              pool=rewards + [float(candidates[k].num_examples or 0)
                                              for k in unexplored])
        m = min(m, len(candidates))
        n_exploit = min(int(m * (1.0 - eps)), len(explored))
        exploit = []
        if n_exploit > 0:
            order = np.argsort(-util, kind="stable")
            cut = util[order[min(n_exploit, len(order) - 1)]] * self.cut_off
            admitted = [int(i) for i in order if util[i] >= cut]
            exploit = _draw(rng, [explored[i] for i in admitted], util[admitted], n_exploit)
        score = {explored[i]: float(util[i]) for i in range(len(explored))}
        n_explore = min(len(unexplored), m - len(exploit))
        reward = np.array([float(candidates[k].num_examples or 1)
                           * system_factor(self.preferred, seconds[k], self.alpha)
                           for k in unexplored])
        top = np.argsort(-reward, kind="stable")[
            :min(int(self.sample_window * n_explore), len(unexplored))]
        picked = _draw(rng, [int(i) for i in top], reward[top], n_explore)
        explore = [unexplored[i] for i in picked]
        score.update({unexplored[i]: float(reward[i]) for i in picked})
        if not any(self.clients.get(key, {}).get("count", 0) == 0 for key in self.seen):
            self.exploration_over = True  # from the next selection on, eps = 0
        chosen = exploit + explore
        taken = set(chosen)
        rest = [k for k in range(len(candidates)) if k not in taken and keys[k] not in blacklist]
        chosen += _draw(rng, rest, np.ones(len(rest)), m - len(chosen))
        self.exploited, self.exploited_round = [keys[k] for k in exploit], int(server_round)
        section = SelectionSection(
            policy=self.name, candidates=len(candidates), chosen=[keys[k] for k in chosen],
            scores={keys[k]: score[k] for k in chosen if k in score}, epsilon=eps,
            preferred_seconds=self.preferred if math.isfinite(self.preferred) else None,
            explored=len(explore), blacklisted=len(blacklist))
        return Choice({k: 1 for k in chosen}, section)

    def exploited_utility(self) -> float:
        """Mean statistical utility of last round's exploited clients that reported in that
        round (the reference code's pacer input)."""
        rewards = [self.clients[k]["reward"] for k in self.exploited
                   if self.clients.get(k, {}).get("last-round") == self.exploited_round]
        return float(sum(rewards) / (len(rewards) + 1e-4))

    def blacklist(self) -> set[str]:
        """Clients that took part more than ``blacklist_rounds`` times (most first), at most
        ``blacklist_max_len`` of the known clients."""
        if self.blacklist_rounds < 0:
            return set()
        over = sorted((k for k, v in self.clients.items() if v["count"] > self.blacklist_rounds),
                      key=lambda k: (-self.clients[k]["count"], k))
        return set(over[:int(self.blacklist_max_len * len(self.clients))])

    # ------------------------------------------------------------------ feedback
    def feedback(self, server_round: int, outcomes: Sequence[Outcome]) -> None:
        """U_i, L(i) and t_i of the clients with an accepted reply."""
        for o in outcomes:
            if o.loss is None or not o.num_examples:
                self.warned = warn_no_loss(self.name, o.key, self.warned,
                                           "treated as unexplored (drawn by data size)")
                continue
            entry = self.clients.setdefault(o.key, {"count": 0})
            entry.update({"reward": statistical_utility(o.num_examples, o.loss),
                          "last-round": int(server_round), "count": entry["count"] + 1,
                          "seconds": o.seconds})

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """T, the selection count, the pacer's history, the per-client table, the clients
        seen and whether exploration is over."""
        return {"oort-state-version": STATE_VERSION, "preferred": self.preferred,
                "selections": self.selections, "history": list(self.history),
                "exploited": list(self.exploited), "exploited-round": self.exploited_round,
                "clients": {k: dict(v) for k, v in self.clients.items()},
                "seen": sorted(self.seen), "exploration-over": self.exploration_over}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`; a version-1 state (before the clients seen were
        kept) takes the explored clients as those seen and exploration as not over."""
        version = state.get("oort-state-version")
        if version not in (1, STATE_VERSION):
            raise ValueError(f"OortSelection: the checkpoint's selection state has version "
                             f"{version!r}, not {STATE_VERSION} (or 1)")
        self.preferred = float(state["preferred"])
        self.selections = int(state["selections"])
        self.history = [float(v) for v in state["history"]]
        self.exploited = [str(k) for k in state["exploited"]]
        self.exploited_round = int(state["exploited-round"])
        self.clients = {str(k): dict(v) for k, v in state["clients"].items()}
        self.seen = set(self.clients) | {str(k) for k in state.get("seen", ())}
        self.exploration_over = bool(state.get("exploration-over", False))
