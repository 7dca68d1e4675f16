"""What an algorithm is to the round engine: at most five methods and a contract.

An :class:`Algorithm` is what its paper specifies and nothing else. The engine
(:class:`strategies.engine.round_engine.RoundEngine`) owns the round: who takes part, the
messages, the trust gate, the client-state copies, the sub-models, the clock, the report,
the checkpoint. It calls the algorithm at three points of a round and for its state:

* :meth:`Algorithm.send`: what goes to the clients beside the model (config keys, shared
  or per client, and ArrayRecords);
* :meth:`Algorithm.check`: what it checks in a reply beyond the gate (None: nothing);
* :meth:`Algorithm.update`: how the accepted replies update its server state and the
  model (a :class:`RoundUpdate` from a :class:`RoundInput`);
* :meth:`Algorithm.state_dict` / :meth:`Algorithm.load_state_dict`: its cross-round state
  for checkpoints.

Its client contract is data, not code: a :class:`Contract` (the ``strategies.client``
helper a ClientApp calls, what every reply must carry, what the messages carry beside the
model); the engine checks it and stops a run whose clients do not implement it. Its
run-config keys are declared beside it (:class:`strategies.engine.keys.Key`).

The types here are the typed hand-offs between engine and algorithm; no attribute set in one
hook is read in another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from .. import contract as C
from ..contract import Section
from .records import record_of
from .round_plan import RoundPlan

__all__ = ["Algorithm", "Contract", "NDArrays", "Outgoing", "RoundInput", "RoundUpdate"]

NDArrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Contract:
    """The client side of an algorithm.

    ``helper`` is the ``strategies.client`` helper a ClientApp calls to honour it (None: a
    stock ClientApp does); every train reply must carry the MetricRecord keys ``metrics``
    and the ArrayRecords ``arrays`` (besides Flower's ``arrays`` and ``metrics``);
    ``sends`` names the ArrayRecords every train message carries beside the model. The
    records of ``arrays`` and ``sends`` hold the model's floating arrays (what the clock
    charges for them). ``client_state`` is ``"required"`` when every reply must echo the
    client state it started from (:mod:`strategies.engine.client_states`), ``"optional"``
    when the client keeps state whose echo is checked where present, None without client
    state.
    """

    helper: str | None = None
    metrics: tuple[str, ...] = ()
    arrays: tuple[str, ...] = ()
    sends: tuple[str, ...] = ()
    client_state: str | None = None

    def gap(self, reply: Message) -> str | None:
        """What a reply without a client error lacks of this contract, or None."""
        content = reply.content
        metrics = record_of(content, C.METRICS, MetricRecord) or {}
        for key in self.metrics:
            if key not in metrics:
                return f"the metric '{key}'"
        for name in self.arrays:
            if record_of(content, name, ArrayRecord) is None:
                return f"an ArrayRecord '{name}'"
        if self.client_state == "required" and (C.STATE_ROUND_USED not in metrics
                                                or C.STATE_DIGEST not in metrics):
            return (f"the metrics '{C.STATE_ROUND_USED}' and '{C.STATE_DIGEST}' (the client "
                    f"state it started from)")
        return None

    def extra_bytes(self, arrays: ArrayRecord) -> tuple[int, int]:
        """Bytes beside the model per client, down and up: one record of the model's floating
        arrays per name in ``sends`` / ``arrays``."""
        size = sum(len(a.data) + len(k) for k, a in arrays.items()
                   if np.issubdtype(np.dtype(a.dtype), np.floating))
        return size * len(self.sends), size * len(self.arrays)


@dataclass(frozen=True)
class Outgoing:
    """What an algorithm sends beside the model in a round: config keys for every client
    (``common``) and per node (``per_node``), ArrayRecords for every message
    (``records``), and what it reports of the round so far (``sections``)."""

    common: Mapping[str, object] = field(default_factory=dict)
    per_node: Mapping[int, Mapping[str, object]] = field(default_factory=dict)
    records: Mapping[str, ArrayRecord] = field(default_factory=dict)
    sections: Sequence[Section] = ()


Average = Callable[..., tuple["NDArrays | None", list[int]]]


@dataclass(frozen=True)
class RoundInput:
    """What the engine gives :meth:`Algorithm.update`: the round's plan, w_t, the replies
    the gate accepted (partition order), their models (index, read-only views), the
    engine's copy of each replying client's state (None without client state, an entry None
    for the initial state), and ``average``: the engine's weighted average of those models
    (the configured weighting, sub-models and server step eta_g = ``server_lr``;
    ``average()`` -> (the new model or None, the indices used); ``average(server_lr=1.0)``
    the plain average, for an algorithm that takes its own step; replies with NaN / Inf are
    left out with one log line each, as ``reject(k, key)`` does); ``weights(used)`` is the
    weighting's c_k over the replies ``used`` (None with sub-models)."""

    plan: RoundPlan
    global_arrays: NDArrays
    replies: Sequence[Message]
    models: Sequence[tuple[int, NDArrays]]
    average: Average
    reject: Callable[[int, str], None]
    states: Sequence[NDArrays | None] | None = None
    server_lr: float = 1.0
    weights: Callable[[Sequence[int]], np.ndarray] | None = None

    @property
    def server_round(self) -> int:
        return self.plan.server_round

    def metrics(self, k: int) -> Mapping[str, object]:
        """Reply k's MetricRecord."""
        return self.replies[k].content[C.METRICS]


@dataclass
class RoundUpdate:
    """What :meth:`Algorithm.update` returns: the new model (None: kept), the indices of the
    replies it used, each used client's new state (aligned with ``used``; None without
    client state) and the algorithm's report sections."""

    model: NDArrays | None
    used: list[int]
    client_states: list[NDArrays] | None = None
    sections: list[Section] = field(default_factory=list)


class Algorithm:
    """Base of every algorithm: FedAvg's behaviour (nothing beside the model, no extra
    check, the engine's weighted average, no state). A paper's algorithm overrides what its
    paper changes; at most the five methods below."""

    name: ClassVar[str] = "FedAvg"
    contract: ClassVar[Contract] = Contract()
    steps_from_average: ClassVar[bool] = False
    """True when an overriding :meth:`update` is the engine's average followed by a server
    step from that average alone (FedAvgM's momentum), so a robust rule may replace the
    average (:func:`strategies.engine.round_engine.robust_for`)."""

    def send(self, plan: RoundPlan) -> Outgoing:
        """What the round's messages carry beside the model and the round's config."""
        return Outgoing()

    def check(self, plan: RoundPlan, reply: Message) -> str | None:
        """Why a reply that passed the gate and the contract is unusable, or None."""
        return None

    def update(self, round_input: RoundInput) -> RoundUpdate:
        """The new model from the accepted replies (and the algorithm's new server state)."""
        new, used = round_input.average()
        return RoundUpdate(new, used)

    def state_dict(self) -> dict:
        """Cross-round server state for a checkpoint (copied)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
