"""FjORD (Horvath, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and
Accurate Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS
2021), server side.

Sec. 3.1: Ordered Dropout keeps the left-most ceil(p K_l) units of every layer l, p from a
discrete set P with a distribution D_P (uniform in the paper's experiments). Sec. 4 and
Algorithm 1: client i is sent its p_max^i sub-model and, at each local iteration, samples p
from D_P conditioned on p <= p_max^i (its client side:
:func:`strategies.client.ordered_dropout_sgd`); Eq. (2): each slice w_{s_j} minus w_{s_{j-1}}
is the average over the clients whose p_max holds it, weighted by their amount of data. The
engine's :class:`~strategies.engine.submodels.SubModels` does the sub-models. Not implemented: the
self-distillation of Eq. (1) (Sec. 3.2, "Subnetwork Knowledge Transfer" in Sec. 4).
Numbering from the NeurIPS 2021 submission's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import contract as C
from ..engine.algorithm import Algorithm, Contract, Outgoing
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan
from ..engine.submodels import DEFAULT_LEVELS
from .heterofl import WIDTH_REGISTRATION, width_engine_args

__all__ = ["FjORD", "OrderedDropout"]


class OrderedDropout(Algorithm):
    """FjORD's algorithm: each client's levels p <= p_max beside its p_max sub-model (the
    engine's), FedAvg's overlap average."""

    name = "FjORD"
    contract = Contract(helper="strategies.client.ordered_dropout_sgd")

    def __init__(self, levels: Sequence[float]) -> None:
        self.levels = tuple(float(r) for r in levels)

    def send(self, plan: RoundPlan) -> Outgoing:
        """``width-levels``: the levels p <= p_max of each client (Sec. 4, Algorithm 1)."""
        return Outgoing(per_node={
            node: {C.WIDTH_LEVELS: sorted(r for r in set(self.levels)
                                          if r <= float(task.config[C.MODEL_WIDTH]))}
            for node, task in plan.tasks.items()})


class FjORD(RoundEngine):
    """FjORD: static sub-models up to each client's p_max, ordered dropout on the client
    (``width-levels``), example-weighted overlap averaging. Arguments as
    :class:`~strategies.algorithms.heterofl.HeteroFL`; ``weighting`` defaults to
    ``"examples"``.

    Contract
    --------
    Sends ``arrays`` = the p_max sub-model, config ``model-width`` = p_max and
    ``width-levels`` = the levels p <= p_max; expects back the p_max sub-model (keys, shapes,
    dtypes) and ``num-examples``. :func:`strategies.client.ordered_dropout_sgd` runs the
    local steps.

    Notes
    -----
    The clock charges every local step at p_max (the deadline rule gives each client the
    largest p_max whose steps all fit): an upper bound, since the sampled p <= p_max cost
    less.
    """

    def __init__(self, *flower_args, width_spec=None, levels=DEFAULT_LEVELS,
                 width_rule: str | None = None, level_compute=None, scaler: bool = False,
                 weighting: str = "examples", **kwargs) -> None:
        super().__init__(*flower_args, algorithm=OrderedDropout(levels), **width_engine_args(
            "FjORD", "static", {**kwargs, "weighting": weighting}, width_spec=width_spec,
            levels=levels, width_rule=width_rule, level_compute=level_compute, scaler=scaler))


register("fjord", FjORD, "FjORD (Horvath et al. 2021): ordered dropout up to each client's width "
         "(client helper)", client_side="strategies.client.width", **WIDTH_REGISTRATION)
