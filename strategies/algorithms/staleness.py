"""The math of asynchronous aggregation: staleness weights, FedBuff's server step, FedAsync's mix.

Staleness tau of a client update = the server's model version when the update is applied
minus the version the client trained from.

* FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
  AISTATS 2022, Algorithm 1): the buffer sums s(tau_k) Delta_k of K client updates
  (Delta_k = y_k - x^(v_k), the client's model minus the model it was sent), then
  x <- x + eta_g Delta_bar with Delta_bar = (1/K) sum_k s(tau_k) Delta_k (Sec. 3;
  optionally through server momentum: m <- beta m + Delta_bar, x <- x + eta_g m);
  s(tau) = 1 / sqrt(1 + tau) by default (Sec. 5, "staleness scaling").
* FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019,
  Algorithm 1 and Sec. 3): x_t = (1 - alpha_t) x_(t-1) + alpha_t x_new with
  alpha_t = alpha s(t - tau); s is constant (s = 1), polynomial s_a(d) = (d + 1)^(-a) or
  hinge s_(a,b)(d) = 1 for d <= b, 1 / (a (d - b) + 1) otherwise
  (:func:`fedasync_weight`).

FedAsync's t - tau of an update trained from the newest model. The authors' code
(xcgoner/async_fl, ``train_cifar10_mxnet_fedasync_singlethread_impl.py``) stamps the model
made in its server epoch e with e + 1 and computes ``worker_delay = epoch - worker_ts``: 0
for a worker that pulled the newest model, so s(0) = 1 and a fresh update mixes at alpha.
Algorithm 1 read literally gives 1: its Updater makes x_t at epoch t, and the newest model
a worker can have pulled is x_(t-1), stamped t - 1. The default is the authors' (t - tau =
the model versions made since the client's, ``fresh_staleness`` 0); ``fresh_staleness`` 1
is the literal reading (alpha s(1): alpha / sqrt(2) with the polynomial s, a = 0.5).

Pure functions of numpy arrays; the strategies (:mod:`strategies.algorithms.fedbuff`,
:mod:`strategies.algorithms.fedasync`) call exactly these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..engine.averaging import WeightedModelSum
from ..engine.keys import Key

__all__ = ["FRESH_STALENESS", "STALENESS_FUNCTIONS", "STALENESS_KEY", "Staleness", "add_update",
           "check_fresh_staleness", "fedasync_mix", "fedasync_weight", "fedbuff_step"]

STALENESS_FUNCTIONS = ("fedbuff", "constant", "polynomial", "hinge")
STALENESS_KEY = Key(
    "async-staleness", "auto",
    "s(τ), the weight of an update τ model versions old: `fedbuff` 1/√(1+τ), `constant`, "
    "`polynomial` (τ+1)^−0.5, `hinge` (1 for τ ≤ 4, else 1/(10(τ−4)+1)); `auto` = `fedbuff` for "
    "`fedbuff`, `polynomial` for `fedasync`", choices=("auto", *STALENESS_FUNCTIONS),
    arg="staleness", auto="auto")

FRESH_STALENESS = (0, 1)
"""FedAsync's t - tau of an update trained from the newest model: 0 (the authors' code) or
1 (Algorithm 1 read literally); see the module docstring."""

NDArrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Staleness:
    """s(tau), the weight of an update ``tau`` model versions old.

    ``"fedbuff"``: 1 / sqrt(1 + tau) (FedBuff, Sec. 5). ``"constant"``: 1.
    ``"polynomial"``: (tau + 1)^(-a) (FedAsync, Sec. 3; a = 0.5 in its experiments).
    ``"hinge"``: 1 for tau <= b, else 1 / (a (tau - b) + 1) (FedAsync, Sec. 3; a = 10,
    b = 4 in its experiments). Without ``a``, the paper's for the function.
    """

    name: str = "fedbuff"
    a: float | None = None  # None: the paper's, 0.5 (polynomial) or 10 (hinge)
    b: float = 4.0

    def __post_init__(self) -> None:
        if self.name not in STALENESS_FUNCTIONS:
            raise ValueError(f"staleness={self.name!r} is not known; use one of "
                             f"{', '.join(STALENESS_FUNCTIONS)}")
        if self.a is None:
            object.__setattr__(self, "a", 10.0 if self.name == "hinge" else 0.5)
        for key in ("a", "b"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) and value >= 0):
                raise ValueError(f"staleness parameter {key} must be a finite number >= 0, "
                                 f"got {value!r}")

    def __call__(self, tau: int) -> float:
        if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau < 0:
            raise ValueError(f"staleness must be a whole number >= 0, got {tau!r}")
        if self.name == "fedbuff":
            return 1.0 / math.sqrt(1.0 + tau)
        if self.name == "constant":
            return 1.0
        if self.name == "polynomial":
            return float((tau + 1.0) ** (-self.a))
        return 1.0 if tau <= self.b else 1.0 / (self.a * (tau - self.b) + 1.0)

    def __str__(self) -> str:
        if self.name == "polynomial":
            return f"polynomial (a={self.a:g})"
        if self.name == "hinge":
            return f"hinge (a={self.a:g}, b={self.b:g})"
        return "1/sqrt(1+tau)" if self.name == "fedbuff" else "constant"


def fedbuff_step(model: NDArrays, buffer: NDArrays, count: int, server_lr: float,
                 momentum: float = 0.0, velocity: NDArrays | None = None
                 ) -> tuple[NDArrays, NDArrays | None]:
    """FedBuff's server update (Algorithm 1) from ``buffer`` = sum_k s(tau_k) Delta_k of
    ``count`` = K updates: Delta_bar = buffer / K, then x + eta_g Delta_bar; with server
    momentum beta > 0, m = beta m + Delta_bar and x + eta_g m. Returns the new model (each
    array in its own dtype) and the new momentum buffer (None without momentum)."""
    if count < 1:
        raise ValueError(f"a server step needs at least one buffered update, got {count}")
    step = {key: value / count for key, value in buffer.items()}
    if momentum > 0 and velocity is not None:
        step = {key: momentum * velocity[key] + value for key, value in step.items()}
    new = {key: (x + server_lr * step[key]).astype(x.dtype, copy=False)
           for key, x in model.items()}
    return new, (step if momentum > 0 else None)


def check_fresh_staleness(value: object) -> int:
    """``value`` if it is one of :data:`FRESH_STALENESS`, else a ValueError naming the fix."""
    if isinstance(value, bool) or value not in FRESH_STALENESS:
        raise ValueError(f"fresh_staleness (run config fedasync-fresh-staleness) is t - tau of "
                         f"an update trained from the newest model: 0 (the authors' code) or 1 "
                         f"(Algorithm 1 read literally), got {value!r}")
    return int(value)


def fedasync_weight(alpha: float, staleness: Staleness, versions_behind: int,
                    fresh_staleness: int = 0) -> float:
    """FedAsync's mixing weight alpha_t = alpha s(t - tau) (Algorithm 1), with
    t - tau = ``versions_behind`` (the server model versions made since the one the client
    trained from: 0 for the newest) + ``fresh_staleness`` (0: the authors' code, 1:
    Algorithm 1 read literally; module docstring)."""
    return alpha * staleness(versions_behind + check_fresh_staleness(fresh_staleness))


def fedasync_mix(model: NDArrays, client: NDArrays, alpha_t: float) -> NDArrays:
    """FedAsync's update (Algorithm 1): (1 - alpha_t) x + alpha_t x_new, in x's dtypes."""
    if not 0.0 <= alpha_t <= 1.0:
        raise ValueError(f"the mixing weight alpha_t must be in [0, 1], got {alpha_t}")
    return {key: ((1.0 - alpha_t) * x.astype(np.float64)
                  + alpha_t * client[key].astype(np.float64)).astype(x.dtype, copy=False)
            for key, x in model.items()}


def add_update(buffer: WeightedModelSum, sent: NDArrays, client: NDArrays,
               weight: float) -> WeightedModelSum:
    """``buffer`` += weight (client - sent), Delta_k of FedBuff's Algorithm 1 weighted by
    s(tau_k), summed in float64 by the one averaging kernel (``buffer.sum`` holds
    sum_k s(tau_k) Delta_k, ``buffer.count`` = k)."""
    buffer.add({key: client[key].astype(np.float64) - x.astype(np.float64)
                for key, x in sent.items()}, weight)
    return buffer
