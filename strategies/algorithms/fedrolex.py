"""FedRolex (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning
with Rolling Sub-Model Extraction", NeurIPS 2022), server side.

Sec. 3.2 and Algorithm 1: as HeteroFL, but the ceil(r_k K) units of every hidden layer
client k trains in round t are a window that rolls one unit per round (units t mod K, t +
1 mod K, ..., wrapping to 0), so over K rounds every unit of the global model is trained
by clients of every width; the same overlap averaging. The engine's
:class:`~strategies.engine.submodels.SubModels` does it with the ``"rolling"`` scheme
(:func:`strategies.engine.submodel_math.unit_indices`, t = server_round - 1).
"""

from __future__ import annotations

from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.submodels import DEFAULT_LEVELS
from .heterofl import WIDTH_REGISTRATION, SubModelAveraging, width_engine_args

__all__ = ["FedRolex"]


class FedRolex(RoundEngine):
    """FedRolex: rolling sub-model windows, uniform overlap averaging, no Scaler by default.
    Arguments as :class:`~strategies.algorithms.heterofl.HeteroFL`.

    Contract
    --------
    As :class:`~strategies.algorithms.heterofl.HeteroFL`: ``arrays`` = the client's sub-model
    (its units in window order), config ``model-width`` = r_k; the client cannot tell a
    rolled sub-model from a static one, so :func:`strategies.client.width_model` serves both.
    """

    def __init__(self, *flower_args, width_spec=None, levels=DEFAULT_LEVELS,
                 width_rule: str | None = None, level_compute=None, scaler: bool = False,
                 **kwargs) -> None:
        super().__init__(*flower_args, algorithm=SubModelAveraging(), **width_engine_args(
            "FedRolex", "rolling", kwargs, width_spec=width_spec, levels=levels,
            width_rule=width_rule, level_compute=level_compute, scaler=scaler))


register("fedrolex", FedRolex, "FedRolex (Alam et al. 2022): rolling sub-model windows of "
         "per-client widths (client helper)", **WIDTH_REGISTRATION)
