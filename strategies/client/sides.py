"""How a ClientApp finds each strategy's client side: from the keys its contract sends.

A :class:`ClientSide` is one strategy's client work, registered by its ``strategies.client``
module: ``matches(msg)`` says whether a train message asks for it (the keys or records the
strategy's contract sends, e.g. ``proximal-mu``, ``scaffold-c``), and it either rides on
the one local-SGD loop (``hook``: a :class:`LoopHook`, with optimiser step hooks, an extra
loss term, a loss of its own and the reply it builds) or runs a local training of its own
(``train``: FedVeca's tau steps and gradient, a DynamicFL chunk, FjORD's ordered dropout).
A ClientApp gives the matching sides one :class:`TrainTask` and runs them
(:func:`client_sides`); the modules are the ones the registered strategies name
(:attr:`strategies.engine.registry.Registration.client_side`), so a new strategy's client
side needs no change to any ClientApp. torch stays inside the helpers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from flwr.app import Message, MetricRecord, RecordDict

from .. import contract as C
from ..engine.records import to_record

__all__ = ["ClientSide", "LoopHook", "TrainTask", "arrays_content", "client_sides", "model_content",
           "register_client_side", "training_metrics"]


@dataclass(frozen=True)
class TrainTask:
    """What a ClientApp hands a strategy's client side for one train message: the message,
    the node's ``Context.state``, the model holding the received weights, the local data,
    its optimiser factory (the ClientApp's own, from the message's lr / momentum /
    weight-decay), the local work (B, E, a fixed step count, the batch-order seed), the
    run's seed, the partition id, the lr / momentum / weight decay the message asks for (the
    ClientApp's own where it sends none) and ``build(width)``: the model at another width
    (FjORD)."""

    msg: Message
    state: RecordDict
    model: Any
    x: Any
    y: Any
    optimizer: Callable[[], Any]
    batch_size: int
    epochs: float
    steps: int
    seed: int
    run_seed: int
    partition_id: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    build: Callable[[float], Any] | None = None


class LoopHook(Protocol):
    """A client side on the one local-SGD loop (:func:`strategies.client.local_sgd`); each
    method is optional."""

    def wrap(self, optimizer: Any, model: Any) -> Any:
        """Install its optimiser step hooks."""

    def forward(self, model: Any, x: Any) -> tuple[Any, Any]:
        """``(outputs, extra loss)`` instead of ``model(x)``."""

    def loss_fn(self, outputs: Any, y: Any) -> Any:
        """The loss instead of the model's own."""

    def finish(self, model: Any, metrics: Mapping[str, Any]) -> RecordDict:
        """The reply content after the steps."""


@dataclass(frozen=True)
class ClientSide:
    """One strategy's client side (module docstring)."""

    name: str
    matches: Callable[[Message], bool]
    hook: Callable[[TrainTask], LoopHook] | None = None
    train: Callable[[TrainTask], RecordDict] | None = None


_SIDES: dict[str, ClientSide] = {}


def register_client_side(side: ClientSide) -> ClientSide:
    """Make ``side`` findable by :func:`client_sides` (its module calls this on import)."""
    if (side.hook is None) == (side.train is None):
        raise ValueError(f"client side {side.name!r}: give a hook on the loop or a train, "
                         f"one of the two")
    _SIDES[side.name] = side
    return side


def client_sides(msg: Message, modules: tuple[str, ...]) -> list[ClientSide]:
    """The client sides a train message asks for, in the order their ``modules`` (the
    registered strategies' :attr:`~strategies.engine.registry.Registration.client_side`)
    register them."""
    for module in modules:
        importlib.import_module(module)
    return [side for side in _SIDES.values() if side.matches(msg)]


def training_metrics(result: Any, partition_id: int) -> dict[str, object]:
    """The reply metrics of local training (a :class:`strategies.client.LocalResult`): n_i,
    the mean loss, tau_i (FedNova's ``local-steps``) and the partition id."""
    from .fednova import report_local_steps  # noqa: PLC0415 - fednova's module is the helper's

    metrics = report_local_steps({C.NUM_EXAMPLES: result.num_examples,
                                  C.TRAIN_LOSS: result.train_loss}, result.local_steps)
    metrics[C.PARTITION_ID] = partition_id
    return metrics


def model_content(model: Any, metrics: Mapping[str, object]) -> RecordDict:
    """A train reply's content: the trained model's state_dict (its own keys and shapes)
    and ``metrics``."""
    return arrays_content({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
                          metrics)


def arrays_content(arrays: Mapping[str, Any], metrics: Mapping[str, object]) -> RecordDict:
    """A train reply's content from the trained weights as numpy arrays (a state_dict's
    keys and shapes) and ``metrics``."""
    return RecordDict({C.ARRAYS: to_record(dict(arrays)), C.METRICS: MetricRecord(dict(metrics))})

