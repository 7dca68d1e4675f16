"""Flower's own server optimisers, unchanged, plus what a checkpoint needs.

:class:`FedAvgM` (Hsu et al. 2019) and :class:`FedAdam`, :class:`FedYogi`,
:class:`FedAdagrad` (Reddi et al., ICLR 2021, "Adaptive Federated Optimization",
Algorithm 2) are the classes of ``flwr.serverapp.strategy``: configure, aggregate and the
optimiser steps are Flower's code. Each subclass adds only

* a check of its parameters in the constructor (Flower's constructors take any value);
* ``state_dict`` / ``load_state_dict``, which map the attributes the Flower class keeps
  across rounds (FedAvgM: the current arrays and the momentum vector; FedOpt: the current
  arrays, m_t and v_t), so ``resume-from`` continues the optimiser where it was.

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

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

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


def _arrays(value: dict | None) -> dict | None:
    return None if value is None else {k: np.array(v, copy=True) for k, v in value.items()}


def _record(value: ArrayRecord | None) -> dict | None:
    return None if value is None else {k: np.array(a.numpy(), copy=True) for k, a in value.items()}


class FedAvgM(FlowerFedAvgM):
    """Flower's FedAvgM (Hsu et al. 2019) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``server_learning_rate`` > 0, ``server_momentum`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedAvgM

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _check("server_learning_rate", self.server_learning_rate, 0.0, closed_low=False)
        _check("server_momentum", self.server_momentum, 0.0, 1.0)

    def state_dict(self) -> dict:
        """``current_arrays`` and ``momentum_vector`` (copied)."""
        return {"version": STATE_VERSION, "class": type(self).__name__,
                "current-arrays": _record(self.current_arrays),
                "momentum-vector": (None if self.momentum_vector is None else
                                    [np.array(v, copy=True) for v in self.momentum_vector])}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        _check_state(self, state)
        current = state["current-arrays"]
        self.current_arrays = (None if current is None else
                               ArrayRecord({k: Array(np.ascontiguousarray(v))
                                            for k, v in current.items()}))
        vector = state["momentum-vector"]
        self.momentum_vector = None if vector is None else [np.array(v) for v in vector]


class _FedOptState:
    """``state_dict`` of Flower's FedOpt family: ``current_arrays``, ``m_t``, ``v_t``."""

    current_arrays: dict | None
    m_t: dict | None
    v_t: dict | None

    def state_dict(self) -> dict:
        """``current_arrays``, ``m_t`` and ``v_t`` (copied)."""
        return {"version": STATE_VERSION, "class": type(self).__name__,
                "current-arrays": _arrays(self.current_arrays),
                "m_t": _arrays(self.m_t), "v_t": _arrays(self.v_t)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        _check_state(self, state)
        self.current_arrays = _arrays(state["current-arrays"])
        self.m_t = _arrays(state["m_t"])
        self.v_t = _arrays(state["v_t"])


def _check_state(strategy: object, state: dict) -> None:
    if state.get("class") != type(strategy).__name__ or state.get("version") != STATE_VERSION:
        raise ValueError(f"checkpoint holds the state of {state.get('class')!r} (version "
                         f"{state.get('version')!r}), not of {type(strategy).__name__}")


def _check_adaptive(strategy, *, betas: bool) -> None:
    _check("eta", strategy.eta, 0.0, closed_low=False)
    _check("tau", strategy.tau, 0.0, closed_low=False)
    if betas:
        _check("beta_1", strategy.beta_1, 0.0, 1.0)
        _check("beta_2", strategy.beta_2, 0.0, 1.0)


class FedAdam(_FedOptState, FlowerFedAdam):
    """Flower's FedAdam (Reddi et al. 2021, Alg. 2) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``eta``, ``tau`` > 0; ``beta_1``, ``beta_2`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedAdam

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=True)


class FedYogi(_FedOptState, FlowerFedYogi):
    """Flower's FedYogi (Reddi et al. 2021, Alg. 2) with parameter checks and a ``state_dict``.

    Parameters as Flower's (``eta``, ``tau`` > 0; ``beta_1``, ``beta_2`` in [0, 1)).
    """

    FLOWER_CLASS = FlowerFedYogi

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=True)


class FedAdagrad(_FedOptState, FlowerFedAdagrad):
    """Flower's FedAdagrad (Reddi et al. 2021, Alg. 2) with parameter checks and a
    ``state_dict``. Parameters as Flower's (``eta``, ``tau`` > 0; no beta_1, beta_2)."""

    FLOWER_CLASS = FlowerFedAdagrad

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_adaptive(self, betas=False)
