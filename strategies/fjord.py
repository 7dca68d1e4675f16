"""FjORD (Horvath, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and
Accurate Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS
2021), server side.

Sec. 3: Ordered Dropout keeps the left-most ceil(p K) units of every layer; a client of
maximum width p_max trains, at every local step, the sub-network of a p drawn uniformly
from the levels p <= p_max (its client side: :func:`strategies.client.ordered_dropout_sgd`)
and returns its p_max model; the server averages each entry over the clients that hold it,
weighted by their examples (as the authors' Flower baseline does). The shared machinery is
:class:`strategies.width_fedavg.WidthFedAvg`. Not implemented: the paper's optional
self-distillation from the p_max sub-network.
"""

from __future__ import annotations

from flwr.app import ConfigRecord

from . import contract as C
from .round_plan import ClientTask, RoundPlan
from .width_fedavg import WidthFedAvg

__all__ = ["FjORD"]


class FjORD(WidthFedAvg):
    """FjORD: static sub-models up to each client's p_max, ordered dropout on the client
    (``width-levels``), example-weighted overlap averaging. Arguments as
    :class:`~strategies.width_fedavg.WidthFedAvg`; ``weighting`` defaults to
    ``"examples"``.

    Contract
    --------
    Sends ``arrays`` = the p_max sub-model, config ``model-width`` = p_max and
    ``width-levels`` = the levels p <= p_max; expects back the p_max sub-model (keys, shapes,
    dtypes) and ``num-examples``. :func:`strategies.client.ordered_dropout_sgd` runs the
    local steps.
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
