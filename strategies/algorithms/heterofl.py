"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient
Federated Learning for Heterogeneous Clients", ICLR 2021), server side.

Sec. 3: client k trains the sub-model of width r_k, the first ceil(r_k K) units of every
hidden layer of the global model, with a Scaler (its output divided by r_k in training);
the server averages each global entry over the clients whose sub-model holds it (each
client counting once, as the authors' ``combine`` does), the entries no client holds
keeping their value. The shared machinery is :class:`strategies.engine.submodels.WidthFedAvg`.
"""

from __future__ import annotations

from ..engine.submodels import WidthFedAvg

__all__ = ["HeteroFL"]


class HeteroFL(WidthFedAvg):
    """HeteroFL: static sub-models (first ceil(r K) units), the Scaler, uniform overlap
    averaging. Arguments as :class:`~strategies.engine.submodels.WidthFedAvg`; ``scaler``
    defaults to True (the paper's Scaler), ``weighting`` to ``"uniform"``.

    Contract
    --------
    Sends ``arrays`` = the client's sub-model and config ``model-width`` = r_k,
    ``width-scaler`` = True; expects back ``arrays`` with the sub-model's keys, shapes and
    dtypes and ``metrics`` with ``num-examples``. A ClientApp builds its model at the sent
    width and loads the sub-model with :func:`strategies.client.width_model`.
    """

    CLIENT_HELPER = "strategies.client.width_model"
    SCHEME = "static"

    def __init__(self, *flower_args, scaler: bool = True, **kwargs) -> None:
        super().__init__(*flower_args, scaler=scaler, **kwargs)
