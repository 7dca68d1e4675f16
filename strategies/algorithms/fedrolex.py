"""FedRolex (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning
with Rolling Sub-Model Extraction", NeurIPS 2022), server side.

Sec. 3.2 and Algorithm 1: as HeteroFL, but the ceil(r_k K) units of every hidden layer
client k trains in round t are a window that rolls one unit per round (units t mod K, t +
1 mod K, ..., wrapping to 0), so over K rounds every unit of the global model is trained
by clients of every width; the same overlap averaging. The engine's
:class:`~strategies.engine.submodels.SubModels` does it with the ``"rolling"`` scheme
(:func:`strategies.engine.submodel_math.unit_indices`, t = server_round - 1).

Label split: FedRolex's code keeps HeteroFL's (``resnet_client.py`` passes each client's
``label_split`` to the model's masked cross-entropy, ``models/resnet.py``, ``control.mask:
'1'``; ``resnet_server.py`` ``combine`` averages the output layer's rows of a client only
for its labels), so ``label_split`` is on by default here too
(:mod:`strategies.algorithms.heterofl`).
"""

from __future__ import annotations

from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.submodels import DEFAULT_LEVELS
from .heterofl import LABEL_SPLIT_REGISTRATION, SubModelAveraging, width_engine_args

__all__ = ["FedRolex"]


class FedRolex(RoundEngine):
    """FedRolex: rolling sub-model windows, uniform overlap averaging, no Scaler by default,
    the authors' label split (``label_split=True``). Arguments as
    :class:`~strategies.algorithms.heterofl.HeteroFL`.

    Contract
    --------
    As :class:`~strategies.algorithms.heterofl.HeteroFL`: ``arrays`` = the client's sub-model
    (its units in window order), config ``model-width`` = r_k and ``label-split``; the client
    cannot tell a rolled sub-model from a static one, so :func:`strategies.client.width_model`
    and :class:`strategies.client.width.LabelSplit` serve both.
    """

    def __init__(self, *flower_args, width_spec=None, levels=DEFAULT_LEVELS,
                 width_rule: str | None = None, level_compute=None, scaler: bool = False,
                 label_split: bool = True, **kwargs) -> None:
        args = width_engine_args(
            "FedRolex", "rolling", kwargs, width_spec=width_spec, levels=levels,
            width_rule=width_rule, level_compute=level_compute, scaler=scaler,
            label_split=label_split)
        super().__init__(*flower_args, algorithm=SubModelAveraging(args["submodels"]), **args)


register("fedrolex", FedRolex, "FedRolex (Alam et al. 2022): rolling sub-model windows of "
         "per-client widths, label split (client helper)", **LABEL_SPLIT_REGISTRATION)
