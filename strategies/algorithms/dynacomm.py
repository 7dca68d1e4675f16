"""DynaComm: choose DynamicFL's high-frequency group (Le et al., DynamicFL, Alg. 1 l. 22-37).

Pure numpy, no Flower types. Clients are positions ``0..n-1`` in the round's active
list; the caller maps them back to node ids.

The problem (paper Eq. 5): among the active clients M^t, find the group z that
minimises

    D_KL[ p(y_z) || p(Y) ],   p_z(c) = sum_{m in z} n_{m,c} / sum_{m in z} |D_m|   (Eq. 1)

subject to every member affording high-frequency communication
(kappa_m = 2 |W| nu_high <= tau_m) and the server budget
(kappa_g = sum_{m in M^t} 2 |W| nu_m <= tau_g, Eq. 2).

Which global distribution p(Y)
-------------------------------
The paper defines Y = U_{m in M} y_m over ALL M clients (Sec. 3.1), and the official
code uses the class counts of the whole training set; every sample belongs to some
client, so p(Y) is the normalised sum of ALL clients' label histograms, not of the
active ones (:func:`global_label_distribution`). The server therefore collects every
client's histogram once (the ``label-counts`` query), not only the sampled ones'.

KL conventions
--------------
D_KL(p || q) = sum_c p(c) log(p(c) / q(c)) in nats; classes with p(c) = 0 add 0
(scipy's ``rel_entr``); a class with p(c) > 0 and q(c) = 0 makes it +inf. A subset
holding no examples at all has KL +inf (it cannot be chosen).

Budgets (the server constraint is a cap on |z|)
-----------------------------------------------
With one model size |W| for everybody, kappa_g(z) = 2|W| (n nu_low + |z| (nu_high - nu_low))
grows with |z| only, so kappa_g(z) <= tau_g  <=>  |z| <= k_max with
k_max = floor((tau_g / 2|W| - n nu_low) / (nu_high - nu_low)) (:func:`cap_from_server_budget`).
Both solvers therefore take a boolean ``eligible`` per client and an integer ``k_max``;
:func:`constraints` builds them for the three budget modes:

* ``"fix"``     (Fix-beta): ceil(beta M) "rich" clients drawn once, seeded
                (:func:`fix_beta_rich`); eligible = rich; no server cap (k_max = n).
* ``"dynamic"`` (Dynamic-beta): everyone eligible; k_max = floor(beta |M^t|).
* ``"budget"``  real byte budgets: eligible iff 2|W| nu_high <= tau_m (``comm-budget``,
                bytes per round; a client that reported none is unconstrained); k_max from
                the server's tau_g in bytes per round (None: no server cap).
* ``"none"``    everyone eligible, no cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BUDGET_MODES = ("none", "fix", "dynamic", "budget")
N_ENS = 10  # DynaComm ensemble repetitions (eta_ens; official code ``dp_ensemble_times``)
_EPS = 1e-9  # float guard: 0.3 * 100 = 30.000000000000004 must not ceil to 31


@dataclass(frozen=True)
class Selection:
    """A chosen high-frequency group.

    Attributes
    ----------
    members : tuple[int, ...]
        Positions of the chosen clients in the active list, ascending; may be empty
        (no feasible client: everybody runs at the low frequency).
    kl : float
        D_KL(p_z || p_global) of the group; +inf for the empty group.
    """

    members: tuple[int, ...]
    kl: float

    @property
    def size(self) -> int:
        return len(self.members)


# ------------------------------------------------------------------ distributions
def label_distribution(counts: Sequence[float]) -> np.ndarray:
    """p(c) = n_c / sum_c n_c for one label histogram."""
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 1 or np.any(arr < 0) or not np.isfinite(arr).all():
        raise ValueError(f"a label histogram must be a 1-d vector of counts >= 0, "
                         f"got {arr.tolist()}")
    total = arr.sum()
    if total <= 0:
        raise ValueError("a label histogram with no examples has no distribution")
    return arr / total


def global_label_distribution(all_counts: Sequence[Sequence[float]]) -> np.ndarray:
    """p(Y): the normalised sum of ALL M clients' label histograms (rows), paper Sec. 3.1.

    Pass every client's histogram, not only the active ones' (see the module docstring).
    """
    arr = _counts_matrix(all_counts)
    return label_distribution(arr.sum(axis=0))


def kl_divergence(p: Sequence[float], q: Sequence[float]) -> float:
    """D_KL(p || q) = sum_{c: p(c) > 0} p(c) log(p(c) / q(c)), natural log;
    +inf if q(c) = 0 < p(c)."""
    p_arr = np.asarray(p, dtype=np.float64)
    q_arr = np.asarray(q, dtype=np.float64)
    if p_arr.shape != q_arr.shape:
        raise ValueError(f"p has {p_arr.shape} classes but q has {q_arr.shape}")
    mask = p_arr > 0
    if np.any(q_arr[mask] <= 0):
        return math.inf
    return float(np.sum(p_arr[mask] * np.log(p_arr[mask] / q_arr[mask])))


def pooled_kl(counts: Sequence[Sequence[float]], members: Sequence[int],
              q: Sequence[float]) -> float:
    """KL of the pooled histogram of ``members`` (Eq. 1) to q; +inf for no examples / no members."""
    arr = _counts_matrix(counts)
    if len(members) == 0:
        return math.inf
    return _kl_of_sum(arr[list(members)].sum(axis=0), np.asarray(q, dtype=np.float64))


def _kl_of_sum(summed: np.ndarray, q: np.ndarray) -> float:
    total = summed.sum()
    if total <= 0:
        return math.inf
    return kl_divergence(summed / total, q)


# ------------------------------------------------------------------ solvers
def dynacomm(
    counts: Sequence[Sequence[float]],
    q: Sequence[float],
    *,
    eligible: Sequence[bool] | None = None,
    k_max: int | None = None,
    n_ens: int = N_ENS,
    rng: np.random.Generator | int | Sequence[int] | None = None,
    min_size: int = 1,
) -> Selection:
    """DynaComm: the ensemble dynamic program of Alg. 1 (lines 22-37).

    For each of ``n_ens`` random orderings of the active clients, fill the table
    O[i][j] = best group of size j among the first i clients of the ordering, where a
    cell either keeps O[i-1][j] (skip client i) or extends O[i-1][j-1] by client i if
    that client is eligible, the group stays within ``k_max`` and its KL is lower.
    The answer is the lowest-KL cell over every size and every ordering: the group is
    NOT forced to fill the budget (paper l. 34, official code). Not exact, since KL is
    not additive; the tests compare it with an exact enumeration.

    Parameters
    ----------
    counts : (n, C) array-like
        Label histograms of the n active clients (rows).
    q : (C,) array-like
        Global label distribution (:func:`global_label_distribution`).
    eligible : (n,) bool, optional
        Client budget allows the high frequency; default all True.
    k_max : int, optional
        Server cap on |z|; default n (no cap).
    n_ens : int
        Random orderings (10 in the official code).
    rng : Generator or seed
        Source of the orderings; pass ``[seed, round]`` for a reproducible run.
    min_size : int
        Smallest group counted (1 as in the paper; 2 rules out degenerate singletons).

    Returns
    -------
    Selection
        Ascending positions and the group's KL; empty with KL = inf when no group of
        at least ``min_size`` eligible clients fits under ``k_max``.
    """
    arr, q_arr, ok, cap = checked_inputs(counts, q, eligible, k_max)
    if n_ens < 1:
        raise ValueError(f"n_ens must be >= 1, got {n_ens}")
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n = arr.shape[0]
    best_kl, best_members = math.inf, ()
    for _ in range(n_ens):
        order = generator.permutation(n)
        # prev[j] = (kl, members, pooled counts) of the best size-j group so far
        prev: list[tuple[float, tuple[int, ...], np.ndarray | None]]
        prev = [(math.inf, (), None)] * (n + 1)
        for i in range(1, n + 1):
            client = int(order[i - 1])
            row = list(prev)  # option 1: skip the client
            if ok[client]:
                for j in range(1, min(i, cap) + 1):
                    p_kl, p_members, p_sum = prev[j - 1]
                    if j > 1 and not p_members:  # no valid (j-1)-group to extend
                        continue
                    summed = arr[client] if j == 1 else p_sum + arr[client]
                    d = _kl_of_sum(summed, q_arr)
                    if d < row[j][0]:
                        row[j] = (d, p_members + (client,), summed)
            prev = row
        for j in range(max(min_size, 1), n + 1):
            if prev[j][0] < best_kl:
                best_kl, best_members = prev[j][0], prev[j][1]
    return Selection(tuple(sorted(best_members)), best_kl)


def _counts_matrix(counts: Sequence[Sequence[float]]) -> np.ndarray:
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 2 or np.any(arr < 0) or not np.isfinite(arr).all():
        raise ValueError(f"label counts must be an (n clients, C classes) array of counts >= 0, "
                         f"got shape {arr.shape}")
    return arr


def checked_inputs(counts, q, eligible, k_max) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The label-count matrix, q, the eligibility mask and the size cap, checked."""
    arr = _counts_matrix(counts)
    n, num_classes = arr.shape
    q_arr = np.asarray(q, dtype=np.float64)
    if (q_arr.shape != (num_classes,) or np.any(q_arr < 0)
            or not math.isclose(q_arr.sum(), 1.0, abs_tol=1e-6)):
        raise ValueError(f"q must be a distribution over the {num_classes} classes, "
                         f"got {q_arr.tolist()}")
    ok = np.ones(n, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    if ok.shape != (n,):
        raise ValueError(f"eligible has {ok.shape} entries for {n} clients")
    cap = n if k_max is None else int(k_max)
    if cap < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    return arr, q_arr, ok, min(cap, n)


# ------------------------------------------------------------------ budgets
def num_rich(beta: float, num_clients: int) -> int:
    """ceil(beta M) rich clients under Fix-beta (official code), float-safe."""
    _check_beta(beta)
    return min(int(math.ceil(beta * num_clients - _EPS)), num_clients)


def fix_beta_rich(num_clients: int, beta: float, seed: int | Sequence[int]) -> np.ndarray:
    """Fix-beta: the ceil(beta M) clients (positions 0..M-1, ascending) allowed the high
    frequency, drawn ONCE at the start with ``default_rng(seed)`` and kept for the run."""
    k = num_rich(beta, num_clients)
    return np.sort(np.random.default_rng(seed).choice(num_clients, size=k, replace=False))


def dynamic_beta_cap(beta: float, num_active: int) -> int:
    """Dynamic-beta: k_max = floor(beta |M^t|) (official code: int(10 * 0.3) = 3), float-safe."""
    _check_beta(beta)
    return min(int(math.floor(beta * num_active + _EPS)), num_active)


def client_cost(nu: int, model_bytes: float) -> float:
    """kappa_m = 2 |W| nu_m bytes per round (Eq. 2: one upload + one download per sync)."""
    return 2.0 * float(model_bytes) * int(nu)


def server_cost(group_size: int, num_active: int, nu_high: int, nu_low: int,
                model_bytes: float) -> float:
    """kappa_g = sum_m 2|W| nu_m = 2|W| (|z| nu_high + (n - |z|) nu_low) (Eq. 2)."""
    if not 0 <= group_size <= num_active:
        raise ValueError(f"group_size {group_size} must be in 0..{num_active}")
    return (client_cost(nu_high, model_bytes) * group_size
            + client_cost(nu_low, model_bytes) * (num_active - group_size))


def server_budget_for_cap(k_max: int, num_active: int, nu_high: int, nu_low: int,
                          model_bytes: float) -> float:
    """The tau_g of Eq. 5 that allows exactly ``k_max`` high-frequency clients (kappa_g(k_max))."""
    return server_cost(k_max, num_active, nu_high, nu_low, model_bytes)


def cap_from_server_budget(
    tau_g: float | None, num_active: int, nu_high: int, nu_low: int, model_bytes: float
) -> int:
    """Largest |z| with kappa_g(z) <= tau_g (Eq. 5's server constraint as a cap on |z|).

    ``None`` (no server budget) gives n. If even the all-low schedule exceeds tau_g no
    group is feasible and 0 is returned (the round still runs all-low: every client
    must sync at step L); callers should warn, see :func:`server_cost`.
    """
    if tau_g is None:
        return num_active
    if nu_high <= nu_low:  # the group does not change the cost
        fits = server_cost(0, num_active, nu_high, nu_low, model_bytes) <= tau_g
        return num_active if fits else 0
    base = server_cost(0, num_active, nu_high, nu_low, model_bytes)
    if base > tau_g:
        return 0
    extra = client_cost(nu_high, model_bytes) - client_cost(nu_low, model_bytes)
    return min(int(math.floor((tau_g - base) / extra + _EPS)), num_active)


def eligible_by_budget(budgets: Sequence[float | None], nu_high: int,
                       model_bytes: float) -> np.ndarray:
    """Client constraint of Eq. 5: tau_m >= 2 |W| nu_high; None / NaN (no report) means
    unconstrained."""
    need = client_cost(nu_high, model_bytes)
    return np.array([b is None or (isinstance(b, float) and math.isnan(b)) or float(b) >= need
                     for b in budgets], dtype=bool)


@dataclass(frozen=True)
class Constraints:
    """What DynaComm gets: per active client ``eligible`` and the server cap ``k_max``."""

    eligible: np.ndarray
    k_max: int


def constraints(
    mode: str,
    num_active: int,
    *,
    beta: float = 1.0,
    rich: Sequence[bool] | None = None,
    budgets: Sequence[float | None] | None = None,
    server_budget: float | None = None,
    nu_high: int = 1,
    nu_low: int = 1,
    model_bytes: float = 1.0,
) -> Constraints:
    """Eligibility and cap of one round, per budget mode (see the module docstring).

    Parameters
    ----------
    mode : {"none", "fix", "dynamic", "budget"}
    num_active : int
        |M^t|.
    beta : float
        Budget level of ``"dynamic"`` (Fix-beta's beta is used by :func:`fix_beta_rich`).
    rich : (n,) bool
        ``"fix"``: whether each active client is one of the Fix-beta rich clients.
    budgets : (n,) bytes per round or None
        ``"budget"``: tau_m of each active client (``comm-budget``).
    server_budget : float, optional
        ``"budget"``: tau_g in bytes per round (None: no server cap).
    nu_high, nu_low, model_bytes
        Syncs per round of the two groups and |W| in bytes, for the byte budgets.
    """
    if mode == "none":
        return Constraints(np.ones(num_active, dtype=bool), num_active)
    if mode == "fix":
        if rich is None or len(rich) != num_active:
            raise ValueError("budget mode 'fix' needs `rich`, one bool per active client "
                             "(from fix_beta_rich, drawn once per run)")
        return Constraints(np.asarray(rich, dtype=bool), num_active)
    if mode == "dynamic":
        return Constraints(np.ones(num_active, dtype=bool), dynamic_beta_cap(beta, num_active))
    if mode == "budget":
        tau = [None] * num_active if budgets is None else list(budgets)
        if len(tau) != num_active:
            raise ValueError(f"{len(tau)} client budgets for {num_active} active clients")
        return Constraints(eligible_by_budget(tau, nu_high, model_bytes),
                           cap_from_server_budget(server_budget, num_active, nu_high, nu_low,
                                                  model_bytes))
    raise ValueError(f"budget mode {mode!r} is not known; use one of {', '.join(BUDGET_MODES)}")


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
