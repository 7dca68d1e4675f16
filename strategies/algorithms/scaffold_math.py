"""SCAFFOLD's control-variate arithmetic (Karimireddy et al., ICML 2020, Algorithm 1), numpy only.

Models and control variates are ``dict[str, np.ndarray]`` keyed by parameter name. The
control variates cover the model's floating arrays; :func:`zero_control` is c = c_i = 0.
The client helper (:class:`strategies.client.scaffold.ScaffoldClient`) and the server
strategy (:class:`strategies.algorithms.scaffold.Scaffold`) call these functions, so both sides
compute the same numbers:

* line 10, local step:  y_i <- y_i - eta_l (g_i(y_i) + c - c_i); the client helper applies
  the correction term with :func:`correction` = c - c_i (torch, once per step);
* line 12, option II:   c_i+ = c_i - c + (x - y_i) / (K eta_l)   (:func:`option_ii`);
* line 13:              delta c_i = c_i+ - c_i                    (:func:`control_delta`);
* line 14 (and the server's copy of it): c_i <- c_i + delta c_i    (:func:`apply_delta`,
  the same float operation on both sides, so client and server stay bit-identical);
* line 17:              c <- c + |S| / N * mean_{i in S} delta c_i (:func:`control_step`),
  N on a changing fleet: :func:`strategies.engine.client_states.clients_so_far`.

Floating point: option II is evaluated in float64 and rounded to the parameter dtype;
delta c_i and c_i + delta c_i are computed in the parameter dtype; the sum of the deltas
(:func:`add_delta`) accumulates in float64 and c is rounded back to its dtype.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NDArrays = dict[str, np.ndarray]


def zero_control(model: Mapping[str, np.ndarray]) -> NDArrays:
    """c = 0 for every floating array of ``model`` (Alg. 1, line 1: the initial c and c_i).

    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) have no gradient and no
    control variate.
    """
    return {key: np.zeros(np.shape(value), dtype=np.asarray(value).dtype)
            for key, value in model.items() if np.issubdtype(np.asarray(value).dtype, np.floating)}


def correction(control: Mapping[str, np.ndarray], client_control: Mapping[str, np.ndarray]
               ) -> NDArrays:
    """c - c_i, the term Alg. 1 line 10 adds to every local gradient."""
    return {key: np.asarray(control[key] - client_control[key]) for key in control}


def option_ii(client_control: Mapping[str, np.ndarray], control: Mapping[str, np.ndarray],
              global_model: Mapping[str, np.ndarray], local_model: Mapping[str, np.ndarray],
              steps: int, lr: float) -> NDArrays:
    """c_i+ = c_i - c + (x - y_i) / (K eta_l) (Alg. 1 line 12, option II).

    Keys of ``client_control`` missing from ``local_model`` (floating buffers that are not
    trained parameters) keep c_i+ = c_i. With plain SGD, (x - y_i) / (K eta_l) is the mean
    of the K corrected gradients g_i + c - c_i, so c_i+ is the mean local gradient g_i.
    """
    if steps < 1 or not lr > 0:
        raise ValueError(f"option II needs K >= 1 local steps and eta_l > 0, got K={steps}, "
                         f"eta_l={lr}")
    scale = 1.0 / (float(steps) * float(lr))
    out: NDArrays = {}
    for key, c_i in client_control.items():
        c_i = np.asarray(c_i)
        if key not in local_model:
            out[key] = np.array(c_i, copy=True)
            continue
        drift = (np.asarray(global_model[key], dtype=np.float64)
                 - np.asarray(local_model[key], dtype=np.float64))
        value = c_i.astype(np.float64) - np.asarray(control[key], dtype=np.float64) + drift * scale
        out[key] = value.astype(c_i.dtype)
    return out


def control_delta(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]) -> NDArrays:
    """delta c_i = c_i+ - c_i (Alg. 1 line 13), in the arrays' dtype."""
    return {key: np.asarray(new[key] - old[key]) for key in old}


def apply_delta(client_control: Mapping[str, np.ndarray], delta: Mapping[str, np.ndarray]
                ) -> NDArrays:
    """c_i <- c_i + delta c_i (Alg. 1 line 14): the client's new c_i and the server's copy.

    Both sides call this with the same arrays, so the two stay bit-identical (storing c_i+
    on the client instead could differ from the server's c_i + delta c_i in the last bit).
    """
    return {key: np.asarray(client_control[key] + np.asarray(delta[key],
                                                              dtype=client_control[key].dtype))
            for key in client_control}


def add_delta(total: NDArrays | None, delta: Mapping[str, np.ndarray]) -> NDArrays:
    """sum_i delta c_i, one client at a time, in float64 (``total`` None starts the sum)."""
    if total is None:
        return {key: np.asarray(value, dtype=np.float64).copy() for key, value in delta.items()}
    for key, value in delta.items():
        total[key] += np.asarray(value, dtype=np.float64)
    return total


def control_step(control: Mapping[str, np.ndarray], delta_sum: Mapping[str, np.ndarray],
                 num_accepted: int, num_clients: int) -> NDArrays:
    """c <- c + |S| / N * mean_{i in S} delta c_i (Alg. 1 line 17), with |S| the clients whose
    delta c_i arrived and N all clients (on a changing fleet:
    :func:`strategies.engine.client_states.clients_so_far`).

    Starting from c = c_i = 0 and with N the same every round, this keeps
    c = (1 / N) sum_{all i} c_i exactly in math (the server's copies of c_i, 0 for a client
    never heard from), however many clients fail in a round. When N changes between rounds
    it does not: c keeps (1 / N_old) sum_i c_i of the rounds before.
    """
    if num_accepted < 1 or num_clients < num_accepted:
        raise ValueError(f"need 1 <= |S| <= N, got |S|={num_accepted}, N={num_clients}")
    weight = num_accepted / num_clients
    return {key: (np.asarray(c, dtype=np.float64)
                  + weight * (np.asarray(delta_sum[key], dtype=np.float64) / num_accepted)
                  ).astype(np.asarray(c).dtype)
            for key, c in control.items()}


def norm(arrays: Mapping[str, np.ndarray]) -> float:
    """||c||_2 over all arrays (a run-log diagnostic)."""
    return float(np.sqrt(sum(float(np.vdot(v, v)) for v in arrays.values())))



DELTA_TOLERANCE = 1e-3
"""Relative slack of :func:`delta_bound` for rounding (option II is evaluated in float64
and rounded to the parameter dtype: ~6e-8 relative; 1e-3 also admits clients that evaluate
it in float32 or in another order)."""


def delta_bound(control: Mapping[str, np.ndarray], global_model: Mapping[str, np.ndarray],
                local_model: Mapping[str, np.ndarray], steps: int, lr: float,
                tolerance: float = DELTA_TOLERANCE) -> float:
    """The largest ||delta c_i||_2 option II can produce for this reply:

        delta c_i = c_i+ - c_i = -c + (x - y_i) / (K eta_l)          (Alg. 1 lines 12-13)
        ||delta c_i|| <= ||c|| + ||x - y_i|| / (K eta_l)              (triangle inequality)

    from what the server knows: the c and x it sent, the y_i of the reply, the eta_l it
    sent, and K (the reply's ``local-steps``; 1, the loosest, when it reports none), times
    1 + ``tolerance`` for rounding. Over c's keys (a key not in ``local_model`` moves 0).
    """
    c2 = drift2 = 0.0
    for key, c in control.items():
        c64 = np.asarray(c, dtype=np.float64)
        c2 += float(np.vdot(c64, c64))
        if key in local_model:
            d = (np.asarray(global_model[key], dtype=np.float64)
                 - np.asarray(local_model[key], dtype=np.float64))
            drift2 += float(np.vdot(d, d))
    bound = np.sqrt(c2) + np.sqrt(drift2) / (float(steps) * float(lr))
    return float(bound * (1.0 + tolerance) + 1e-12)


def delta_norm(delta: Mapping[str, np.ndarray]) -> float:
    """||delta c_i||_2 over all arrays, in float64."""
    total = 0.0
    for value in delta.values():
        v = np.asarray(value, dtype=np.float64)
        total += float(np.vdot(v, v))
    return float(np.sqrt(total))
