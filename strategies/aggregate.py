"""Pure numpy math of the FedAvg family: sampling, aggregation coefficients, update.

No Flower types here. Models are ``dict[str, np.ndarray]`` keyed by parameter name.

Every aggregation rule of the family is written as one update (Option I of the
IID->non-IID study, Alg. 3):

    w_{t+1} = w_t + eta_g * sum_{k in S_t} c_k * (w_k - w_t)

and only the coefficients c_k differ:

* McMahan et al. Alg. 1 (erratum):   c_k = n_k / m_t, m_t = sum_{k in S_t} n_k
* uniform ("naive") averaging:       c_k = 1 / |S_t|
* McMahan et al. pre-erratum:        c_k = n_k / n over ALL n examples; unsampled
                                     clients contribute w_t (the update form above)
* Li et al. ICLR'20 Scheme I:        c_k = (#draws of k) / K   (K draws with replacement, prob. p_k)
* Li et al. ICLR'20 Scheme II:       c_k = p_k * N / K         (K of N uniformly without replacement)

When sum(c) = 1 and eta_g = 1 this is exactly model averaging, sum_k c_k w_k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

NDArrays = dict[str, np.ndarray]


def num_to_sample(fraction: float, num_clients: int) -> int:
    """m = max(floor(C * K), 1) clients per round (McMahan et al., Alg. 1).

    A tiny tolerance keeps e.g. 0.29 * 100 = 28.999999999999996 at 29.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    return max(min(int(math.floor(fraction * num_clients + 1e-9)), num_clients), 1)


def sample_without_replacement(rng: np.random.Generator, num_clients: int, m: int) -> np.ndarray:
    """Indices of m distinct clients out of num_clients, uniformly (sorted)."""
    return np.sort(rng.choice(num_clients, size=m, replace=False))


def sample_with_replacement(
    rng: np.random.Generator, probabilities: Sequence[float], num_draws: int
) -> np.ndarray:
    """K draws with replacement, client k with probability p_k (Li et al., Scheme I).

    Returns the draw count of every client (length N, sums to num_draws).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    draws = rng.choice(len(p), size=num_draws, replace=True, p=p / p.sum())
    return np.bincount(draws, minlength=len(p))


def steps_for_epochs(num_examples: int, batch_size: int, epochs: int) -> int:
    """tau_i = floor(E n_i / B) local steps, at least 1; B = 0 or B >= n_i gives E.

    The strategies' twin of ``task.train.steps_for_epochs`` (kept equal by a test), used
    when a client does not report the steps it took.
    """
    if num_examples <= 0 or epochs <= 0:
        return 0
    if batch_size <= 0 or batch_size >= num_examples:
        return epochs
    return max(1, (epochs * num_examples) // batch_size)


def choose_stragglers(rng: np.random.Generator, num_sampled: int, fraction: float) -> np.ndarray:
    """Boolean mask: floor(fraction * m) of the m sampled clients are stragglers (FedProx Sec. 5.2)."""
    count = min(int(math.floor(fraction * num_sampled + 1e-9)), num_sampled)
    mask = np.zeros(num_sampled, dtype=bool)
    mask[rng.choice(num_sampled, size=count, replace=False)] = True
    return mask


def straggler_steps(rng: np.random.Generator, full_steps: Sequence[int]) -> np.ndarray:
    """A straggler's local work: uniform in 1..full_i steps (FedProx: x ~ U[1, E] epochs,
    here at step granularity so that E = 1 or 2 still gives variable work)."""
    full = np.maximum(np.asarray(full_steps, dtype=np.int64), 1)
    return rng.integers(1, full + 1)


def coefficients_by_examples(num_examples: Sequence[float]) -> np.ndarray:
    """c_k = n_k / m_t over the sampled clients (McMahan et al. Alg. 1, erratum)."""
    n = _positive(num_examples, "num_examples")
    return n / n.sum()


def coefficients_uniform(num_sampled: int) -> np.ndarray:
    """c_k = 1 / |S_t| (naive averaging)."""
    if num_sampled < 1:
        raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
    return np.full(num_sampled, 1.0 / num_sampled)


def coefficients_pre_erratum(num_examples: Sequence[float], total_examples: float) -> np.ndarray:
    """c_k = n_k / n with n over all clients (McMahan et al. Alg. 1 before the erratum).

    The missing mass sum_{k not in S_t} n_k / n multiplies w_t, which the update
    form w_t + sum c_k (w_k - w_t) already does.
    """
    n = _positive(num_examples, "num_examples")
    if total_examples < n.sum():
        raise ValueError(
            f"total_examples ({total_examples}) is smaller than the sampled clients' "
            f"examples ({n.sum()})"
        )
    return n / float(total_examples)


def coefficients_scheme_i(draw_counts: Sequence[int]) -> np.ndarray:
    """c_k = (#draws of k) / K: the plain mean over K draws with replacement (Scheme I)."""
    counts = np.asarray(draw_counts, dtype=np.float64)
    if counts.sum() <= 0:
        raise ValueError("draw_counts must sum to at least 1")
    return counts / counts.sum()


def coefficients_scheme_ii(
    probabilities: Sequence[float], num_clients: int, num_sampled: int
) -> np.ndarray:
    """c_k = p_k * N / K for K of N clients sampled uniformly (Li et al., Scheme II).

    Unbiased: E[sum_{k in S} p_k N / K] = 1. The sum is 1 only for balanced data.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    return p * (num_clients / num_sampled)


def apply_update(
    global_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    coefficients: Sequence[float],
    server_lr: float = 1.0,
) -> NDArrays:
    """w_t + eta_g * sum_k c_k (w_k - w_t), key by key (Option I, IID->non-IID study Alg. 3).

    Floating arrays are accumulated in float64 and cast back to their dtype.
    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) are not parameters:
    they get the c-weighted mean of the clients' values, rounded.
    """
    c = np.asarray(coefficients, dtype=np.float64)
    if len(client_arrays) != len(c):
        raise ValueError(f"{len(client_arrays)} client models but {len(c)} coefficients")
    if len(c) == 0:
        raise ValueError("apply_update needs at least one client model")
    new: NDArrays = {}
    for key, current in global_arrays.items():
        if np.issubdtype(current.dtype, np.floating):
            base = current.astype(np.float64)
            step = np.zeros_like(base)
            for c_k, arrays in zip(c, client_arrays):
                step += c_k * (arrays[key].astype(np.float64) - base)
            new[key] = np.asarray(base + server_lr * step).astype(current.dtype)
        else:
            weights = c / c.sum()
            mean = sum(w * arrays[key].astype(np.float64) for w, arrays in zip(weights, client_arrays))
            new[key] = np.asarray(np.rint(mean)).astype(current.dtype)
    return new


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """sum w_i v_i / sum w_i."""
    w = np.asarray(weights, dtype=np.float64)
    return float(np.dot(w, np.asarray(values, dtype=np.float64)) / w.sum())


def _positive(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0 or np.any(~np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {arr.tolist()}")
    return arr


# ----------------------------------------------------------------- FedNova
def fednova_norm_sgd(tau: float) -> float:
    """||a_i||_1 = tau for plain local SGD (Wang et al. 2020, FedNova; FedVeca eq. 5)."""
    return float(tau)


def fednova_norm_momentum(tau: float, rho: float) -> float:
    """||a_i||_1 for local SGD with momentum rho (FedNova, Sec. 4 / App.):

    a_i^j = (1 - rho^(tau - j)) / (1 - rho), summed over j = 0..tau-1
          = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho).
    """
    if rho == 0:
        return float(tau)
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


def fednova_norm_proximal(tau: float, lr: float, mu: float) -> float:
    """||a_i||_1 for proximal local SGD, alpha = lr * mu (FedNova, FedProx case):

    a_i^j = (1 - alpha)^(tau - 1 - j), summed = (1 - (1 - alpha)^tau) / alpha.
    """
    alpha = lr * mu
    if alpha == 0:
        return float(tau)
    return (1 - (1 - alpha) ** tau) / alpha


def fednova_update(
    global_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    a_norms: Sequence[float],
    weights: Sequence[float],
    momentum_buffer: NDArrays | None = None,
    server_momentum: float = 0.0,
) -> tuple[NDArrays, NDArrays | None]:
    """FedNova's normalised averaging (Wang et al. 2020, eq. 5 of FedVeca):

        d_i = (w - w_i) / ||a_i||_1,   tau_eff = sum_i p_i ||a_i||_1,
        w  <- w - tau_eff * sum_i p_i d_i            (p_i = weights / sum weights)

    With server momentum gamma > 0: v <- gamma v + tau_eff sum_i p_i d_i, w <- w - v.
    All ||a_i|| equal gives FedAvg (sum_i p_i w_i). Integer arrays (BatchNorm's
    ``num_batches_tracked``) are not normalised: they get the p-weighted rounded mean.
    Returns the new arrays and the new momentum buffer (None without momentum).
    """
    a = np.asarray(a_norms, dtype=np.float64)
    p = np.asarray(weights, dtype=np.float64)
    if len(client_arrays) != len(a) or len(a) != len(p) or len(a) == 0:
        raise ValueError(f"need the same positive number of clients, a_norms and weights, "
                         f"got {len(client_arrays)}, {len(a)}, {len(p)}")
    if np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"a_norms must be finite and > 0, got {a.tolist()}")
    p = _positive(p, "weights")
    p = p / p.sum()
    tau_eff = float(np.dot(p, a))
    scale = tau_eff * p / a  # w - sum_i (tau_eff p_i / a_i)(w - w_i)
    new: NDArrays = {}
    new_buffer: NDArrays | None = {} if server_momentum > 0 else None
    for key, current in global_arrays.items():
        if not np.issubdtype(current.dtype, np.floating):
            mean = sum(w * arrays[key].astype(np.float64) for w, arrays in zip(p, client_arrays))
            new[key] = np.asarray(np.rint(mean)).astype(current.dtype)
            continue
        base = current.astype(np.float64)
        step = np.zeros_like(base)
        for s_i, arrays in zip(scale, client_arrays):
            step += s_i * (base - arrays[key].astype(np.float64))
        if new_buffer is not None:
            previous = momentum_buffer.get(key) if momentum_buffer else None
            step = step if previous is None else server_momentum * previous + step
            new_buffer[key] = step
        new[key] = np.asarray(base - step).astype(current.dtype)
    return new, new_buffer
