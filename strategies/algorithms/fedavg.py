"""FedAvg (McMahan et al. 2017, Algorithm 1) with the weightings of McMahan et al. and Li et al.,
and FedAvgM's server momentum (Hsu, Qi and Brown 2019, Sec. 3).

Algorithm 1 is the round engine's default algorithm (:class:`~strategies.engine.algorithm.
Algorithm`): S_t = the participation model's m = max(floor(C K), 1) clients, w_t sent to
each, w_{t+1} = w_t + eta_g sum_{k in S_t} c_k (w_k - w_t) with c_k of the weighting
(:mod:`strategies.engine.averaging`; eta_g = 1 with c_k = n_k / m_t is Algorithm 1).

With server momentum beta > 0 the average is followed by FedAvgM's step
(:class:`ServerMomentum`): Delta_t = w_t - w_avg, w_avg = w_t + sum_k c_k (w_k - w_t) the
weighting's average (sum_k c_k w_k when the c_k sum to 1), then v <- beta v + Delta_t and
w_{t+1} = w_t - eta_g v, v = 0 before the first round. Hsu et al. write w <- w - v
(eta_g = 1); eta_g scales the step as in Flower's FedAvgM and PyTorch's SGD.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from .. import contract as C
from ..engine import averaging as agg
from ..engine import flower_args, trust_gate
from ..engine.algorithm import Algorithm, RoundInput, RoundUpdate
from ..engine.registry import register
from ..engine.round_engine import RoundEngine

__all__ = ["FedAvg", "ServerMomentum", "checked_server_momentum"]


def checked_server_momentum(value: object, owner: str = "FedAvg") -> float:
    """beta as a float when it is a number in [0, 1); else a ValueError naming the argument,
    the value and the fix."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(
            f"{owner}: server_momentum={value!r} is not a number in [0, 1): it is FedAvgM's "
            f"beta (Hsu et al. 2019, v <- beta v + Delta_t), and at 1 or above v never "
            f"forgets; use e.g. 0.9, or 0.0 for plain FedAvg (run config: server-momentum)")
    return float(value)


class ServerMomentum(Algorithm):
    """FedAvgM's server (Hsu et al. 2019, Sec. 3): the engine's average w_avg, then
    Delta_t = w_t - w_avg, v <- beta v + Delta_t, w_{t+1} = w_t - eta_g v. The buffer v
    (float64, floating arrays only) is its state; a round without a usable reply leaves it."""

    name = "FedAvgM"
    steps_from_average = True  # a robust rule may replace the average

    def __init__(self, server_momentum: float) -> None:
        self.server_momentum = checked_server_momentum(server_momentum, "ServerMomentum")
        self.momentum_buffer: agg.NDArrays | None = None

    def update(self, r: RoundInput) -> RoundUpdate:
        """The plain average (eta_g = 1), then the momentum step with eta_g = ``server_lr``."""
        average, used = r.average(server_lr=1.0)
        if average is None:
            return RoundUpdate(None, used)
        check_buffer_fits(self.momentum_buffer, r.global_arrays)
        new, buffer = agg.apply_server_momentum(r.global_arrays, average, self.momentum_buffer,
                                                self.server_momentum, r.server_lr)
        self.momentum_buffer = trust_gate.finite_or_previous(
            buffer, self.momentum_buffer, "FedAvgM's server momentum v", r.server_round)
        return RoundUpdate(new, used)

    def state_dict(self) -> dict:
        """The momentum buffer v (None before the first aggregated round), copied."""
        return {"momentum-buffer": agg.copied(self.momentum_buffer)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; a buffer that is not a mapping of names to
        finite float64 arrays is a ValueError saying so."""
        buffer = state.get("momentum-buffer")
        if buffer is not None:
            if not isinstance(buffer, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, np.ndarray) and v.dtype == np.float64
                    for k, v in buffer.items()):
                raise ValueError("the checkpoint's FedAvgM momentum buffer is not a mapping of "
                                 "parameter names to float64 arrays; start the run afresh "
                                 "(resume-from = \"\")")
            bad = trust_gate.non_finite_key(buffer)
            if bad is not None:
                raise ValueError(f"the checkpoint's FedAvgM momentum buffer has NaN or Inf in "
                                 f"{bad!r}; start the run afresh (resume-from = \"\")")
        self.momentum_buffer = agg.copied(buffer)


def check_buffer_fits(buffer: agg.NDArrays | None,
                      global_arrays: Mapping[str, np.ndarray]) -> None:
    """A ValueError when a (restored) momentum buffer does not fit the model: each floating
    array of the model needs an entry of its shape."""
    if buffer is None:
        return
    for key, value in global_arrays.items():
        if not np.issubdtype(value.dtype, np.floating):
            continue
        held = buffer.get(key)
        if held is None or held.shape != value.shape:
            shape = "none" if held is None else f"shape {list(held.shape)}"
            raise ValueError(f"FedAvgM's momentum buffer does not fit the model: {key!r} has "
                             f"{shape}, the model's is {list(value.shape)}; a checkpoint of "
                             f"another model? Start the run afresh (resume-from = \"\")")


class FedAvg(RoundEngine):
    """Federated Averaging (McMahan et al. 2017, Algorithm 1) with heterogeneity options.

    Takes Flower's ten FedAvg arguments, positional in Flower's order, and the engine's
    options (:class:`~strategies.engine.round_engine.RoundEngine`: ``weighting``,
    ``server_lr``, ``seed``, ``query_client_info``, stragglers, ``clock``,
    ``round_deadline``, ``over_commitment``, ``selection``, ``lr_schedule``,
    ``drift_diagnostics``, ``participation``, ``robust``).

    Parameters
    ----------
    server_momentum : float
        beta in [0, 1) of FedAvgM (Hsu et al. 2019, Sec. 3): v <- beta v + Delta_t,
        w <- w - eta_g v with Delta_t = w_t minus the weighted average and eta_g =
        ``server_lr`` (:class:`ServerMomentum`). 0.0 (default) is plain FedAvg, bit for bit.
        It composes with every option above: the momentum step follows the round's average.

    Contract
    --------
    Sends ``config`` with ``server-round`` plus the ``train_config`` given to ``start``
    (with ``lr`` = lr_t under ``lr_schedule``). Expects per reply an ArrayRecord ``arrays``
    with the global model's keys, shapes and dtypes and a MetricRecord ``metrics`` with
    ``num-examples`` > 0 (``train-loss`` or Flower's ``train_loss`` optional): what
    Flower's PyTorch template sends.
    """

    def __init__(
        self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1, min_evaluate_nodes: int = 1, min_available_nodes: int = 2,
        weighted_by_key: str = C.NUM_EXAMPLES, arrayrecord_key: str = C.ARRAYS,
        configrecord_key: str = C.CONFIG,
        train_metrics_aggr_fn: flower_args.MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: flower_args.MetricsAggregation | None = None, *,
        server_momentum: float = 0.0, **engine_options,
    ) -> None:
        beta = checked_server_momentum(server_momentum, type(self).__name__)
        if beta > 0:
            if engine_options.get("algorithm") is not None:
                raise TypeError(f"{type(self).__name__} got both algorithm= and "
                                f"server_momentum={server_momentum!r}; give one")
            engine_options["algorithm"] = ServerMomentum(beta)
        super().__init__(fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
                         min_available_nodes, weighted_by_key, arrayrecord_key,
                         configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn,
                         **engine_options)


register("fedavg", FedAvg, "Federated Averaging (McMahan et al. 2017, Alg. 1), with weighting, "
         "sampling, stragglers, clock and selection options; server-momentum > 0 is FedAvgM "
         "(Hsu et al. 2019) on the same engine", reads={"server-momentum": "server_momentum"})
register("fedsgd", FedAvg, "FedSGD (McMahan et al. 2017, Sec. 2): one full-batch gradient step "
         "per client", train_config={C.LOCAL_EPOCHS: 1, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 0})
