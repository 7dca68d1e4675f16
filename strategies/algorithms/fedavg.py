"""FedAvg (McMahan et al. 2017, Algorithm 1) with the weightings of McMahan et al. and Li et al.

Algorithm 1 is the round engine's default algorithm (:class:`~strategies.engine.algorithm.
Algorithm`): S_t = the participation model's m = max(floor(C K), 1) clients, w_t sent to
each, w_{t+1} = w_t + eta_g sum_{k in S_t} c_k (w_k - w_t) with c_k of the weighting
(:mod:`strategies.engine.averaging`; eta_g = 1 with c_k = n_k / m_t is Algorithm 1).
"""

from __future__ import annotations

from .. import contract as C
from ..engine.registry import register
from ..engine.round_engine import RoundEngine

__all__ = ["FedAvg"]


class FedAvg(RoundEngine):
    """Federated Averaging (McMahan et al. 2017, Algorithm 1) with heterogeneity options.

    Takes Flower's ten FedAvg arguments, positional in Flower's order, and the engine's
    options (:class:`~strategies.engine.round_engine.RoundEngine`: ``weighting``,
    ``server_lr``, ``seed``, ``query_client_info``, stragglers, ``clock``,
    ``round_deadline``, ``over_commitment``, ``selection``, ``lr_schedule``,
    ``drift_diagnostics``, ``participation``).

    Contract
    --------
    Sends ``config`` with ``server-round`` plus the ``train_config`` given to ``start``
    (with ``lr`` = lr_t under ``lr_schedule``). Expects per reply an ArrayRecord ``arrays``
    with the global model's keys, shapes and dtypes and a MetricRecord ``metrics`` with
    ``num-examples`` > 0 (``train-loss`` or Flower's ``train_loss`` optional): what
    Flower's PyTorch template sends.
    """


register("fedavg", FedAvg, "Federated Averaging (McMahan et al. 2017, Alg. 1), with weighting, "
         "sampling, stragglers, clock and selection options")
register("fedsgd", FedAvg, "FedSGD (McMahan et al. 2017, Sec. 2): one full-batch gradient step "
         "per client", train_config={C.LOCAL_EPOCHS: 1, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 0})
