"""Pure numpy aggregation of the FedAvg family: weighting coefficients, one streaming
weighted sum, FedNova's normalisation, client-drift diagnostics.

No Flower types. Models are ``dict[str, np.ndarray]`` keyed by parameter name. Every
rule of the family is one update (Option I of Hsieh et al.'s IID->non-IID study):

    w_{t+1} = w_t + eta_g * sum_{k in S_t} c_k * (w_k - w_t)

computed by :func:`streamed_update`, one client model in memory at a time. Only the
coefficients c_k differ; each weighting is one function returning a
:class:`Coefficients`:

* :func:`coefficients_by_examples`  c_k = n_k / m_t, m_t = sum_{k in S_t} n_k
  (McMahan et al. 2017, Algorithm 1 after the erratum);
* :func:`coefficients_uniform`      c_k = 1 / |S_t|;
* :func:`coefficients_pre_erratum`  c_k = n_k / n over ALL n examples, the unsampled
  clients contributing w_t (McMahan et al., Algorithm 1 before the erratum);
* :func:`coefficients_scheme_i`     c_k = (#draws of k) / K, K draws with replacement with
  probability p_k (Li et al. 2020, "On the convergence of FedAvg", Scheme I);
* :func:`coefficients_scheme_ii`    c_k = p_k N / K, K of N uniformly without
  replacement (Li et al. 2020, Scheme II);
* :func:`coefficients_fednova`      c_i = tau_eff p_i / ||a_i||_1 (Wang et al. 2020, eq. 6).

When sum(c) = 1 and eta_g = 1 the update is exactly model averaging, sum_k c_k w_k.

Memory and speed: client arrays are read where they lie (read-only views of the reply
bytes, :func:`strategies.engine.records.to_numpy`), products are formed ``BLOCK`` elements at a
time into a small scratch buffer (:func:`add_scaled`), and NaN / Inf are looked for once
in the sum instead of once per client (:func:`streamed_update`). Elementwise arithmetic
is unchanged by the blocking, so the numbers are those of the one-line forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .round_report import Drift

NDArrays = dict[str, np.ndarray]

RENORMALISE = "renormalise"  # scale = 1 / sum of the accepted shares: sum c = 1
FIXED = "fixed"  # scale given (pre-erratum: R / n)
PER_REPLY = "per-reply"  # scale = R / |accepted| (Scheme II)
FEDNOVA = "fednova"  # scale = R tau_eff / sum_{accepted} n_i (FedNova)

BLOCK = 1 << 16  # elements per block of the streamed sums (256 KiB of float32: stays in cache)


@dataclass(frozen=True)
class Coefficients:
    """c_k = scale * shares_k for the replies that end up aggregated.

    ``shares`` are r_k / R, the raw weights of a scheme over all checked replies
    normalised by R = sum_k r_k; they are what :class:`WeightedModelSum` adds. The
    ``rule`` says how ``scale`` follows from the replies finally accepted (a reply with
    NaN / Inf is dropped only while streaming): :data:`RENORMALISE`, :data:`FIXED`,
    :data:`PER_REPLY` or :data:`FEDNOVA`. ``extras`` are per-reply scalars summed
    alongside (FedNova's n_i and n_i ||a_i||_1).
    """

    shares: np.ndarray
    rule: str
    planned: float
    fixed: float = 1.0
    extras: tuple[dict[str, float], ...] = field(default=())

    def extras_of(self, k: int) -> dict[str, float]:
        """The named scalars of reply k (empty for the FedAvg schemes)."""
        return self.extras[k] if self.extras else {}

    def scale(self, acc: WeightedModelSum) -> float:
        """The scale of ``acc.update`` once the accepted replies are in ``acc``."""
        return self._scale(acc.total, acc.count, acc.extras)

    def values(self, accepted: Sequence[int] | None = None) -> np.ndarray:
        """c_k of the accepted replies (all by default), in their order."""
        idx = list(range(len(self.shares))) if accepted is None else list(accepted)
        total, sums = 0.0, {}
        for k in idx:
            total += float(self.shares[k])
            for name, amount in self.extras_of(k).items():
                sums[name] = sums.get(name, 0.0) + amount
        scale = self._scale(total, len(idx), sums)
        return np.array([scale * float(self.shares[k]) for k in idx])

    def _scale(self, total: float, count: int, sums: Mapping[str, float]) -> float:
        if self.rule == RENORMALISE:
            return 1.0 / total
        if self.rule == FIXED:
            return self.fixed
        if self.rule == PER_REPLY:
            return self.planned / count
        if self.rule == FEDNOVA:
            tau_eff = sums["na"] / sums["n"]
            return (tau_eff / sums["n"]) * self.planned
        raise ValueError(f"unknown coefficient rule {self.rule!r}")


def _coefficients(raw: np.ndarray, rule: str, **kwargs) -> Coefficients:
    planned = float(np.sum(raw))
    return Coefficients(raw / planned, rule, planned, **kwargs)


def coefficients_by_examples(num_examples: Sequence[float]) -> Coefficients:
    """c_k = n_k / m_t over the aggregated clients (McMahan et al., Algorithm 1, erratum)."""
    return _coefficients(_positive(num_examples, "num_examples"), RENORMALISE)


def coefficients_uniform(num_replies: int) -> Coefficients:
    """c_k = 1 / |S_t| (naive averaging)."""
    if num_replies < 1:
        raise ValueError(f"num_replies must be >= 1, got {num_replies}")
    return _coefficients(np.ones(num_replies), RENORMALISE)


def coefficients_pre_erratum(num_examples: Sequence[float], total_examples: float) -> Coefficients:
    """c_k = n_k / n with n over all clients (McMahan et al., Algorithm 1 before the erratum).

    The missing mass sum_{k not in S_t} n_k / n multiplies w_t, which the update form
    w_t + sum c_k (w_k - w_t) already does; a dropped reply keeps its mass on w_t too.
    """
    n = _positive(num_examples, "num_examples")
    if total_examples < n.sum():
        raise ValueError(f"total_examples ({total_examples}) is smaller than the sampled "
                         f"clients' examples ({n.sum()})")
    planned = float(np.sum(n))
    return Coefficients(n / planned, FIXED, planned, fixed=planned / float(total_examples))


def coefficients_scheme_i(draw_counts: Sequence[int]) -> Coefficients:
    """c_k = (#draws of k) / K: the plain mean over K draws with replacement (Scheme I)."""
    counts = np.asarray(draw_counts, dtype=np.float64)
    if counts.size == 0 or counts.sum() <= 0:
        raise ValueError("draw_counts must sum to at least 1")
    return _coefficients(counts, RENORMALISE)


def coefficients_scheme_ii(probabilities: Sequence[float], num_clients: int) -> Coefficients:
    """c_k = p_k N / K over the K aggregated of N clients sampled uniformly (Scheme II).

    Unbiased: E[sum_{k in S} p_k N / K] = 1; the sum is 1 only for balanced data.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.size == 0:
        raise ValueError("scheme-ii needs at least one reply")
    return _coefficients(p * num_clients, PER_REPLY)


def coefficients_fednova(num_examples: Sequence[float], a_norms: Sequence[float]) -> Coefficients:
    """FedNova's c_i = tau_eff p_i / ||a_i||_1 (Wang et al. 2020, eq. 6), so that

        w <- w - eta_g tau_eff sum_i p_i (w - w_i) / ||a_i||_1,
        tau_eff = sum_i p_i ||a_i||_1,  p_i = n_i / sum_j n_j

    over the accepted replies (r_i = n_i / ||a_i||_1; n_i and n_i ||a_i||_1 are summed
    alongside). All ||a_i||_1 equal gives FedAvg's sum_i p_i w_i.
    """
    n = _positive(num_examples, "num_examples")
    a = np.asarray(a_norms, dtype=np.float64)
    if len(a) != len(n):
        raise ValueError(f"{len(n)} num_examples but {len(a)} a_norms")
    if np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"a_norms must be finite and > 0, got {a.tolist()}")
    extras = tuple({"n": n_i, "na": n_i * a_i} for n_i, a_i in zip(n, a))
    return _coefficients(n / a, FEDNOVA, extras=extras)


def total_examples(sizes: Sequence[int | None]) -> float:
    """n = sum_k n_k over all clients; a size not known counts as the mean known size."""
    known = [k for k in sizes if k]
    fill = float(np.mean(known)) if known else 0.0
    return float(sum(k if k else fill for k in sizes))


def data_shares(sizes: Sequence[int | None]) -> np.ndarray | None:
    """p_k = n_k / n over the given clients, or None if a size is unknown."""
    if any(s is None or s <= 0 for s in sizes):
        return None
    arr = np.asarray(sizes, dtype=np.float64)
    return arr / arr.sum()


def add_scaled(acc: np.ndarray, value: np.ndarray, weight: float,
               scratch: np.ndarray | None = None) -> None:
    """acc += value * weight in place, the product in ``value``'s dtype (as ``value * weight``
    forms it), ``BLOCK`` elements at a time through ``scratch`` (a 1-D buffer of that dtype
    with at least ``BLOCK`` elements; allocated if not given).

    The same numbers as ``acc += value * weight`` without its array-sized temporary.
    """
    if acc.size <= BLOCK or acc.dtype != value.dtype or not (
            acc.flags.c_contiguous and value.flags.c_contiguous):
        acc += value * weight
        return
    flat_acc, flat_value = acc.reshape(-1), value.reshape(-1)  # views (C-contiguous)
    if scratch is None or scratch.dtype != value.dtype or scratch.size < BLOCK:
        scratch = np.empty(BLOCK, dtype=value.dtype)
    for start in range(0, flat_value.size, BLOCK):
        stop = min(start + BLOCK, flat_value.size)
        product = scratch[: stop - start]
        np.multiply(flat_value[start:stop], weight, out=product)
        np.add(flat_acc[start:stop], product, out=flat_acc[start:stop])


class WeightedModelSum:
    """S = sum_k r_k w_k over client models added one at a time, plus R = sum_k r_k: the one
    averaging kernel. The FedAvg family's rules add whole models (:meth:`add`); FedBuff adds
    staleness-weighted updates s(tau_k) Delta_k (Nguyen et al. 2022, Algorithm 1); sub-models
    add the entries they hold (:meth:`add_part`), with per-entry holder weights
    H = sum_{k holds the entry} r_k (HeteroFL, Diao et al. 2021, Sec. 3.1).

    Streaming: only the accumulator is held, and each client model is read in place
    (:func:`add_scaled`), never all clients at once. Floating arrays accumulate in the dtype
    they are added in (their own, as Flower's FedAvg does; callers that want float64 sums add
    float64 arrays); integer arrays (BatchNorm's ``num_batches_tracked``) in float64. NaN /
    Inf in a client's arrays survive every addition, so :meth:`non_finite_key` of the sum
    tells whether any client model had them.
    """

    def __init__(self) -> None:
        self.sum: NDArrays = {}
        self.held: NDArrays = {}  # per-entry holder weights of the keys added by add_part
        self.total = 0.0
        self.count = 0
        self.extras: dict[str, float] = {}
        self._scratch: dict[np.dtype, np.ndarray] = {}

    def add(self, arrays: Mapping[str, np.ndarray], weight: float, **extras: float) -> None:
        """S += weight * w_k, R += weight, and sums of any named scalars (``arrays`` are
        only read)."""
        for key, value in arrays.items():
            if np.issubdtype(value.dtype, np.floating):
                if key in self.sum:
                    scratch = self._scratch.get(value.dtype)
                    if scratch is None and value.size > BLOCK:
                        scratch = self._scratch[value.dtype] = np.empty(BLOCK, value.dtype)
                    add_scaled(self.sum[key], value, weight, scratch)
                else:  # value * weight, always a new writable array (also for 0-d)
                    self.sum[key] = np.multiply(value, weight, out=np.empty_like(value))
            else:
                term = value.astype(np.float64) * weight
                if key in self.sum:
                    self.sum[key] += term
                else:
                    self.sum[key] = term
        self.total += weight
        self.count += 1
        for name, amount in extras.items():
            self.extras[name] = self.extras.get(name, 0.0) + amount

    def add_part(self, key: str, value: np.ndarray, weight: float, mesh: tuple,
                 shape: tuple[int, ...]) -> None:
        """S[key][mesh] += weight * value and H[key][mesh] += weight: a sub-model's part
        (``mesh``, an ``np.ix_`` into the full ``shape``) of one array, summed in ``value``'s
        dtype. Call :meth:`finish_part` once per client after its parts."""
        if key not in self.sum:
            self.sum[key] = np.zeros(shape, value.dtype)
            self.held[key] = np.zeros(shape, np.float64)
        self.sum[key][mesh] += weight * value
        self.held[key][mesh] += weight

    def finish_part(self, weight: float) -> None:
        """R += weight for one client whose parts were added."""
        self.total += weight
        self.count += 1

    def held_mean(self, global_arrays: Mapping[str, np.ndarray]) -> NDArrays:
        """Each entry S / H where some client held it, else its global value, in the global
        array's dtype; integer arrays keep their global value (HeteroFL, Sec. 3.1)."""
        out: NDArrays = {}
        for key, value in global_arrays.items():
            value = np.asarray(value)
            if not np.issubdtype(value.dtype, np.floating):
                out[key] = np.array(value, copy=True)
                continue
            averaged = value.astype(np.float64)
            if key in self.sum:
                trained = self.held[key] > 0
                averaged[trained] = self.sum[key][trained] / self.held[key][trained]
            out[key] = averaged.astype(value.dtype)
        return out

    def non_finite_key(self) -> str | None:
        """The first key whose floating sum holds NaN or Inf (a client sent them, or the
        sum overflowed), or None."""
        return all_finite(self.sum)

    def mean(self) -> NDArrays:
        """S / R, computed in place in the sum's dtype (floating arrays: their own; integer
        arrays: float64). The sum is consumed: call once."""
        if self.count == 0:
            raise ValueError("no client model was added")
        mean, self.sum = self.sum, {}
        for value in mean.values():
            value /= np.asarray(self.total, dtype=value.dtype)
        return mean

    def update(self, global_arrays: Mapping[str, np.ndarray], scale: float,
               server_lr: float = 1.0) -> NDArrays:
        """w + eta_g scale (S - R w), i.e. w + eta_g sum_k c_k (w_k - w) with c_k = scale r_k.

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


def weighted_sum(models: Iterable[tuple[int, Mapping[str, np.ndarray]]],
                 coefficients: Coefficients) -> tuple[WeightedModelSum, list[int]]:
    """S = sum_k shares_k w_k over the (index k, model w_k) pairs, and the indices added."""
    acc, used = WeightedModelSum(), []
    for k, arrays in models:
        acc.add(arrays, float(coefficients.shares[k]), **coefficients.extras_of(k))
        used.append(k)
    return acc, used



def weighted_mean(models: Sequence[Mapping[str, np.ndarray]],
                  weights: Sequence[float]) -> NDArrays:
    """sum_k (r_k / sum r) w_k through :class:`WeightedModelSum`, floating arrays in their own
    dtype; the shares are normalised first, so a single model comes back unchanged. Integer
    arrays (not parameters) get the weighted mean, rounded, in their dtype."""
    r = np.asarray(weights, dtype=np.float64)
    if len(models) != len(r) or not len(r) or np.any(~np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"need one finite weight > 0 per model, got {r.tolist()} for "
                         f"{len(models)} model(s)")
    acc = WeightedModelSum()
    for model, share in zip(models, r / r.sum()):
        acc.add(model, float(share))
    mean = acc.mean()
    for key, value in models[0].items():
        if not np.issubdtype(value.dtype, np.floating):
            mean[key] = np.rint(mean[key]).astype(value.dtype)
    return mean

def streamed_update(
    global_arrays: Mapping[str, np.ndarray],
    models: Iterable[tuple[int, Mapping[str, np.ndarray]]],
    coefficients: Coefficients,
    server_lr: float = 1.0,
    *,
    on_reject: Callable[[int, str], None] | None = None,
) -> tuple[NDArrays | None, list[int], dict[str, float]]:
    """w + eta_g sum_k c_k (w_k - w) over the (index k, model w_k) pairs of ``models``.

    c_k is ``coefficients`` over the indices whose models are finite. NaN / Inf are looked
    for once, in the sum: a finite sum means every model was finite (they survive every
    addition). Otherwise each model is checked, those with NaN / Inf are left out
    (``on_reject(k, key)`` names them) and the sum is formed again over the rest; the
    models are therefore held until then (pass views, as :func:`strategies.engine.records.to_numpy`
    gives them, not copies). Models are only read. Returns the new model (None when no
    model is left), the indices used, and the sums of the coefficients' extras.
    """
    models = list(models)
    acc, used = weighted_sum(models, coefficients)
    if used and acc.non_finite_key() is not None:
        finite = []
        for k, arrays in models:
            bad_key = all_finite(arrays)
            if bad_key is None:
                finite.append((k, arrays))
            elif on_reject is not None:
                on_reject(k, bad_key)
        acc, used = weighted_sum(finite, coefficients)
    if not used:
        return None, used, {}
    return acc.update(global_arrays, coefficients.scale(acc), server_lr), used, dict(acc.extras)


def fednova_update(
    global_arrays: Mapping[str, np.ndarray],
    models: Iterable[tuple[int, Mapping[str, np.ndarray]]],
    coefficients: Coefficients,
    server_lr: float = 1.0,
    momentum_buffer: NDArrays | None = None,
    server_momentum: float = 0.0,
    *,
    on_reject: Callable[[int, str], None] | None = None,
) -> tuple[NDArrays | None, NDArrays | None, list[int], float | None]:
    """FedNova's round (Wang et al. 2020, eq. 6) with optional server momentum gamma:

        v <- gamma v + eta_g tau_eff sum_i p_i d_i,  w <- w - v,  d_i = (w - w_i) / ||a_i||_1

    ``coefficients`` from :func:`coefficients_fednova`; ``models`` and ``on_reject`` as in
    :func:`streamed_update`. Returns the new model (None when no model came), the new
    momentum buffer (None without momentum), the indices used and tau_eff.
    """
    new, used, sums = streamed_update(global_arrays, models, coefficients, server_lr,
                                      on_reject=on_reject)
    if new is None:
        return None, momentum_buffer, used, None
    new, buffer = apply_server_momentum(global_arrays, new, momentum_buffer, server_momentum)
    return new, buffer, used, sums["na"] / sums["n"]


def all_finite(arrays: Mapping[str, np.ndarray]) -> str | None:
    """The first key whose floating array holds NaN or Inf, or None.

    One summing pass per array: a finite sum means finite elements (NaN / Inf survive
    addition); only a non-finite sum (or an overflowing one) is checked element by element.
    """
    for key, value in arrays.items():
        if not np.issubdtype(value.dtype, np.floating):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.sum(value)
        if not np.isfinite(total) and not np.isfinite(value).all():
            return key
    return None


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


def copied(arrays: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """A copy of each array (None stays None): a server momentum buffer as state."""
    return None if arrays is None else {k: np.array(v, copy=True) for k, v in arrays.items()}


def apply_server_momentum(
    global_arrays: Mapping[str, np.ndarray], new: NDArrays, buffer: NDArrays | None, gamma: float,
    server_lr: float = 1.0,
) -> tuple[NDArrays, NDArrays | None]:
    """v <- gamma v + (w - w_new); w <- w - eta_g v, in float64, each floating array back in
    its dtype (integer arrays: ``new``'s). No buffer (v = 0) in the first round; gamma = 0
    with eta_g = 1 returns ``new`` and no buffer.

    FedNova passes its stepped model (eta_g inside v, eta_g = 1 here); FedAvgM (Hsu et al.
    2019, Sec. 3) the plain average, so Delta_t = w - w_new and w <- w - eta_g v.
    """
    if gamma <= 0 and server_lr == 1.0:
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
        moved = step if server_lr == 1.0 else server_lr * step
        out[key] = np.asarray(current.astype(np.float64) - moved).astype(current.dtype)
    return out, (new_buffer if gamma > 0 else None)


# ----------------------------------------------------------------- client drift
def squared_sum(values: np.ndarray) -> float:
    """sum of squares of a float64 array, in numpy's own single-threaded loop: BLAS dot
    products start threads, which stall when the clients keep every core busy."""
    flat = np.ravel(values)
    return float(np.einsum("i,i->", flat, flat))


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
        self.global_arrays = {k: v for k, v in global_arrays.items()
                              if np.issubdtype(v.dtype, np.floating)}
        self.layers: dict[str, list[str]] = {}
        for key in self.global_arrays:
            self.layers.setdefault(layer_of(key), []).append(key)
        # per layer: its keys' slices of one flat float64 vector (the layer's update)
        self.slices: dict[str, list[tuple[str, slice]]] = {}
        for layer, keys in self.layers.items():
            start, self.slices[layer] = 0, []
            for key in keys:
                size = self.global_arrays[key].size
                self.slices[layer].append((key, slice(start, start + size)))
                start += size
        self.scratch = {layer: np.empty(sl[-1][1].stop) for layer, sl in self.slices.items()}
        self.unit_sum: NDArrays = {}  # layer -> sum of the clients' unit update vectors
        self.unit_count: dict[str, int] = {}
        self.norms: list[float] = []

    def add(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Fold in one client's model (not modified)."""
        total = 0.0
        for layer, slices in self.slices.items():
            delta = self.scratch[layer]
            for key, part in slices:
                np.subtract(np.ravel(arrays[key]), np.ravel(self.global_arrays[key]),
                            out=delta[part], dtype=np.float64)
            norm2 = squared_sum(delta)
            total += norm2
            if norm2 == 0.0:
                continue
            delta *= 1.0 / np.sqrt(norm2)
            if layer in self.unit_sum:
                self.unit_sum[layer] += delta
            else:
                self.unit_sum[layer] = delta.copy()
            self.unit_count[layer] = self.unit_count.get(layer, 0) + 1
        self.norms.append(float(np.sqrt(total)))

    def summary(self) -> Drift:
        """The round's :class:`~strategies.engine.round_report.Drift`: per layer the mean pairwise
        cosine, their mean, and the mean and coefficient of variation of the update norms
        (cosines need at least two clients with a non-zero update)."""
        cosine = {}
        for layer in self.layers:
            k = self.unit_count.get(layer, 0)
            if k >= 2:
                s2 = squared_sum(self.unit_sum[layer])
                cosine[layer] = (s2 - k) / (k * (k - 1))
        mean = float(np.mean(self.norms)) if self.norms else None
        return Drift(
            cosine={layer: round(v, 6) for layer, v in cosine.items()} if cosine else None,
            cosine_mean=float(np.mean(list(cosine.values()))) if cosine else None,
            norm_mean=mean,
            norm_cv=(None if mean is None else
                     float(np.std(self.norms) / mean) if mean > 0 else 0.0))
