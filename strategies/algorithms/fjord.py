"""FjORD (Horvath, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and
Accurate Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS
2021), server side.

Sec. 3.1: Ordered Dropout keeps the left-most ceil(p K_l) units of every layer l, p from a
discrete set P with a distribution D_P (uniform in the paper's experiments). Sec. 4 and
Algorithm 1: client i is sent its p_max^i sub-model and, at each local iteration, samples p
from D_P conditioned on p <= p_max^i (its client side:
:func:`strategies.client.ordered_dropout_sgd`); Eq. (2): each slice w_{s_j} minus w_{s_{j-1}}
is the average over the clients whose p_max holds it, weighted by their amount of data. The
shared machinery is :class:`strategies.engine.submodels.WidthFedAvg`. Not implemented: the
self-distillation of Eq. (1) (Sec. 3.2, "Subnetwork Knowledge Transfer" in Sec. 4).
Numbering from the NeurIPS 2021 submission's text.
"""

from __future__ import annotations

from flwr.app import ConfigRecord

from .. import contract as C
from ..engine.round_plan import ClientTask, RoundPlan
from ..engine.submodels import WidthFedAvg

__all__ = ["FjORD"]


class FjORD(WidthFedAvg):
    """FjORD: static sub-models up to each client's p_max, ordered dropout on the client
    (``width-levels``), example-weighted overlap averaging. Arguments as
    :class:`~strategies.engine.submodels.WidthFedAvg`; ``weighting`` defaults to
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

    CLIENT_HELPER = "strategies.client.ordered_dropout_sgd"
    SCHEME = "static"

    def __init__(self, *flower_args, weighting: str = "examples", **kwargs) -> None:
        super().__init__(*flower_args, weighting=weighting, **kwargs)

    def task_config(self, plan: RoundPlan, task: ClientTask) -> ConfigRecord:
        """WidthFedAvg's config plus ``width-levels``: the levels p <= p_max."""
        own = super().task_config(plan, task)
        p_max = float(own[C.MODEL_WIDTH])
        own[C.WIDTH_LEVELS] = sorted(r for r in self.rule.levels if r <= p_max)
        return own
