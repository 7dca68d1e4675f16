"""Flower's own server optimisers, unchanged, plus what a checkpoint needs.

:class:`FedAvgM` (Hsu et al. 2019) and :class:`FedAdam`, :class:`FedYogi`,
:class:`FedAdagrad` (Reddi et al., ICLR 2021, "Adaptive Federated Optimization",
Algorithm 2) are the classes of ``flwr.serverapp.strategy``: configure, aggregate and the
optimiser steps are Flower's code. Each subclass adds only

* a check of its parameters in the constructor (Flower's constructors take any value);
* ``state_dict`` / ``load_state_dict``, which map the attributes the Flower class keeps
  across rounds (FedAvgM: the current arrays and the momentum vector; FedOpt: the current
  arrays, m_t and v_t), so ``resume-from`` continues the optimiser where it was;
* the trust gate (:class:`TrustGated`): every train and evaluate reply is checked by
  :mod:`strategies.engine.trust_gate` before Flower's code reads it (a bad one costs only itself,
  one WARNING), and a new model or optimiser state with NaN / Inf is not adopted.

Sampling is Flower's ``sample_nodes``: ``random.sample`` over the connected node ids,
with Python's global ``random``. fedhetero's ServerApp seeds it with the run's ``seed``
and a checkpoint saves its state, so an in-process run (fixed node ids) and its resumed
run are reproducible. Under ``flwr run`` node ids are random per run, so which
partitions a round samples (fraction-train < 1) differs from run to run whatever the
seed, and even with every client sampled the aggregation order (and hence the last bits
of the model) follows the sample order. fedhetero's own strategies sample by partition id.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from .. import contract as C
from ..engine import trust_gate
from ..engine.keys import BELOW_ONE, Key, above
from ..engine.records import record_of
from ..engine.registry import register

STATE_VERSION = 1

__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi", "flower_default"]


def flower_default(cls: type, parameter: str) -> object:
    """The default of ``parameter`` in the Flower class that ``cls`` extends."""
    return inspect.signature(cls.FLOWER_CLASS.__init__).parameters[parameter].default


def _check(name: str, value: float, low: float, high: float | None = None, *,
           closed_low: bool = True) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= low if closed_low else value > low) and (high is None or value < high))
    if not ok:
        interval = f"{'[' if closed_low else '('}{low:g}, {'inf' if high is None else f'{high:g}'})"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


class TrustGated:
    """The trust gate around a Flower strategy's ``aggregate_train`` / ``aggregate_evaluate``.

    A train reply reaches Flower's code only when :func:`strategies.engine.trust_gate.
    train_reply_problem` accepts it against the arrays and config sent (the real bytes of
    every array, ``num-examples`` within :data:`strategies.engine.trust_gate.MAX_NUM_EXAMPLES`: these
    strategies do not query sizes, ``local-steps`` within the steps sent, finite metrics),
    it has exactly one ArrayRecord and one MetricRecord, and its metric keys are those most
    replies share (Flower raises for mixed keys). The new model and the optimiser's state
    (:attr:`STATE_ATTRIBUTES`) are adopted only when finite; else the previous ones are kept.
    """

    STATE_ATTRIBUTES: tuple[str, ...] = ()  # checked for NaN / Inf after each aggregation
    CHECKPOINTED: tuple[str, ...] = ()  # the cross-round state in state_dict()
    current_arrays: object
    sent_config: ConfigRecord | None = None  # the train config of the round (its steps)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower's messages; the config sent is kept for the replies' step bound."""
        self.sent_config = ConfigRecord(dict(config))
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's aggregation over the replies the gate accepts; the previous model and
        state are kept when the result is not finite."""
        accepted = []
        for reply in replies:
            problem = None if reply.has_error() else self.reply_problem(reply)
            if problem:
                trust_gate.log_refused("Reply", reply.metadata.src_node_id, None, problem)
            else:
                accepted.append(reply)
        answered = {id(r) for r in trust_gate.same_metric_keys(
            [r for r in accepted if not r.has_error()], "Reply")}
        accepted = [r for r in accepted if r.has_error() or id(r) in answered]
        saved = {name: getattr(self, name) for name in self.STATE_ATTRIBUTES}
        arrays, metrics = super().aggregate_train(server_round, accepted)
        bad = next((name for name in self.STATE_ATTRIBUTES
                    if trust_gate.non_finite_key(_as_dict(getattr(self, name)))), None)
        if bad is not None:
            log(WARNING, "Round %d: %s's new %s is not finite; the previous model and state "
                "are kept", server_round, type(self).__name__, bad)
        elif arrays is None or trust_gate.adoptable_model(trust_gate.record_views(arrays),
                                                          server_round):
            return arrays, metrics
        for name, value in saved.items():
            setattr(self, name, value)
        return None, None

    def reply_problem(self, reply: Message) -> str | None:
        """What the gate refuses in a train reply, or None."""
        content = reply.content
        if len(content.array_records) != 1 or len(content.metric_records) != 1:
            return (f"needs exactly one ArrayRecord ('arrays') and one MetricRecord "
                    f"('metrics'), got {len(content.array_records)} and "
                    f"{len(content.metric_records)}")
        return trust_gate.train_reply_problem(reply, _expected(self.current_arrays, reply),
                                              sent=self.sent_config, reported_size=None)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Flower's weighted mean over the evaluate replies the gate accepts."""
        return trust_gate.aggregate_evaluate(replies)


    def state_dict(self) -> dict:
        """The optimiser's cross-round state (:attr:`CHECKPOINTED`, copied)."""
        return {"version": STATE_VERSION, "class": type(self).__name__,
                **{name: _snapshot(getattr(self, name)) for name in self.CHECKPOINTED}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state.get("class") != type(self).__name__ or state.get("version") != STATE_VERSION:
            raise ValueError(f"checkpoint holds the state of {state.get('class')!r} (version "
                             f"{state.get('version')!r}), not of {type(self).__name__}")
        for name in self.CHECKPOINTED:
            setattr(self, name, _restored(state[name]))


def _snapshot(value: object) -> dict | None:
    """A copy of an optimiser attribute (an ArrayRecord, a dict or a list of arrays)."""
    if value is None:
        return None
    if isinstance(value, ArrayRecord):
        return {"record": {k: np.array(a.numpy(), copy=True) for k, a in value.items()}}
    if isinstance(value, dict):
        return {"dict": {k: np.array(v, copy=True) for k, v in value.items()}}
    return {"list": [np.array(v, copy=True) for v in value]}


def _restored(saved: dict | None) -> object:
    """The attribute :func:`_snapshot` copied."""
    if saved is None:
        return None
    if "record" in saved:
        return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in saved["record"].items()})
    if "dict" in saved:
        return {k: np.array(v, copy=True) for k, v in saved["dict"].items()}
    return [np.array(v, copy=True) for v in saved["list"]]


def _expected(current: object, reply: Message) -> dict[str, trust_gate.ArraySpec]:
    """The specs a reply's arrays must have: the shapes sent this round (FedAvgM keeps an
    ArrayRecord, FedOpt a dict of arrays) and their dtypes, except that a floating array may
    come back in another floating dtype than sent: Flower's FedOpt computes its update in
    float64 and sends float64 from round 2 on, while the clients train and answer float32."""
    if current is None:
        return {}
    declared = record_of(reply.content, C.ARRAYS, ArrayRecord) or {}
    specs = {}
    for key, value in current.items():
        spec = trust_gate.spec_of(value)
        own = declared.get(key)
        if own is not None and spec.dtype.kind == "f":
            try:
                dtype = np.dtype(own.dtype)
            except TypeError:
                dtype = spec.dtype
            if dtype.kind == "f":
                spec = trust_gate.ArraySpec(spec.shape, dtype)
        specs[key] = spec
    return specs


def _as_dict(value: object) -> dict | None:
    """An optimiser state attribute as {key: array} for the finiteness check."""
    if value is None:
        return None
    if isinstance(value, ArrayRecord):
        return trust_gate.record_views(value)
    if isinstance(value, dict):
        return value
    return {str(k): v for k, v in enumerate(value)}


class FedAvgM(TrustGated, FlowerFedAvgM):
    """Flower's FedAvgM (Hsu et al. 2019) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``server_learning_rate`` > 0, ``server_momentum`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedAvgM
    STATE_ATTRIBUTES = ("current_arrays", "momentum_vector")
    CHECKPOINTED = STATE_ATTRIBUTES

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check("server_learning_rate", self.server_learning_rate, 0.0, closed_low=False)
        _check("server_momentum", self.server_momentum, 0.0, 1.0)


def _check_adaptive(strategy, *, betas: bool) -> None:
    _check("eta", strategy.eta, 0.0, closed_low=False)
    _check("tau", strategy.tau, 0.0, closed_low=False)
    if betas:
        _check("beta_1", strategy.beta_1, 0.0, 1.0)
        _check("beta_2", strategy.beta_2, 0.0, 1.0)


FEDOPT_STATE = ("m_t", "v_t")  # checked after each aggregation
FEDOPT_CHECKPOINTED = ("current_arrays", "m_t", "v_t")


class FedAdam(TrustGated, FlowerFedAdam):
    """Flower's FedAdam (Reddi et al. 2021, Alg. 2) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``eta``, ``tau`` > 0; ``beta_1``, ``beta_2`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedAdam
    STATE_ATTRIBUTES, CHECKPOINTED = FEDOPT_STATE, FEDOPT_CHECKPOINTED

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=True)


class FedYogi(TrustGated, FlowerFedYogi):
    """Flower's FedYogi (Reddi et al. 2021, Alg. 2) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``eta``, ``tau`` > 0; ``beta_1``, ``beta_2`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedYogi
    STATE_ATTRIBUTES, CHECKPOINTED = FEDOPT_STATE, FEDOPT_CHECKPOINTED

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=True)


class FedAdagrad(TrustGated, FlowerFedAdagrad):
    """Flower's FedAdagrad (Reddi et al. 2021, Alg. 2) with parameter checks and a
    ``state_dict``. Parameters as Flower's (``eta``, ``tau`` > 0; no beta_1, beta_2)."""

    FLOWER_CLASS = FlowerFedAdagrad
    STATE_ATTRIBUTES, CHECKPOINTED = FEDOPT_STATE, FEDOPT_CHECKPOINTED

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=False)


FLOWER_WHY = ("Flower's own class: it weights by num-examples, has no simulated stragglers or "
              "simulated clock and sends lr as given")
FEDOPT_WHY = FLOWER_WHY + "; beta_1 is its momentum (server-beta1)"
ADAGRAD_WHY = "FedAdagrad has no beta_1 / beta_2 (Reddi et al., Alg. 2)"
BETA1 = Key("server-beta1", 0.9, "β₁ of `fedadam` and `fedyogi` (Flower's default)",
            interval=BELOW_ONE, arg="beta_1")
BETA2 = Key("server-beta2", 0.99, "β₂ of `fedadam` and `fedyogi` (Flower's default)",
            interval=BELOW_ONE, arg="beta_2")
TAU = Key("server-tau", 0.001, "τ of `fedadam`, `fedyogi`, `fedadagrad` (Flower's default)",
          interval=above(0.0), arg="tau")
FEDOPT_READS = {"server-lr": "eta", "lr": "eta_l"}
FEDOPT_ONLY = (("server-momentum", (0.0,), FEDOPT_WHY),)
register("fedavgm", FedAvgM, "Flower's FedAvgM (Hsu et al. 2019): server momentum",
         engine="flower", reads={"server-lr": "server_learning_rate",
                                 "server-momentum": "server_momentum"})
register("fedadam", FedAdam, "Flower's FedAdam (Reddi et al. 2021, Alg. 2)", engine="flower",
         keys=(BETA1, BETA2, TAU), reads=FEDOPT_READS, only=FEDOPT_ONLY)
register("fedyogi", FedYogi, "Flower's FedYogi (Reddi et al. 2021, Alg. 2)", engine="flower",
         keys=(BETA1, BETA2, TAU), reads=FEDOPT_READS, only=FEDOPT_ONLY)
register("fedadagrad", FedAdagrad, "Flower's FedAdagrad (Reddi et al. 2021, Alg. 2)",
         engine="flower", keys=(TAU,), reads=FEDOPT_READS,
         only=(*FEDOPT_ONLY, ("server-beta1", (0.9,), ADAGRAD_WHY),
               ("server-beta2", (0.99,), ADAGRAD_WHY)))
