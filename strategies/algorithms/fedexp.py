"""FedExP (Jhunjhunwala, Wang and Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023): FedAvg whose server step size extrapolates from the clients'
update norms.

Round t, with Delta_i = w_i - w the update of client i, p_i its weight (n_i / sum n_j over
the round's accepted clients, the authors' code) and M the number of clients averaged:

    Delta_bar = sum_i p_i Delta_i
    eta_g     = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_bar||^2 + M epsilon_t)))
    w        <- w + eta_g Delta_bar

With all clients' updates aligned, ||Delta_bar||^2 = sum p_i ||Delta_i||^2 and eta_g = 1/2
-> 1: FedAvg; the more they disagree (client drift), the further the server extrapolates
(the paper's link to extrapolated projections onto convex sets, POCS). epsilon_t =
epsilon_0 d^(2t) (d = ``epsilon_decay``; the authors' experiments decay it by 0.998^2 per
round with the client lr). Read in the authors' code (github.com/Divyansh03/FedExP,
``main.py``: the step size, its max(1, .), the M epsilon term, the data-size weights p_i);
the paper's text and equation numbers were not available here. Not implemented: the
authors evaluate the average of the last two global models (``main.py``, evaluation only;
training goes on from w^(t+1)); fedhetero evaluates w^(t+1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..contract import Section, logged
from ..engine.algorithm import Algorithm, NDArrays, RoundInput, RoundUpdate
from ..engine.averaging import squared_sum
from ..engine.keys import FRACTION, Key, above
from ..engine.registry import register
from ..engine.round_engine import RoundEngine

__all__ = ["Extrapolation", "FedExP", "extrapolate", "squared_distance", "step_size"]

LOG_FEDEXP_ETA = "fedexp-eta"  # eta_g of the round
LOG_FEDEXP_EPSILON = "fedexp-epsilon"  # epsilon_t of the round


def squared_distance(model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
                     ) -> float:
    """||model - reference||^2 over the floating arrays, in float64."""
    return sum(squared_sum(np.subtract(model[key], value, dtype=np.float64))
               for key, value in reference.items() if np.issubdtype(value.dtype, np.floating))


def step_size(client_squares: Sequence[float], weights: Sequence[float], mean_square: float,
              epsilon: float) -> float:
    """eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_bar||^2 + M epsilon))) (module
    docstring), M = the number of clients."""
    spread = float(np.dot(np.asarray(weights, np.float64), np.asarray(client_squares, np.float64)))
    return max(1.0, spread / (2.0 * (mean_square + len(client_squares) * epsilon)))


def extrapolate(model: Mapping[str, np.ndarray], average: Mapping[str, np.ndarray],
                eta: float) -> NDArrays:
    """w + eta (average - w) for the floating arrays (in float64, each cast back to its
    dtype); the others (counters) are the average's."""
    return {key: (value + eta * (average[key].astype(np.float64) - value)).astype(value.dtype)
            if np.issubdtype(value.dtype, np.floating) else average[key]
            for key, value in model.items()}


@dataclass(frozen=True)
class FedExPSection(Section):
    """The round's server step size and epsilon."""

    eta: float = logged(LOG_FEDEXP_ETA, default=None)
    epsilon: float = logged(LOG_FEDEXP_EPSILON, default=None)


class Extrapolation(Algorithm):
    """FedExP's algorithm: the engine's weighted average Delta_bar, then the extrapolated
    step (module docstring)."""

    name = "FedExP"

    def __init__(self, epsilon: float = 1e-3, epsilon_decay: float = 1.0) -> None:
        if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"FedExP's epsilon must be a finite number > 0 (the authors use "
                             f"1e-3, 0.1 on EMNIST), got {epsilon!r}")
        if not (isinstance(epsilon_decay, (int, float)) and 0 < epsilon_decay <= 1):
            raise ValueError(f"FedExP's epsilon_decay must be in (0, 1] (the authors' 0.998), "
                             f"got {epsilon_decay!r}")
        self.epsilon, self.epsilon_decay = float(epsilon), float(epsilon_decay)

    def update(self, r: RoundInput) -> RoundUpdate:
        """Delta_bar (the engine's average), eta_g from the clients' update norms, then
        w + eta_g Delta_bar."""
        average, used = r.average()
        if average is None:
            return RoundUpdate(None, used)
        epsilon = self.epsilon * self.epsilon_decay ** (2 * r.server_round)
        squares = [squared_distance(r.models[k][1], r.global_arrays) for k in used]
        eta = step_size(squares, r.weights(used), squared_distance(average, r.global_arrays),
                        epsilon)
        return RoundUpdate(extrapolate(r.global_arrays, average, eta), used,
                           sections=[FedExPSection(eta, epsilon)])


class FedExP(RoundEngine):
    """FedExP: FedAvg with the server step size extrapolated from the clients' update norms.

    Parameters
    ----------
    epsilon : float
        epsilon_0 > 0 of the step size (1e-3: the authors' CIFAR-10/100 and CINIC-10 runs).
    epsilon_decay : float
        d in (0, 1]: epsilon_t = epsilon_0 d^(2t) (the authors decay by 0.998^2 per round
        with their client lr; 1: a fixed epsilon, default).
    weighting : str
        p_i: ``"examples"`` (n_i, the authors' code; default) or ``"uniform"``.
    **kwargs
        As :class:`~strategies.engine.round_engine.RoundEngine`; ``server_lr`` stays 1
        (FedExP sets the server step itself).

    Contract
    --------
    Flower's template: ``arrays`` and ``num-examples`` per reply; a stock ClientApp works.
    """

    def __init__(self, *flower_args, epsilon: float = 1e-3, epsilon_decay: float = 1.0,
                 weighting: str = "examples", **kwargs) -> None:
        if weighting not in FEDEXP_WEIGHTINGS:
            raise ValueError(f"FedExP weights the updates by 'examples' (the authors' code) or "
                             f"'uniform'; weighting={weighting!r} is not supported")
        if kwargs.get("server_lr", 1.0) != 1.0:
            raise ValueError(f"FedExP sets its server step size eta_g itself: server_lr must "
                             f"be 1.0, got {kwargs['server_lr']}")
        super().__init__(*flower_args, algorithm=Extrapolation(epsilon, epsilon_decay),
                         weighting=weighting, **kwargs)


FEDEXP_WEIGHTINGS = ("examples", "uniform")
KEYS = (Key("fedexp-epsilon", 1e-3, "FedExP's ε of the step size η_g = max(1, Σ p_i‖Δ_i‖² / "
            "(2(‖Δ̄‖² + M ε))) (1e-3: the authors' CIFAR runs)", interval=above(0.0),
            arg="epsilon"),
        Key("fedexp-epsilon-decay", 1.0, "d: ε_t = ε·d^(2t) (the authors' runs: 0.998; "
            "1 = fixed)", interval=FRACTION, arg="epsilon_decay"))
FEDEXP_WHY = "FedExP sets its server step size itself, from the clients' update norms"
register("fedexp", FedExP, "FedExP (Jhunjhunwala, Wang and Joshi 2023): FedAvg with the server "
         "step size extrapolated from the clients' update norms", keys=KEYS,
         only=(("weighting", FEDEXP_WEIGHTINGS, FEDEXP_WHY), ("server-lr", (1.0,), FEDEXP_WHY),
               ("server-momentum", (0.0,), FEDEXP_WHY)))
