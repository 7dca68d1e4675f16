"""FedNova's client side: report the local steps tau_i (and ||a_i||_1 when it is not SGD's).

FedNova (Wang et al., NeurIPS 2020) normalises each client's update by ||a_i||_1, which
for plain SGD is the number of local steps tau_i (eq. 6; momentum and proximal SGD have
closed forms the server computes from the config it sent). A client that reports the
steps it actually took makes the server's normalisation exact whatever its loop does::

    metrics = report_local_steps(metrics, loader_steps(trainloader, epochs))

Without the report the server has to derive tau_i from ``local-epochs`` and ``batch-size``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import contract as C


def report_local_steps(metrics: Mapping[str, Any], local_steps: int,
                       a_norm: float | None = None) -> dict:
    """``metrics`` plus FedNova's reply metrics ``local-steps`` (and ``a-norm``).

    Parameters
    ----------
    metrics
        The reply's metrics so far (not changed; a new dict is returned).
    local_steps
        tau_i, the optimiser steps this client took in the round (>= 1). A client that
        took none has no FedNova update (d_i = (w - w_i) / ||a_i||_1 of Wang et al. 2020,
        eq. 6, is 0 / 0): 0 raises, and the server leaves the (error) reply out, as it
        leaves out a reply reporting 0 steps and a stock client whose derived tau_i is 0.
    a_norm
        ||a_i||_1 (Wang et al. eq. 6) when the local solver is neither plain, momentum nor
        proximal SGD as configured by the server; None lets the server compute it.
    """
    steps = int(local_steps)
    if steps != local_steps or steps < 1:
        raise ValueError(f"local_steps must be a whole number of steps >= 1, got {local_steps}: "
                         f"a client that took no step has no FedNova update (its reply is "
                         f"left out of the round either way)")
    out = dict(metrics)
    out[C.LOCAL_STEPS_TAKEN] = steps
    if a_norm is not None:
        value = float(a_norm)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a_norm must be finite and > 0, got {a_norm}")
        out[C.A_NORM] = value
    return out


def loader_steps(loader: Any, epochs: int = 1) -> int:
    """Optimiser steps of ``epochs`` passes over a DataLoader: E * len(loader).

    ``len(loader)`` is ceil(n / B) with ``drop_last=False`` and floor(n / B) with
    ``drop_last=True``, exactly the steps a stock ``for batch in loader`` loop takes.
    """
    if int(epochs) != epochs or epochs < 1:
        raise ValueError(f"epochs must be a whole number >= 1, got {epochs}")
    return int(epochs) * len(loader)
