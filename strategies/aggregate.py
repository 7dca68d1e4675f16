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
from fractions import Fraction

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


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """tau_i = floor(E n_i / B) local steps, at least 1; B = 0 or B >= n_i gives E
    (floor(E) for a fractional E; E may be any number > 0).

    The strategies' twin of ``task.train.steps_for_epochs`` (kept equal by a test), used
    when a client does not report the steps it took.
    """
    if num_examples <= 0 or epochs <= 0:
        return 0
    if batch_size <= 0 or batch_size >= num_examples:
        return max(1, math.floor(epochs))
    if isinstance(epochs, int):
        return max(1, (epochs * num_examples) // batch_size)
    # A fraction of an epoch (FedVeca's fairness protocol, E_avg < 1): floor(E n / B)
    # with E taken as the decimal it prints as, so no float rounding moves the floor.
    return max(1, math.floor(Fraction(repr(float(epochs))) * num_examples / batch_size))


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


class WeightedModelSum:
    """S = sum_k r_k w_k over client models added one at a time, plus R = sum_k r_k.

    Streaming form of every rule in this module: only the accumulator and the client
    model being added are in memory (two model-sized buffers), never all clients.
    Floating arrays accumulate in their own dtype, as Flower's FedAvg does; integer
    arrays (BatchNorm's ``num_batches_tracked``) in float64.
    """

    def __init__(self) -> None:
        self.sum: NDArrays = {}
        self.total = 0.0
        self.count = 0
        self.extras: dict[str, float] = {}

    def add(self, arrays: Mapping[str, np.ndarray], weight: float, *, owned: bool = False,
            **extras: float) -> None:
        """S += weight * w_k, R += weight, and sums of any named scalars.

        ``owned=True`` lets floating arrays be scaled in place (no temporary copy).
        """
        for key, value in arrays.items():
            if np.issubdtype(value.dtype, np.floating):
                if owned and value.flags.writeable:
                    value *= weight
                    term = value
                else:
                    term = value * weight
            else:
                term = value.astype(np.float64) * weight
            if key in self.sum:
                self.sum[key] += term
            else:
                self.sum[key] = term if term is not value or owned else term.copy()
        self.total += weight
        self.count += 1
        for name, amount in extras.items():
            self.extras[name] = self.extras.get(name, 0.0) + amount

    def update(self, global_arrays: Mapping[str, np.ndarray], scale: float, server_lr: float = 1.0) -> NDArrays:
        """w + eta_g * scale * (S - R w), i.e. w + eta_g * sum_k c_k (w_k - w) with c_k = scale * r_k.

        Computed in place in the accumulator, in the arrays' own dtype (which Flower's
        FedAvg also averages in), so the sum is consumed: call once. Integer arrays get
        the r-weighted mean S / R, rounded.
        """
        if self.count == 0:
            raise ValueError("no client model was added")
        new: NDArrays = {}
        for key, current in global_arrays.items():
            out = self.sum.pop(key)
            if np.issubdtype(current.dtype, np.floating):
                out -= current * np.asarray(self.total, dtype=current.dtype)
                out *= np.asarray(server_lr * scale, dtype=current.dtype)
                out += current
                new[key] = np.asarray(out, dtype=current.dtype)
            else:
                new[key] = np.asarray(np.rint(out / self.total)).astype(current.dtype)
        return new


def all_finite(arrays: Mapping[str, np.ndarray]) -> str | None:
    """The first key whose floating array holds NaN or Inf, or None."""
    for key, value in arrays.items():
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            return key
    return None


def apply_update(
    global_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    coefficients: Sequence[float],
    server_lr: float = 1.0,
) -> NDArrays:
    """w_t + eta_g * sum_k c_k (w_k - w_t), key by key (Option I, IID->non-IID study Alg. 3).

    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) are not parameters:
    they get the c-weighted mean of the clients' values, rounded.
    """
    c = np.asarray(coefficients, dtype=np.float64)
    if len(client_arrays) != len(c):
        raise ValueError(f"{len(client_arrays)} client models but {len(c)} coefficients")
    if len(c) == 0:
        raise ValueError("apply_update needs at least one client model")
    acc = WeightedModelSum()
    for c_k, arrays in zip(c, client_arrays):
        acc.add(arrays, float(c_k))
    return acc.update(global_arrays, 1.0, server_lr)


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
    ``num_batches_tracked``) are not normalised: they get a rounded weighted mean.
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
    acc = WeightedModelSum()
    for arrays, n_i, a_i in zip(client_arrays, p, a):
        acc.add(arrays, n_i / a_i, n=n_i, na=n_i * a_i)
    new = acc.update(global_arrays, fednova_scale(acc))
    return apply_server_momentum(global_arrays, new, momentum_buffer, server_momentum)


def fednova_scale(acc: WeightedModelSum) -> float:
    """scale of ``acc.update`` for FedNova when clients were added with weight n_i/a_i
    and extras n = n_i, na = n_i a_i: c_i = tau_eff p_i / a_i = (tau_eff / sum n) r_i."""
    total_n = acc.extras["n"]
    tau_eff = acc.extras["na"] / total_n
    return tau_eff / total_n


def apply_server_momentum(
    global_arrays: Mapping[str, np.ndarray], new: NDArrays, buffer: NDArrays | None, gamma: float
) -> tuple[NDArrays, NDArrays | None]:
    """v <- gamma v + (w - w_new); w <- w - v (floating arrays; gamma = 0 returns ``new``)."""
    if gamma <= 0:
        return new, None
    out: NDArrays = dict(new)
    new_buffer: NDArrays = {}
    for key, current in global_arrays.items():
        if not np.issubdtype(current.dtype, np.floating):
            continue
        step = current.astype(np.float64) - new[key].astype(np.float64)
        if buffer and key in buffer:
            step = gamma * buffer[key] + step
        new_buffer[key] = step
        out[key] = np.asarray(current.astype(np.float64) - step).astype(current.dtype)
    return out, new_buffer


# ----------------------------------------------------------------- client drift
def layer_of(key: str) -> str:
    """'features.0.weight' -> 'features.0': weights and biases of a module form one layer."""
    return key.rsplit(".", 1)[0] if "." in key else key


class UpdateDrift:
    """Client-drift diagnostics over client updates d_k = w_k - w, streamed one client at a time.

    Per layer, the mean pairwise cosine similarity of the updates (the IID->non-IID
    study's Fig. 13) from the sum of unit vectors: with u_k = d_k / ||d_k||,
    sum_{i != j} cos(d_i, d_j) = ||sum_k u_k||^2 - K, so the mean over the K(K-1)
    ordered pairs is (||sum_k u_k||^2 - K) / (K (K - 1)). Also the spread of the whole-
    model update norms ||d_k||. Keeps one model-sized sum of unit vectors.
    """

    def __init__(self, global_arrays: Mapping[str, np.ndarray]) -> None:
        self.global_arrays = {k: v for k, v in global_arrays.items() if np.issubdtype(v.dtype, np.floating)}
        self.layers: dict[str, list[str]] = {}
        for key in self.global_arrays:
            self.layers.setdefault(layer_of(key), []).append(key)
        self.unit_sum: NDArrays = {}
        self.unit_count: dict[str, int] = {}
        self.norms: list[float] = []

    def add(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Fold in one client's model (not modified)."""
        total = 0.0
        for layer, keys in self.layers.items():
            deltas = {k: arrays[k].astype(np.float64) - self.global_arrays[k] for k in keys}
            norm2 = float(sum(np.vdot(d, d) for d in deltas.values()))
            total += norm2
            if norm2 == 0.0:
                continue
            inv = 1.0 / np.sqrt(norm2)
            for k, d in deltas.items():
                d *= inv
                if k in self.unit_sum:
                    self.unit_sum[k] += d
                else:
                    self.unit_sum[k] = d
            self.unit_count[layer] = self.unit_count.get(layer, 0) + 1
        self.norms.append(float(np.sqrt(total)))

    def summary(self) -> dict[str, object]:
        """{'drift-cosine': {layer: mean pairwise cosine}, 'drift-cosine-mean', 'update-norm-mean',
        'update-norm-cv'} (cosines need at least two clients with a non-zero update)."""
        cosine = {}
        for layer, keys in self.layers.items():
            k = self.unit_count.get(layer, 0)
            if k >= 2:
                s2 = float(sum(np.vdot(self.unit_sum[key], self.unit_sum[key]) for key in keys))
                cosine[layer] = (s2 - k) / (k * (k - 1))
        out: dict[str, object] = {}
        if cosine:
            out["drift-cosine"] = {layer: round(v, 6) for layer, v in cosine.items()}
            out["drift-cosine-mean"] = float(np.mean(list(cosine.values())))
        if self.norms:
            mean = float(np.mean(self.norms))
            out["update-norm-mean"] = mean
            out["update-norm-cv"] = float(np.std(self.norms) / mean) if mean > 0 else 0.0
        return out
