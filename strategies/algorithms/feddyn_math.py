"""FedDyn's arithmetic (Acar et al., ICLR 2021, Algorithm 1), numpy only.

Models, linear terms and h are ``dict[str, np.ndarray]`` keyed by array name and cover the
model's floating arrays (:func:`zero_state`). The client helper
(:class:`strategies.client.feddyn.FedDynClient`) and the server strategy
(:class:`strategies.algorithms.feddyn.FedDyn`) call these functions, so both sides compute the same
numbers:

* client objective: L_k(theta) - <grad L_k(theta_k^{t-1}), theta>
  + (alpha / 2) ||theta - theta^{t-1}||^2; the client helper adds its gradient
  alpha (theta - theta^{t-1}) - grad L_k(theta_k^{t-1}) to every local gradient (torch);
* after local training, the linear term (the client's state, and the server's copy of it):
  grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})
  (:func:`linear_term_update`);
* server state: h^t = h^{t-1} - alpha (1 / m) sum_{k in P_t} (theta_k^t - theta^{t-1}),
  m = all clients (:func:`add_drift`, :func:`h_step`; m on a changing fleet:
  :func:`strategies.engine.client_states.clients_so_far`);
* server model: theta^t = (1 / |P_t|) sum_{k in P_t} theta_k^t - (1 / alpha) h^t
  (:func:`server_model`, applied to the average the strategy computes).

The h update: the paper prints ``h^{t-1} - alpha (1/m) (sum_{k in P_t} theta_k^t -
theta^{t-1})``. We implement sum_{k in P_t} (theta_k^t - theta^{t-1}), as the authors' code
does (``local_param_list[k] += theta_k - theta^{t-1}``; ``cld_mdl_param = avg +
mean over all clients of local_param_list``). Only this reading keeps h^t equal to the mean
over all m clients of their linear terms, (1 / m) sum_k grad L_k(theta_k^t), the quantity
Algorithm 1's derivation needs (with m fixed: a change of m between rounds breaks it, see
:func:`h_step`); the literal one would move h by (|P_t| - 1) theta^{t-1} / m even when no
client moved. With |P_t| = 1 the two agree.

Floating point: every update is evaluated in float64 and rounded to the array's dtype; the
sum of the drifts accumulates in float64.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NDArrays = dict[str, np.ndarray]


def floating_arrays(model: Mapping[str, np.ndarray]) -> NDArrays:
    """The floating arrays of ``model``: what FedDyn's linear terms and h cover.

    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) have no gradient and no
    linear term; they are averaged as FedAvg does.
    """
    return {key: np.asarray(value) for key, value in model.items()
            if np.issubdtype(np.asarray(value).dtype, np.floating)}


def zero_state(model: Mapping[str, np.ndarray]) -> NDArrays:
    """Zeros for every floating array of ``model``: h^0 = 0 and grad L_k(theta_k^0) = 0."""
    return {key: np.zeros(value.shape, dtype=value.dtype)
            for key, value in floating_arrays(model).items()}


def linear_term_update(linear_term: Mapping[str, np.ndarray], alpha: float,
                       local_model: Mapping[str, np.ndarray],
                       global_model: Mapping[str, np.ndarray]) -> NDArrays:
    """grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}).

    The client's new state and the server's copy of it (both sides call this with the same
    arrays, so the two stay bit-identical). Keys missing from ``local_model`` keep their
    linear term.
    """
    if not alpha > 0:
        raise ValueError(f"FedDyn needs alpha > 0, got {alpha}")
    out: NDArrays = {}
    for key, g in linear_term.items():
        g = np.asarray(g)
        if key not in local_model:
            out[key] = np.array(g, copy=True)
            continue
        drift = (np.asarray(local_model[key], np.float64)
                 - np.asarray(global_model[key], np.float64))
        out[key] = (g.astype(np.float64) - float(alpha) * drift).astype(g.dtype)
    return out


def add_drift(total: NDArrays | None, local_model: Mapping[str, np.ndarray],
              global_model: Mapping[str, np.ndarray], keys: Mapping[str, object]) -> NDArrays:
    """sum_{k in P_t} (theta_k^t - theta^{t-1}) over the arrays named in ``keys``, one client at
    a time, in float64 (``total`` None starts the sum)."""
    if total is None:
        total = {key: np.zeros(np.shape(global_model[key]), np.float64) for key in keys}
    for key in keys:
        total[key] += (np.asarray(local_model[key], np.float64)
                       - np.asarray(global_model[key], np.float64))
    return total


def h_step(h: Mapping[str, np.ndarray], drift_sum: Mapping[str, np.ndarray], alpha: float,
           num_clients: int) -> NDArrays:
    """h^t = h^{t-1} - alpha (1 / m) sum_{k in P_t} (theta_k^t - theta^{t-1}), m = ``num_clients``
    (all clients, not |P_t|: the authors' code; see the module docstring).

    From h^0 = 0 and with m the same every round, h^t is the mean over the m clients of
    their linear terms; when m changes between rounds it is not: h keeps (1 / m_old) sum_k
    of the rounds before (:func:`strategies.engine.client_states.clients_so_far`)."""
    if num_clients < 1 or not alpha > 0:
        raise ValueError(f"need m >= 1 clients and alpha > 0, got m={num_clients}, "
                         f"alpha={alpha}")
    scale = float(alpha) / num_clients
    return {key: (np.asarray(value, np.float64) - scale * np.asarray(drift_sum[key], np.float64)
                  ).astype(np.asarray(value).dtype)
            for key, value in h.items()}


def server_model(average: Mapping[str, np.ndarray], h: Mapping[str, np.ndarray],
                 alpha: float) -> NDArrays:
    """theta^t = ``average`` - (1 / alpha) h^t on the arrays of h; the others (integer
    buffers) are the average unchanged."""
    if not alpha > 0:
        raise ValueError(f"FedDyn needs alpha > 0, got {alpha}")
    out = dict(average)
    for key, value in h.items():
        mean = np.asarray(average[key])
        out[key] = (mean.astype(np.float64) - np.asarray(value, np.float64) / float(alpha)
                    ).astype(mean.dtype)
    return out


def norm(arrays: Mapping[str, np.ndarray]) -> float:
    """||h||_2 over all arrays (a run-log diagnostic)."""
    return float(np.sqrt(sum(float(np.vdot(v, v)) for v in arrays.values())))
