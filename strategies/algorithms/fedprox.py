"""FedProx (Li et al., MLSys'20): FedAvg's server plus a proximal term on the client.

The server side is FedAvg (any weighting scheme of this package) that also sends
``proximal-mu``; each client minimises F_k(w) + (mu/2) ||w - w_t||^2, i.e. adds
mu (w - w_t) to every local gradient. Stragglers' partial work is accepted by default
(the paper's gamma-inexact solutions), where FedAvg drops it.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import ConfigRecord
from flwr.common.logger import log

from .. import contract as C
from .fedavg import FedAvg
from ..engine.flower_args import FLOWER_ARGS
from ..engine.round_plan import ClientTask, RoundPlan


DEFAULT_PROXIMAL_MU = 0.01


class FedProx(FedAvg):
    """FedAvg + ``proximal-mu`` in every train config (Flower's key).

    Parameters
    ----------
    proximal_mu : float
        mu >= 0 of the proximal term (mu/2)||w - w_t||^2; 0 is exactly FedAvg. Default
        0.01 (Flower's FedProx: 0.0); positional after Flower's ten FedAvg arguments, as in
        Flower's FedProx.
    straggler_policy : str
        ``"partial"`` by default (FedProx accepts partial work); see :class:`FedAvg`
        for this and every other parameter.

    Contract
    --------
    As :class:`FedAvg`; the ClientApp must read ``config["proximal-mu"]`` and add
    mu (w - w_t) to its gradients (``strategies.client.ProximalTerm``, or
    ``strategies.client.local_sgd(..., proximal_mu=mu)``).
    """

    def __init__(self, *flower_args, proximal_mu: float | None = None,
                 straggler_policy: str = "partial", **kwargs) -> None:
        if len(flower_args) == len(FLOWER_ARGS) + 1:  # Flower's FedProx: mu after FedAvg's ten
            if proximal_mu is not None:
                raise TypeError("FedProx got proximal_mu both by position and by name")
            *flower_args, proximal_mu = flower_args
        proximal_mu = DEFAULT_PROXIMAL_MU if proximal_mu is None else proximal_mu
        if not (isinstance(proximal_mu, (int, float)) and proximal_mu >= 0):
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        super().__init__(*flower_args, straggler_policy=straggler_policy, **kwargs)
        self.proximal_mu = float(proximal_mu)

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> Proximal mu: %s", self.proximal_mu)
        super().summary()

    def task_config(self, plan: RoundPlan, task: ClientTask) -> ConfigRecord:
        """FedAvg's per-client config with ``proximal-mu``."""
        config = super().task_config(plan, task)
        config[C.PROXIMAL_MU] = self.proximal_mu
        return config
