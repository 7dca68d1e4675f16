"""Byzantine-robust aggregation: a component the engines are given, not an algorithm.

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", ICML 2018 (arXiv:1803.01498), Sec. 3:

* Definition 1, coordinate-wise median: g = med{x^i : i in [m]}, g_k = med{x^i_k : i in [m]},
  med the one-dimensional median (of an even number of values: the mean of the two middle
  ones, numpy's convention; the paper does not fix it);
* Definition 2, coordinate-wise beta-trimmed mean, beta in [0, 1/2):
  g_k = 1 / ((1 - 2 beta) m) sum_{x in U_k} x, U_k the x^i_k without the largest and the
  smallest beta fraction. The paper takes beta m whole; here b = floor(beta m) values leave
  each end (beta taken as the decimal it prints as: 0.29 of 100 is 29) and g_k is the mean
  of the m - 2b left (= the paper's g_k when beta m is whole). Its guarantee needs beta at
  least the fraction of Byzantine machines: b >= 1 to outvote one liar.

Both are unweighted: every value counts once, so a client's self-reported ``num-examples``
has no say (the FedAvg weightings are not used). In the FedAvg family the statistic replaces
the weighted sum of the client updates Delta_k = w_k - w_t (Algorithm 1's Option I / II,
with the updates as the x^i):

    w_{t+1} = w_t + eta_g R({Delta_k}),   R = median or trimmed mean, coordinate-wise,

the same server step as the family's w_t + eta_g sum_k c_k Delta_k
(:mod:`strategies.engine.averaging`). With eta_g = 1 it is R of the client models (both
statistics commute with a shift). FedBuff's buffer takes R of its K staleness-weighted
updates s(tau_k) Delta_k in place of their mean (:class:`RobustBuffer`).

NaN marks a value that is not there: an entry a client's sub-model does not hold
(HeteroFL, FjORD, FedRolex), so each entry's statistic is over its own h_k holders (b =
floor(beta h_k)) and an entry no one holds keeps w_t. A client's own NaN / Inf never gets
here: such replies are refused first.

Memory: the statistic needs all m values of a coordinate at once. Whole models are
processed :data:`~strategies.engine.averaging.BLOCK` coordinates at a time (an m x BLOCK
float64 scratch) from the replies' own read-only views, which the engine holds anyway;
sub-models stack m copies of one array at a time (m x that array's size, float64).
Pure numpy: :func:`coordinate_median` and :func:`coordinate_trimmed_mean` are what the
engines run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from logging import WARNING
from typing import ClassVar

import numpy as np
from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged
from .averaging import BLOCK

__all__ = ["ClientDelta", "MIN_VALUES", "Median", "ROBUST_RULES", "RobustBuffer", "RobustRule",
           "RobustSection", "TrimmedMean", "as_robust", "coordinate_median",
           "coordinate_trimmed_mean", "robust_delta", "robust_rule", "robust_update", "section",
           "trim_count"]

NDArrays = dict[str, np.ndarray]
ROBUST_RULES = ("none", "median", "trimmed-mean")
"""The run config's ``robust-aggregation`` values (``none``: the weighted average)."""
MIN_VALUES = 3  # below this no single value can be outvoted (the median of 2 is their mean)


# ----------------------------------------------------------------- the statistics
def trim_count(beta: float, count: int) -> int:
    """b = floor(beta m): values removed at each end of m (beta as the decimal it prints as,
    so no float rounding moves the floor: 0.29 of 100 is 29, not 28)."""
    return math.floor(Fraction(repr(float(beta))) * int(count))


def _ordered(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column of the (m, n) ``values`` sorted ascending (NaN, "not there", last) and
    h, how many values each column has."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] < 1:
        raise ValueError(f"values must be an (m, n) array with m >= 1, got shape {values.shape}")
    return np.sort(values, axis=0), np.count_nonzero(~np.isnan(values), axis=0)


def coordinate_median(values: np.ndarray) -> np.ndarray:
    """Yin et al. 2018, Definition 1, over axis 0 of an (m, n) array: g_k = med of column
    k's values present (NaN = not there); the mean of the two middle ones for an even
    count, formed as 0.5 a + 0.5 b (no overflow, exact when a = b); NaN where none."""
    ordered, present = _ordered(values)
    low = np.take_along_axis(ordered, np.maximum(present - 1, 0)[None] // 2, axis=0)[0]
    high = np.take_along_axis(ordered, (present // 2)[None], axis=0)[0]
    median = 0.5 * low + 0.5 * high
    median[present == 0] = np.nan
    return median


def coordinate_trimmed_mean(values: np.ndarray, beta: float) -> np.ndarray:
    """Yin et al. 2018, Definition 2, over axis 0 of an (m, n) array: per column, the mean
    of its h values present (NaN = not there) without the b = floor(beta h) smallest and b
    largest (:func:`trim_count`); NaN where none. ``beta`` in [0, 1/2)."""
    _check_beta(beta)
    ordered, present = _ordered(values)
    trims = np.array([trim_count(beta, h) for h in range(ordered.shape[0] + 1)])[present]
    rank = np.arange(ordered.shape[0])[:, None]
    kept = (rank >= trims) & (rank < present - trims)
    total = np.sum(np.where(kept, ordered, 0.0), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / (present - 2 * trims)
    mean[present == 0] = np.nan
    return mean


def _check_beta(beta: object) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 0.5:
        raise ValueError(f"the trimmed mean's beta must be a number in [0, 0.5) (Yin et al. "
                         f"2018, Definition 2: the fraction removed at each end), got {beta!r}")


# ----------------------------------------------------------------- the rules
class RobustRule:
    """A coordinate-wise robust statistic of m client updates (module docstring)."""

    name: ClassVar[str] = ""

    def statistic(self, values: np.ndarray) -> np.ndarray:
        """The statistic of each column of the (m, n) ``values`` (NaN = not there)."""
        raise NotImplementedError

    def trimmed(self, count: int) -> int:
        """How many of ``count`` values of a coordinate leave each end."""
        raise NotImplementedError


@dataclass(frozen=True)
class Median(RobustRule):
    """Coordinate-wise median (Yin et al. 2018, Definition 1): :func:`coordinate_median`."""

    name: ClassVar[str] = "median"

    def statistic(self, values: np.ndarray) -> np.ndarray:
        return coordinate_median(values)

    def trimmed(self, count: int) -> int:
        return (count - 1) // 2 if count > 0 else 0

    def __str__(self) -> str:
        return "coordinate-wise median (Yin et al. 2018, Def. 1)"


@dataclass(frozen=True)
class TrimmedMean(RobustRule):
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018, Definition 2):
    :func:`coordinate_trimmed_mean`; ``beta`` in [0, 1/2) leaves each end."""

    beta: float = 0.1
    name: ClassVar[str] = "trimmed-mean"

    def __post_init__(self) -> None:
        _check_beta(self.beta)

    def statistic(self, values: np.ndarray) -> np.ndarray:
        return coordinate_trimmed_mean(values, self.beta)

    def trimmed(self, count: int) -> int:
        return trim_count(self.beta, count)

    def __str__(self) -> str:
        return f"coordinate-wise trimmed mean, beta {self.beta:g} (Yin et al. 2018, Def. 2)"


def robust_rule(name: str, trim: float = 0.1) -> RobustRule | None:
    """The rule of the run config's ``robust-aggregation`` = ``name`` (None for ``none``)
    with ``robust-trim`` = ``trim`` as the trimmed mean's beta; ``trim`` is checked whatever
    the rule, as the run config checks it."""
    _check_beta(trim)
    if name == "none":
        return None
    if name == "median":
        return Median()
    if name == "trimmed-mean":
        return TrimmedMean(float(trim))
    raise ValueError(f"robust-aggregation={name!r} is not known; use one of "
                     f"{', '.join(ROBUST_RULES)}")


def as_robust(value: RobustRule | str | None) -> RobustRule | None:
    """A strategy's ``robust`` argument as a rule: a :class:`RobustRule`, its name (the
    trimmed mean with beta 0.1), or None / ``"none"``."""
    if value is None or isinstance(value, RobustRule):
        return value
    if isinstance(value, str):
        return robust_rule(value)
    raise ValueError(f"robust={value!r} is not a robust rule; pass Median(), "
                     f"TrimmedMean(beta=...), one of {', '.join(ROBUST_RULES)}, or None")


# ----------------------------------------------------------------- what it is taken of
@dataclass(frozen=True)
class ClientDelta:
    """One client's x^i = ``scale`` (``model`` - ``reference``) for the statistic.

    ``reference`` is what the client started from (w_t, FedBuff's model version; None: 0),
    ``scale`` a server-side weight (FedBuff's s(tau_k); never the client's num-examples),
    ``indices`` the sub-model's entries per key (per axis an int array or ``slice(None)``,
    :func:`strategies.engine.submodel_math.submodel_indices`; None: the whole model).
    Arrays are only read.
    """

    model: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray] | None = None
    scale: float = 1.0
    indices: Mapping[str, Sequence] | None = None


def robust_delta(rule: RobustRule, global_arrays: Mapping[str, np.ndarray],
                 updates: Sequence[ClientDelta]) -> NDArrays:
    """R of the updates, per key of ``global_arrays`` (float64, its shape; NaN where no
    update holds an entry): whole arrays block by block, sub-model arrays one at a time."""
    if not updates:
        raise ValueError("no client update to aggregate")
    out: NDArrays = {}
    for key, current in global_arrays.items():
        shape = np.shape(current)
        if all(u.indices is None for u in updates):
            out[key] = _blockwise(rule, key, shape, updates)
        else:
            out[key] = _held(rule, key, shape, updates)
    return out


def _blockwise(rule: RobustRule, key: str, shape: tuple, updates: Sequence[ClientDelta]
               ) -> np.ndarray:
    size = math.prod(shape)
    out = np.empty(size, dtype=np.float64)
    scratch = np.empty((len(updates), min(BLOCK, size)), dtype=np.float64)
    for start in range(0, size, BLOCK):
        stop = min(start + BLOCK, size)
        rows = scratch[:, : stop - start]
        for row, update in zip(rows, updates):
            row[:] = np.reshape(update.model[key], -1)[start:stop]
            if update.reference is not None:
                row -= np.reshape(update.reference[key], -1)[start:stop]
            if update.scale != 1.0:
                row *= update.scale
        out[start:stop] = rule.statistic(rows)
    return out.reshape(shape)


def _held(rule: RobustRule, key: str, shape: tuple, updates: Sequence[ClientDelta]) -> np.ndarray:
    stack = np.full((len(updates), *shape), np.nan)
    for i, update in enumerate(updates):
        row = stack[i, ...]  # a view, also of a 0-d array
        if key not in update.model:
            continue  # this sub-model leaves the key untrained
        index = None if update.indices is None else update.indices.get(key)
        mesh = () if index is None else _mesh(shape, index)
        delta = np.asarray(update.model[key], dtype=np.float64)
        if update.reference is not None:
            delta = delta - np.asarray(update.reference[key], dtype=np.float64)[mesh]
        row[mesh] = delta * update.scale
    return rule.statistic(stack.reshape(len(updates), -1)).reshape(shape)


def _mesh(shape: tuple, index: Sequence) -> tuple:
    """``np.ix_`` of a sub-model's per-axis entries (an int array, or a slice) in ``shape``."""
    if len(index) != len(shape):
        raise ValueError(f"sub-model indices have {len(index)} axes for shape {shape}")
    return np.ix_(*(np.arange(n)[entry] if isinstance(entry, slice) else np.asarray(entry)
                    for n, entry in zip(shape, index)))


def robust_update(global_arrays: Mapping[str, np.ndarray], updates: Sequence[ClientDelta],
                  rule: RobustRule, server_lr: float = 1.0) -> NDArrays:
    """w + eta_g R(updates) (module docstring), each array in its dtype; an entry no update
    holds keeps w. Integer arrays (BatchNorm's counters) get w + R, rounded, with whole
    models, and keep w with sub-models (as HeteroFL's aggregation)."""
    delta = robust_delta(rule, global_arrays, updates)
    held = any(u.indices is not None for u in updates)
    new: NDArrays = {}
    for key, current in global_arrays.items():
        current = np.asarray(current)
        step = np.nan_to_num(delta[key], nan=0.0)
        if np.issubdtype(current.dtype, np.floating):
            new[key] = (current.astype(np.float64) + server_lr * step).astype(current.dtype)
        elif held:
            new[key] = np.array(current, copy=True)
        else:
            new[key] = np.rint(current + step).astype(current.dtype)
    return new


# ----------------------------------------------------------------- the run log
@dataclass(frozen=True)
class RobustSection(Section):
    """The round's robust rule (logged only when one is given): its name, the trimmed mean's
    beta, how many client updates each coordinate's statistic was taken over, and how many
    of them left each end (for an entry all of them hold)."""

    rule: str = logged(C.LOG_ROBUST_AGGREGATION, default="")
    beta: float | None = logged(C.LOG_ROBUST_TRIM)
    values: int = logged(C.LOG_ROBUST_VALUES, default=0)
    trimmed: int = logged(C.LOG_ROBUST_TRIMMED, default=0)


def section(rule: RobustRule, count: int, server_round: int, owner: str) -> RobustSection:
    """The round's :class:`RobustSection`; a WARNING when the statistic cannot outvote one
    client (fewer than :data:`MIN_VALUES` values, or a trimmed mean that trims none)."""
    trimmed = rule.trimmed(count)
    if count < MIN_VALUES or trimmed == 0:
        log(WARNING, "%s: round %d: the %s of %d client update(s) leaves out %d at each end: "
            "no client is outvoted this round", owner, server_round, rule.name, count, trimmed)
    return RobustSection(rule.name, getattr(rule, "beta", None), count, trimmed)


# ----------------------------------------------------------------- FedBuff's buffer
class RobustBuffer:
    """A buffered asynchronous algorithm's K updates, held for a robust statistic.

    The asynchronous engine gives each checked client update to :meth:`hold` instead of the
    algorithm; once K = ``buffer_size`` are held, :meth:`release` hands the algorithm K
    updates that are each R of the held ones' s(tau_k) Delta_k (FedBuff, Nguyen et al.
    2022, Algorithm 1, with R for the buffer's mean), so the algorithm's own server step
    (its eta_g and momentum) makes x + eta_g R. Holds the K client models (read-only views
    of the replies) and the model versions they were sent until the step.
    """

    def __init__(self, rule: RobustRule, buffer_size: int, staleness) -> None:
        self.rule, self.buffer_size, self.staleness = rule, int(buffer_size), staleness
        self.held: list[ClientDelta] = []

    @property
    def ready(self) -> bool:
        """K updates are held."""
        return len(self.held) >= self.buffer_size

    def hold(self, sent: NDArrays, client: NDArrays, staleness: int) -> bool:
        """Hold s(tau) (client - sent); True once K are held."""
        self.held.append(ClientDelta(client, sent, float(self.staleness(staleness))))
        return self.ready

    def release(self, model: NDArrays) -> list[tuple[NDArrays, NDArrays]]:
        """(sent, client) pairs, K of them, each with client - sent = R / s(0) (s(0) = 1 for
        every staleness function), for the algorithm to apply at staleness 0; the buffer
        empties."""
        delta = robust_delta(self.rule, model, self.held)
        unit = float(self.staleness(0))
        zero = {key: np.zeros(np.shape(value)) for key, value in delta.items()}
        client = {key: value / unit for key, value in delta.items()}
        count, self.held = len(self.held), []
        return [(zero, client)] * count

    def state_dict(self) -> dict:
        """The held updates as s(tau) Delta in float64 (a round that ended short of K)."""
        return {"held": [{key: (np.asarray(u.model[key], dtype=np.float64) - (
            0.0 if u.reference is None else np.asarray(u.reference[key], dtype=np.float64)))
            * u.scale for key in u.model} for u in self.held]}

    def load_state_dict(self, state: dict) -> None:
        self.held = [ClientDelta({k: np.array(v, copy=True) for k, v in held.items()})
                     for held in state.get("held", [])]
