"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

The server is FedAvg's (any weighting of the engine) and sends ``proximal-mu``; each client
minimises h_k(w; w_t) = F_k(w) + (mu/2) ||w - w_t||^2 (eq. 2), i.e. adds mu (w - w_t) to
every local gradient (:class:`strategies.client.ProximalTerm`). Stragglers' partial work is
accepted by default (the paper's gamma-inexact solutions, Definition 1), where FedAvg drops
it.
"""

from __future__ import annotations

from .. import contract as C
from ..engine.algorithm import Algorithm, Contract, Outgoing
from ..engine.flower_args import FLOWER_ARGS
from ..engine.keys import Key, at_least
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan

__all__ = ["DEFAULT_PROXIMAL_MU", "FedProx", "Proximal"]

DEFAULT_PROXIMAL_MU = 0.01


class Proximal(Algorithm):
    """FedProx's algorithm: ``proximal-mu`` beside the model, FedAvg's update."""

    name = "FedProx"
    contract = Contract(helper="strategies.client.ProximalTerm")

    def __init__(self, proximal_mu: float = DEFAULT_PROXIMAL_MU) -> None:
        if isinstance(proximal_mu, bool) or not (isinstance(proximal_mu, (int, float))
                                                 and proximal_mu >= 0):
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        self.proximal_mu = float(proximal_mu)

    def send(self, plan: RoundPlan) -> Outgoing:
        """mu of eq. (2), to every client."""
        return Outgoing(common={C.PROXIMAL_MU: self.proximal_mu})


class FedProx(RoundEngine):
    """FedAvg + ``proximal-mu`` in every train config (Flower's key).

    Parameters
    ----------
    proximal_mu : float
        mu >= 0 of the proximal term (mu/2)||w - w_t||^2; 0 is exactly FedAvg. Default
        0.01 (Flower's FedProx: 0.0); positional after Flower's ten FedAvg arguments, as in
        Flower's FedProx.
    straggler_policy : str
        ``"partial"`` by default (FedProx accepts partial work); see
        :class:`~strategies.engine.round_engine.RoundEngine` for this and every other
        parameter.

    Contract
    --------
    As :class:`strategies.FedAvg`; the ClientApp must read ``config["proximal-mu"]`` and add
    mu (w - w_t) to its gradients (``strategies.client.ProximalTerm``, or
    ``strategies.client.local_sgd(..., proximal_mu=mu)``).
    """

    def __init__(self, *flower_args, proximal_mu: float | None = None,
                 straggler_policy: str = "partial", **kwargs) -> None:
        if len(flower_args) == len(FLOWER_ARGS) + 1:  # Flower's FedProx: mu after FedAvg's ten
            if proximal_mu is not None:
                raise TypeError("FedProx got proximal_mu both by position and by name")
            *flower_args, proximal_mu = flower_args
        mu = DEFAULT_PROXIMAL_MU if proximal_mu is None else proximal_mu
        super().__init__(*flower_args, algorithm=Proximal(mu), straggler_policy=straggler_policy,
                         **kwargs)


KEYS = (Key("proximal-mu", DEFAULT_PROXIMAL_MU,
            "FedProx's mu: clients minimise F_k(w) + (mu/2)·‖w − w_t‖² (0 = FedAvg exactly)",
            interval=at_least(0.0), arg="proximal_mu"),)
register("fedprox", FedProx, "FedProx (Li et al. 2020): proximal term mu; stragglers' partial "
         "work kept", keys=KEYS, client_side="strategies.client.fedprox")
