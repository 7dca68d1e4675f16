"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient
Federated Learning for Heterogeneous Clients", ICLR 2021), server side.

Sec. 3: client k trains the sub-model of width r_k, the first ceil(r_k K) units of every
hidden layer of the global model, with a Scaler (its output divided by r_k in training);
the server averages each global entry over the clients whose sub-model holds it (each
client counting once, as the authors' ``combine`` does), the entries no client holds
keeping their value. The engine's :class:`~strategies.engine.submodels.SubModels` does it
all; the algorithm is FedAvg's with HeteroFL's client contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..engine.algorithm import Algorithm, Contract
from ..engine.keys import Rule
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.submodels import DEFAULT_LEVELS, SUBMODEL_KEYS, SubModels

__all__ = ["HeteroFL", "SubModelAveraging", "width_engine_args"]

WIDTH_WEIGHTINGS = ("uniform", "examples")


class SubModelAveraging(Algorithm):
    """The algorithm of HeteroFL and FedRolex: FedAvg's over the engine's sub-models, the
    client building its model at the sent width."""

    name = "HeteroFL"
    contract = Contract(helper="strategies.client.width_model")


def width_engine_args(owner: str, scheme: str, kwargs: dict, *, width_spec=None,
                      levels: Sequence[float] = DEFAULT_LEVELS, width_rule: str | None = None,
                      level_compute: Mapping[float, float] | None = None,
                      scaler: bool = False) -> dict:
    """The round engine's keyword arguments for a width strategy: ``kwargs`` with the
    :class:`~strategies.engine.submodels.SubModels` component (checked: its weighting, no
    drift diagnostics) and the client-info query on unless given (the width rules go by
    partition id; without one a client trains the largest level)."""
    weighting = kwargs.get("weighting", "uniform")
    if weighting not in WIDTH_WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not known; use one of "
                         f"{', '.join(WIDTH_WEIGHTINGS)}")
    if kwargs.get("drift_diagnostics"):
        raise ValueError(f"{owner}: drift_diagnostics compares whole-model updates; the "
                         f"clients here send sub-models of different shapes. Use "
                         f"drift_diagnostics=False")
    if "participation" not in kwargs:  # the widths go by partition id: ask for it
        kwargs = {"query_client_info": True, **kwargs}
    return {**kwargs, "weighting": weighting,
            "submodels": SubModels(scheme, width_spec=width_spec, levels=levels,
                                   width_rule=width_rule, level_compute=level_compute,
                                   scaler=scaler)}


class HeteroFL(RoundEngine):
    """HeteroFL: static sub-models (first ceil(r K) units), the Scaler, uniform overlap
    averaging.

    Parameters
    ----------
    width_spec, levels, width_rule, level_compute, scaler
        The sub-models (:class:`~strategies.engine.submodels.SubModels`); ``scaler``
        defaults to True (the paper's Scaler).
    weighting : str
        ``"uniform"`` (default: each client holding an entry counts once) or
        ``"examples"`` (n_k).
    **kwargs
        As :class:`~strategies.engine.round_engine.RoundEngine`.

    Contract
    --------
    Sends ``arrays`` = the client's sub-model and config ``model-width`` = r_k,
    ``width-scaler`` = True; expects back ``arrays`` with the sub-model's keys, shapes and
    dtypes and ``metrics`` with ``num-examples``. A ClientApp builds its model at the sent
    width and loads the sub-model with :func:`strategies.client.width_model`.
    """

    def __init__(self, *flower_args, width_spec=None, levels=DEFAULT_LEVELS,
                 width_rule: str | None = None, level_compute=None, scaler: bool = True,
                 **kwargs) -> None:
        super().__init__(*flower_args, algorithm=SubModelAveraging(), **width_engine_args(
            "HeteroFL", "static", kwargs, width_spec=width_spec, levels=levels,
            width_rule=width_rule, level_compute=level_compute, scaler=scaler))


WIDTH_WHY = ("the clients train sub-models of different shapes; the overlap average counts each "
             "client holding an entry once ('uniform', HeteroFL's and FedRolex's code) or by its "
             "examples ('examples', FjORD's)")
WIDTH_REGISTRATION = {
    "keys": SUBMODEL_KEYS, "model": "width", "fixed": {"drift_diagnostics": False},
    "rules": (Rule(("width-rule", "round-deadline"),
                   lambda v: v["width-rule"] != "deadline" or v["round-deadline"] > 0,
                   "width-rule 'deadline' picks the largest width that fits the round deadline: "
                   "it needs round-deadline > 0 (and device-profiles)"),),
    "only": (("weighting", WIDTH_WEIGHTINGS, WIDTH_WHY),
             ("model-width", (1.0,), "the global model is the full-width one; each client's "
              "width comes from width-levels and width-rule"))}
"""What HeteroFL, FjORD and FedRolex register alike."""
register("heterofl", HeteroFL, "HeteroFL (Diao, Ding and Tarokh 2021): static sub-models of "
         "per-client widths, overlap averaging (client helper)", **WIDTH_REGISTRATION)
