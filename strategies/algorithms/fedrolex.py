"""FedRolex (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning
with Rolling Sub-Model Extraction", NeurIPS 2022), server side.

Sec. 3.2 and Algorithm 1: as HeteroFL, but the ceil(r_k K) units of every hidden layer
client k trains in round t are a window that rolls one unit per round (units t mod K, t +
1 mod K, ..., wrapping to 0), so over K rounds every unit of the global model is trained
by clients of every width; the same overlap averaging. The shared machinery is
:class:`strategies.engine.submodels.WidthFedAvg`; the window is
:func:`strategies.engine.submodel_math.unit_indices` ("rolling", t = server_round - 1).
"""

from __future__ import annotations

from ..engine.submodels import WidthFedAvg

__all__ = ["FedRolex"]


class FedRolex(WidthFedAvg):
    """FedRolex: rolling sub-model windows, uniform overlap averaging, no Scaler by default.
    Arguments as :class:`~strategies.engine.submodels.WidthFedAvg`.

    Contract
    --------
    As :class:`~strategies.algorithms.heterofl.HeteroFL`: ``arrays`` = the client's sub-model (its
    units in window order), config ``model-width`` = r_k; the client cannot tell a rolled
    sub-model from a static one, so :func:`strategies.client.width_model` serves both.
    """

    CLIENT_HELPER = "strategies.client.width_model"
    SCHEME = "rolling"
