"""Pure numpy math of FedVeca (Luo et al., "FedVeca: Federated Vectorized Averaging on
Non-IID Data with Adaptive Bi-directional Global Objective", arXiv 2209.13803).

No Flower types here. Models and gradients are ``dict[str, np.ndarray]`` keyed by
parameter name. Equation numbers are the paper's:

* eq. (5)  aggregation ``w_{k+1} = w_k - eta tau_k d_k``: FedNova's rule, in
  :func:`strategies.engine.averaging.fednova_update` (not repeated here);
* eq. (8)  global gradient ``grad F(w_k) = sum_i p_i grad F_i(w_k)``: :class:`GradientSum`
  (summed in the gradients' own dtype, float32 from a PyTorch client: see the class);
* eq. (9) / Alg. 1 lines 11-16  smoothness estimate L (diagnostic only):
  :func:`initial_smoothness`, :func:`smoothness`, :func:`running_max`;
* Thm. 1 / eq. (13)  ``A_i = eta beta_i^2 delta_i``: :func:`non_iid_effect`;
* eq. (14)/(15) and Alg. 1 lines 17-21  the step-size rule
  ``tau_{k+1,i} = floor(A_i / (A_i - alpha min_j A_j))``, ``<= 1 -> 2``, cap ``tau_max``
  (Sec. IV-A4): :func:`tau_from_ratio`, :func:`next_taus`.

The floor of eq. (15) is computed exactly: alpha is read as the decimal number it
prints as (``Fraction(repr(alpha))``, so 0.95 is 19/20 and not the binary double
0.94999999999999995559...), the ratio r_i = A_i / min A is the exact rational of the
two doubles, and a quotient within a relative 1e-9 below an integer counts as that
integer (rounding noise in A). Hence alpha = 0.95 gives tau = 20 for the client with
the smallest A, where ``math.floor(1 / (1 - 0.95))`` would give 19.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import contract as C
from ..engine import averaging as agg

NDArrays = dict[str, np.ndarray]

TAU_MIN = 2  # Alg. 1 lines 19-21: tau <= 1 is reset to 2 (Thm. 1 needs tau > 1)
FLOOR_TOLERANCE = 1e-9  # relative; see the module docstring
BETA_MODES = C.BETA_MODES  # client-side beta estimator (Assumption 3), the contract's values

# Why a client's next tau is what it is (logged per client).
RULE = "rule"  # eq. (15), then <= 1 -> 2, then the cap
NEGATIVE = "negative"  # A_i - alpha min A <= 0: "negative direction", no bound from (14): tau_max
ZERO_A = "zero-a"  # A_i == 0 (beta or delta is 0): no bound from (14): tau_max
NOT_FINITE = "not-finite"  # A_i is NaN or Inf: keep the previous tau
MISSING = "missing"  # no estimate this round: keep the previous tau


def normalise_beta_mode(mode: str) -> str:
    """'same_batch' -> 'same-batch'; raises on an unknown mode."""
    canonical = str(mode).replace("_", "-")
    if canonical not in BETA_MODES:
        raise ValueError(f"beta mode {mode!r} is not known; use one of {', '.join(BETA_MODES)}")
    return canonical


# ----------------------------------------------------------------- vectors
def _float64_blocks(value: np.ndarray):
    """``value`` flattened, as float64 blocks of ``BLOCK`` elements (small temporaries)."""
    flat = np.ravel(value)
    for start in range(0, flat.size, agg.BLOCK):
        yield flat[start:start + agg.BLOCK].astype(np.float64)


def squared_norm(arrays: Mapping[str, np.ndarray]) -> float:
    """||v||^2 of the flattened vector (float64 accumulation, block by block)."""
    return float(sum(agg.squared_sum(b) for a in arrays.values() for b in _float64_blocks(a)))


def difference_norm(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    """||a - b|| over the keys of ``a`` (the Euclidean norm of the paper's "L norm"),
    in float64, block by block."""
    total = 0.0
    for key, value in a.items():
        for x, y in zip(_float64_blocks(value), _float64_blocks(b[key])):
            x -= y
            total += agg.squared_sum(x)
    return math.sqrt(total)


def floating_only(arrays: Mapping[str, np.ndarray]) -> NDArrays:
    """The floating-point arrays (the model's parameters; integer buffers are no coordinates)."""
    return {k: v for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating)}


class GradientSum:
    """eq. (8): grad F(w_k) = sum_i p_i grad F_i(w_k), p_i = D_i / sum_j D_j over the
    clients added, streamed one client at a time into one accumulator
    (:class:`strategies.engine.averaging.WeightedModelSum`, the model sum of eq. 5).

    The sum is kept in the gradients' own dtype, float32 for a PyTorch client, like the
    model average of eq. (5) and Flower's FedAvg: the grad F_i arrive in float32, so
    float64 would only carry their rounding further. eq. (15) does not see the
    difference: grad F enters the clients' delta_i only through ||grad F(w_{k-1})||^2,
    the same normaliser for every client (Alg. 2 line 17), and eq. (15) uses the ratios
    A_i / min_j A_j, in which it cancels; L (Alg. 1 line 14) is a diagnostic.
    """

    def __init__(self) -> None:
        self.acc = agg.WeightedModelSum()

    @property
    def total(self) -> float:
        """sum_i D_i so far."""
        return self.acc.total

    def add(self, grad: Mapping[str, np.ndarray], num_examples: float) -> None:
        """S += D_i grad_i; D += D_i (``grad`` is only read)."""
        self.acc.add(grad, float(num_examples))

    def non_finite_key(self) -> str | None:
        """A key whose sum has NaN / Inf (some client's gradient had them), or None."""
        return self.acc.non_finite_key()

    def mean(self) -> NDArrays:
        """S / D, computed in place: the sum is consumed."""
        if self.acc.total <= 0:
            raise ValueError("no client gradient was added")
        return self.acc.mean()


@dataclass(frozen=True)
class GradientMean:
    """eq. (8) over the usable client gradients: the mean (None when none is usable), the
    indices it covers, and (index, key) of each gradient left out for NaN / Inf."""

    mean: NDArrays | None
    kept: tuple[int, ...]
    rejected: tuple[tuple[int, str], ...]


def gradient_mean(grads: Sequence[Mapping[str, np.ndarray]],
                  num_examples: Sequence[float]) -> GradientMean:
    """eq. (8), grad F(w_k) = sum_i p_i grad F_i(w_k), p_i = D_i / sum_j D_j, without
    recursion, in at most three streamed sums:

    1. sum_i D_i grad_i / sum_i D_i over all gradients (:class:`GradientSum`): when finite,
       that is the mean (every finite run takes only this pass);
    2. otherwise the gradients with NaN / Inf are left out and the sum is formed again;
    3. if it still overflows (finite gradients whose D_i-weighted float32 sum exceeds the
       float32 range), the weights are p_i themselves: a convex combination, bounded by
       max_i |grad_i| elementwise up to rounding.

    The mean is None when no gradient is left or even step 3 is not finite.
    """
    if len(grads) != len(num_examples):
        raise ValueError(f"{len(grads)} gradients but {len(num_examples)} sizes")

    def streamed(indices: Sequence[int], weights: Sequence[float]) -> GradientSum:
        total = GradientSum()
        for k, w in zip(indices, weights):
            total.add(grads[k], w)
        return total

    indices = list(range(len(grads)))
    sizes = [float(n) for n in num_examples]
    rejected: list[tuple[int, str]] = []
    if not indices:
        return GradientMean(None, (), ())
    total = streamed(indices, sizes)
    if total.non_finite_key() is not None:
        kept = []
        for k in indices:
            bad_key = agg.all_finite(grads[k])
            if bad_key is None:
                kept.append(k)
            else:
                rejected.append((k, bad_key))
        indices = kept
        if not indices:
            return GradientMean(None, (), tuple(rejected))
        total = streamed(indices, [sizes[k] for k in indices])
        if total.non_finite_key() is not None:
            whole = sum(sizes[k] for k in indices)
            total = streamed(indices, [sizes[k] / whole for k in indices])
            if total.non_finite_key() is not None:
                return GradientMean(None, (), tuple(rejected))
    return GradientMean(total.mean(), tuple(indices), tuple(rejected))


def global_gradient(grads: Sequence[Mapping[str, np.ndarray]],
                    num_examples: Sequence[float]) -> NDArrays:
    """eq. (8) for a list of client gradients (see :class:`GradientSum` for streaming)."""
    if len(grads) != len(num_examples) or not grads:
        raise ValueError(f"need the same positive number of gradients and sizes, got {len(grads)}, "
                         f"{len(num_examples)}")
    acc = GradientSum()
    for grad, n in zip(grads, num_examples):
        acc.add(grad, n)
    return acc.mean()


# ----------------------------------------------------------------- L (diagnostic)
def initial_smoothness(grad0: Mapping[str, np.ndarray], w0: Mapping[str, np.ndarray],
                       eps: float = 1e-12) -> float | None:
    """L_0 = ||grad F(w_0)|| / ||w_0|| (Alg. 1 line 12); None when ||w_0|| <= eps
    (e.g. the squared-SVM's w_0 = 0, which would give L_0 = inf)."""
    denominator = math.sqrt(squared_norm(w0))
    if not denominator > eps:
        return None
    value = math.sqrt(squared_norm(grad0)) / denominator
    return value if math.isfinite(value) else None


def smoothness(grad_a: Mapping[str, np.ndarray], grad_b: Mapping[str, np.ndarray],
               w_a: Mapping[str, np.ndarray], w_b: Mapping[str, np.ndarray],
               eps: float = 1e-12) -> float | None:
    """L = ||grad F(w_a) - grad F(w_b)|| / ||w_a - w_b|| (Assumption 1, eq. 9; Alg. 1 line 14);
    None when the models coincide (||w_a - w_b|| <= eps) or the value is not finite."""
    denominator = difference_norm(w_a, w_b)
    if not denominator > eps:
        return None
    value = difference_norm(grad_a, grad_b) / denominator
    return value if math.isfinite(value) else None


def running_max(current: float | None, estimate: float | None) -> float | None:
    """L <- max over all L estimates so far (Alg. 1 line 16); None / NaN / Inf are ignored."""
    if estimate is None or not math.isfinite(estimate):
        return current
    return estimate if current is None else max(current, estimate)


# ----------------------------------------------------------------- A and tau
def non_iid_effect(eta: float, beta: float, delta: float) -> float:
    """A_(k,i) = eta beta_(k,i)^2 delta_(k,i) (Theorem 1, eq. 13); NaN if an input is not finite."""
    if not (math.isfinite(eta) and math.isfinite(beta) and math.isfinite(delta)):
        return float("nan")
    with np.errstate(over="ignore"):
        return float(np.float64(eta) * np.float64(beta) ** 2 * np.float64(delta))


def exact_alpha(alpha: float) -> Fraction:
    """alpha as the decimal it prints as: 0.95 -> 19/20 (not the double just below 0.95)."""
    return Fraction(repr(float(alpha)))


def _floor_with_tolerance(q: Fraction) -> int:
    """floor(q), but a q within a relative FLOOR_TOLERANCE below the next integer gives it."""
    n = math.floor(q)
    if (n + 1 - q) <= FLOOR_TOLERANCE * (n + 1):
        return n + 1
    return n


def clamp_tau(tau: int, tau_max: int) -> int:
    """tau <= 1 -> 2 (Alg. 1 lines 19-21), then tau <= tau_max (Sec. IV-A4: 50)."""
    if tau <= 1:
        tau = TAU_MIN
    return min(tau, tau_max)


def tau_from_ratio(r: float | Fraction, alpha: float, tau_max: int = 50) -> int:
    """eq. (15) in ratio form: tau = floor(r / (r - alpha)) with r = A_i / min_j A_j >= 1,
    then <= 1 -> 2 and the cap tau_max. r <= alpha (the "negative direction",
    A_i - alpha min A <= 0) has no bound from eq. (14) and gives tau_max.

    At alpha = 0.95: r = 1 -> 20, 1.01 -> 16, 1.02 -> 14, 1.05 -> 10, 1.1 -> 7, 1.2 -> 4,
    1.3 -> 3, 1.5 -> 2, >= 1.9 -> 2.
    """
    r_exact = r if isinstance(r, Fraction) else Fraction(float(r))
    a = exact_alpha(alpha)
    if r_exact - a <= 0:
        return tau_max
    return clamp_tau(_floor_with_tolerance(r_exact / (r_exact - a)), tau_max)


@dataclass(frozen=True)
class TauDecision:
    """The next round's tau of every client, and why.

    ``taus[i]`` is None where the previous tau is kept (``reason`` MISSING or NOT_FINITE).
    ``ratios[i]`` = A_i / min A (NaN where undefined), ``signs[i]`` = sign of
    A_i - alpha min A (+1 positive, -1 or 0 "negative direction", None undefined).
    """

    taus: list[int | None]
    ratios: list[float]
    signs: list[int | None]
    reasons: list[str]
    min_a: float | None


def next_taus(effects: Sequence[float | None], alpha: float, tau_max: int = 50) -> TauDecision:
    """Theorem 2 / eq. (15): tau_(k+1,i) = floor(A_i / (A_i - alpha min_j A_j)), <= 1 -> 2,
    cap tau_max.

    ``effects`` are the A_(k,i) of the clients of this round (None: no estimate).
    Guards: a None, NaN or Inf A keeps the client's previous tau and is left
    out of min A; an A of 0 (beta or delta 0) has no bound and gets tau_max; min A is
    taken over the positive A's; A_i - alpha min A <= 0 ("negative direction") gives
    tau_max. Only ratios of the A's matter: scaling every A by c > 0 changes nothing.
    """
    if not 0 < alpha or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    if tau_max < TAU_MIN:
        raise ValueError(f"tau_max must be >= {TAU_MIN}, got {tau_max}")
    values: list[float | None] = []
    for a in effects:
        values.append(float(a) if a is not None else None)
    positive = [a for a in values if a is not None and math.isfinite(a) and a > 0]
    min_a = min(positive) if positive else None
    a_exact = exact_alpha(alpha)
    rows: list[tuple[int | None, float, int | None, str]] = []  # (tau, r, sign, reason)
    for a in values:
        if a is None:
            rows.append((None, math.nan, None, MISSING))
        elif not math.isfinite(a) or a < 0:
            rows.append((None, math.nan, None, NOT_FINITE))
        elif min_a is None:  # every finite A is 0
            rows.append((tau_max, math.nan, None, ZERO_A))
        elif a == 0:  # A_i - alpha min A = -alpha min A < 0
            rows.append((tau_max, 0.0, -1, ZERO_A))
        else:
            r = Fraction(a) / Fraction(min_a)
            gap = r - a_exact  # same sign as A_i - alpha min A
            sign = 1 if gap > 0 else (0 if gap == 0 else -1)
            if gap <= 0:
                rows.append((tau_max, float(r), sign, NEGATIVE))
            else:
                rows.append((tau_from_ratio(r, alpha, tau_max), float(r), sign, RULE))
    taus = [row[0] for row in rows]
    ratios = [row[1] for row in rows]
    signs = [row[2] for row in rows]
    reasons = [row[3] for row in rows]
    return TauDecision(taus=taus, ratios=ratios, signs=signs, reasons=reasons, min_a=min_a)


def aggregated_tau(taus: Sequence[float], num_examples: Sequence[float]) -> float:
    """tau_k = sum_i p_i tau_(k,i), p_i = D_i / sum_j D_j (eq. 5; Alg. 1 line 18)."""
    t = np.asarray(taus, dtype=np.float64)
    n = np.asarray(num_examples, dtype=np.float64)
    if t.size == 0 or t.size != n.size or n.sum() <= 0:
        raise ValueError(f"need the same positive number of taus and sizes, got {t.tolist()}, "
                         f"{n.tolist()}")
    return float(np.dot(t, n) / n.sum())


def alpha_upper_bound(smoothness_max: float | None, min_a: float | None) -> float | None:
    """min(1, 2L / min_j A_j): Theorem 2 needs alpha_k below this (not enforced; logged)."""
    if smoothness_max is None or min_a is None or not min_a > 0:
        return None
    return min(1.0, 2.0 * smoothness_max / min_a)
