"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient
Federated Learning for Heterogeneous Clients", ICLR 2021), server side.

Sec. 3: client k trains the sub-model of width r_k, the first ceil(r_k K) units of every
hidden layer of the global model, with a Scaler (its output divided by r_k in training);
the server averages each global entry over the clients whose sub-model holds it (each
client counting once, as the authors' ``combine`` does), the entries no client holds
keeping their value. The engine's :class:`~strategies.engine.submodels.SubModels` does it
all; the algorithm is FedAvg's with HeteroFL's client contract.

Label split (the authors' code, on by default: ``label_split``; the paper's text was not
available here to number the section): each client trains with the cross-entropy whose
logits of the labels absent from its data are 0 (``src/models/conv.py`` and ``resnet.py``:
``out.masked_fill(label_mask == 0, 0)``, ``control.mask: '1'``) and its ``combine``
(``src/fed.py``) averages each client's output-layer rows only for its own labels
(``label_split``); every other entry as above. Here the client replies its labels
(``label-mask``); the algorithm checks them against the update (:meth:`SubModelAveraging.
check`) and the sub-models count the client as a holder of an output row only for its
labels (:func:`strategies.engine.submodel_math.label_rows`). ``label_split=False`` (run
config ``label-split = false``): the plain cross-entropy, every row of a client's
sub-model averaged over every client that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flwr.app import Message

from .. import contract as C
from ..engine.algorithm import Algorithm, Contract
from ..engine.keys import Key, Rule
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan
from ..engine.submodels import DEFAULT_LEVELS, SUBMODEL_KEYS, SubModels

__all__ = ["HeteroFL", "LABEL_SPLIT_KEYS", "SubModelAveraging", "width_engine_args"]

WIDTH_WEIGHTINGS = ("uniform", "examples")
WIDTH_CONTRACT = Contract(helper="strategies.client.width_model")
LABEL_SPLIT_CONTRACT = Contract(
    helper="strategies.client.width_model and strategies.client.width.LabelSplit",
    metrics=(C.LABEL_MASK,))


class SubModelAveraging(Algorithm):
    """The algorithm of HeteroFL and FedRolex: FedAvg's over the engine's sub-models, the
    client building its model at the sent width; with the sub-models' label split, the
    client's labels (``label-mask``) checked against its update.

    Parameters
    ----------
    submodels : SubModels, optional
        The engine's sub-models; their ``label_split`` decides the contract (every reply
        carries ``label-mask``) and the check.
    """

    name = "HeteroFL"
    contract = WIDTH_CONTRACT

    def __init__(self, submodels: SubModels | None = None) -> None:
        self.submodels = submodels
        self.label_split = bool(submodels is not None and submodels.label_split)
        if self.label_split:
            self.contract = LABEL_SPLIT_CONTRACT

    def check(self, plan: RoundPlan, reply: Message) -> str | None:
        """With the label split, why a reply's ``label-mask`` does not fit its update (not
        a list of 0/1 ints, not one entry per output row, no label): the authors' server
        knows each client's ``label_split``, ours takes the client's word for it."""
        return self.submodels.label_problem(reply) if self.label_split else None


def width_engine_args(owner: str, scheme: str, kwargs: dict, *, width_spec=None,
                      levels: Sequence[float] = DEFAULT_LEVELS, width_rule: str | None = None,
                      level_compute: Mapping[float, float] | None = None,
                      scaler: bool = False, label_split: bool = False) -> dict:
    """The round engine's keyword arguments for a width strategy: ``kwargs`` with the
    :class:`~strategies.engine.submodels.SubModels` component (checked: its weighting, no
    drift diagnostics, no robust rule with the label split) and the client-info query on
    unless given (the width rules go by partition id; without one a client trains the
    largest level)."""
    weighting = kwargs.get("weighting", "uniform")
    if weighting not in WIDTH_WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not known; use one of "
                         f"{', '.join(WIDTH_WEIGHTINGS)}")
    if kwargs.get("drift_diagnostics"):
        raise ValueError(f"{owner}: drift_diagnostics compares whole-model updates; the "
                         f"clients here send sub-models of different shapes. Use "
                         f"drift_diagnostics=False")
    if label_split is True and kwargs.get("robust") not in (None, "none"):
        raise ValueError(f"{owner}: robust={kwargs['robust']!r} with label_split=True: the "
                         f"robust rule takes every row of each client's sub-model, not only "
                         f"the output rows of its labels; pass label_split=False (run config: "
                         f"label-split = false) or robust=None")
    if "participation" not in kwargs:  # the widths go by partition id: ask for it
        kwargs = {"query_client_info": True, **kwargs}
    return {**kwargs, "weighting": weighting,
            "submodels": SubModels(scheme, width_spec=width_spec, levels=levels,
                                   width_rule=width_rule, level_compute=level_compute,
                                   scaler=scaler, label_split=label_split)}


class HeteroFL(RoundEngine):
    """HeteroFL: static sub-models (first ceil(r K) units), the Scaler, uniform overlap
    averaging, the authors' label split.

    Parameters
    ----------
    width_spec, levels, width_rule, level_compute, scaler
        The sub-models (:class:`~strategies.engine.submodels.SubModels`); ``scaler``
        defaults to True (the paper's Scaler).
    label_split : bool
        True (default, the authors' code): the clients train with the masked cross-entropy
        of their own labels and reply them; each output-layer row is averaged over the
        clients holding its label. False: the plain cross-entropy, every row of a client's
        sub-model averaged over every client that holds it. Not with ``robust``.
    weighting : str
        ``"uniform"`` (default: each client holding an entry counts once) or
        ``"examples"`` (n_k).
    **kwargs
        As :class:`~strategies.engine.round_engine.RoundEngine`.

    Contract
    --------
    Sends ``arrays`` = the client's sub-model and config ``model-width`` = r_k,
    ``width-scaler`` = True, ``label-split`` = True; expects back ``arrays`` with the
    sub-model's keys, shapes and dtypes and ``metrics`` with ``num-examples`` and
    ``label-mask`` (one 0/1 entry per class, 1 for each label of the client's data). A
    ClientApp builds its model at the sent width and loads the sub-model with
    :func:`strategies.client.width_model`, and trains and replies with
    :class:`strategies.client.width.LabelSplit`.
    """

    def __init__(self, *flower_args, width_spec=None, levels=DEFAULT_LEVELS,
                 width_rule: str | None = None, level_compute=None, scaler: bool = True,
                 label_split: bool = True, **kwargs) -> None:
        args = width_engine_args(
            "HeteroFL", "static", kwargs, width_spec=width_spec, levels=levels,
            width_rule=width_rule, level_compute=level_compute, scaler=scaler,
            label_split=label_split)
        super().__init__(*flower_args, algorithm=SubModelAveraging(args["submodels"]), **args)


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
LABEL_SPLIT_KEYS = (
    Key("label-split", True,
        "HeteroFL's and FedRolex's label split, as the authors' code runs it: each client "
        "trains with the cross-entropy whose logits of the labels absent from its data are 0 "
        "and replies its labels; each output-layer row is averaged over the clients holding "
        "its label. `false`: the plain cross-entropy, every row over every client holding it",
        arg="label_split"),
)
"""The run-config keys of the label split (declared here, beside what reads them)."""
LABEL_SPLIT_REGISTRATION = {
    **WIDTH_REGISTRATION, "keys": SUBMODEL_KEYS + LABEL_SPLIT_KEYS,
    "client_side": "strategies.client.width",
    "rules": (*WIDTH_REGISTRATION["rules"],
              Rule(("label-split", "robust-aggregation", "strategy"),
                   lambda v: (v["strategy"] not in ("heterofl", "fedrolex")
                              or v["robust-aggregation"] == "none" or not v["label-split"]),
                   "the label split of `heterofl` and `fedrolex` averages each output row over "
                   "the clients holding its label, which a robust rule does not: "
                   "robust-aggregation = 'none' or label-split = false"))}
"""What HeteroFL and FedRolex register alike: the width registration, the label split's key,
its client side (:class:`strategies.client.width.LabelSplit`) and its rule."""
register("heterofl", HeteroFL, "HeteroFL (Diao, Ding and Tarokh 2021): static sub-models of "
         "per-client widths, overlap averaging, label split (client helper)",
         **LABEL_SPLIT_REGISTRATION)
