"""FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, Algorithm 1) on Flower's Message API.

Up to ``concurrency`` clients train at once from the model version they were sent; each
client update Delta_k = y_k - x^(v_k) enters the buffer weighted by its staleness s(tau_k)
(1 / sqrt(1 + tau) by default); once K updates are in, the server steps
x <- x + eta_g (1/K) sum_k s(tau_k) Delta_k (optionally with server momentum) and the buffer
empties: one round of Flower's loop. The math is :mod:`strategies.algorithms.staleness`; the tasks,
their arrival order and the simulated clock are :mod:`strategies.engine.async_tasks`.

Contract: Flower's template. Sends ``arrays`` and ``config`` (the train config with
``server-round`` = the task's number); expects the trained ``arrays`` and ``metrics`` with
``num-examples``, as Flower's PyTorch template sends.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from ..engine import records
from ..engine.averaging import NDArrays
from ..engine.async_engine import AsyncStrategy
from ..engine.async_tasks import AsyncTask
from ..engine.participation import check_whole
from .staleness import Staleness, add_update, fedbuff_step

__all__ = ["FedBuff"]


class FedBuff(AsyncStrategy):
    """FedBuff, buffered asynchronous aggregation (module docstring).

    Parameters
    ----------
    buffer_size : int
        K, client updates per server step (10 in the paper's experiments).
    concurrency : int
        Most clients training at once.
    server_lr : float
        eta_g of the server step.
    server_momentum : float
        beta in m <- beta m + Delta_bar, x <- x + eta_g m (0: none).
    staleness : Staleness or str
        s(tau): ``"fedbuff"`` = 1 / sqrt(1 + tau) (the paper's), or FedAsync's
        ``"constant"``, ``"polynomial"``, ``"hinge"`` (:class:`strategies.algorithms.staleness.Staleness`).
    **kwargs
        :class:`strategies.engine.async_engine.AsyncStrategy`'s: ``arrival``,
        ``fraction_evaluate``, ``seed``, ``min_available_nodes``, ``query_client_info``,
        ``query_timeout``, ``clock``, ``participation``.
    """

    def __init__(self, *flower_args, buffer_size: int = 10, concurrency: int = 20, server_lr: float = 1.0,
                 server_momentum: float = 0.0, staleness: Staleness | str = "fedbuff",
                 **kwargs) -> None:
        check_whole("buffer_size", buffer_size, minimum=1)
        if not (isinstance(server_lr, (int, float)) and server_lr > 0):
            raise ValueError(f"server_lr must be > 0, got {server_lr!r}")
        if not (isinstance(server_momentum, (int, float)) and 0 <= server_momentum < 1):
            raise ValueError(f"server_momentum must be in [0, 1), got {server_momentum!r}")
        super().__init__(*flower_args, concurrency=concurrency, **kwargs)
        self.buffer_size = int(buffer_size)
        self.server_lr, self.server_momentum = float(server_lr), float(server_momentum)
        self.staleness = staleness if isinstance(staleness, Staleness) else Staleness(staleness)
        self.buffer: NDArrays | None = None  # sum_k s(tau_k) Delta_k
        self.count = 0
        self.velocity: NDArrays | None = None

    def algorithm_lines(self) -> list[str]:
        return [f"FedBuff: buffer K = {self.buffer_size}, server lr {self.server_lr}, "
                f"server momentum {self.server_momentum}, staleness weight {self.staleness}"]

    def apply(self, task: AsyncTask, sent: NDArrays, client: NDArrays, staleness: int) -> None:
        """Algorithm 1: the buffer += s(tau_k) Delta_k."""
        self.buffer = add_update(self.buffer, sent, client, self.staleness(staleness))
        self.count += 1

    def update_ready(self) -> bool:
        """The buffer holds K updates."""
        return self.count >= self.buffer_size

    def buffer_fill(self) -> int:
        return self.count

    def server_update(self, server_round: int) -> ArrayRecord | None:
        """Algorithm 1: x <- x + eta_g (buffer / K) (through momentum); the buffer empties."""
        new, velocity = fedbuff_step(records.to_numpy(self.model), self.buffer, self.count,
                                     self.server_lr, self.server_momentum, self.velocity)
        self.velocity = velocity
        self.buffer, self.count = None, 0
        self.version += 1
        return records.to_record(new)

    def algorithm_state(self) -> dict:
        """The server momentum buffer, and the update buffer (empty between rounds unless
        a round ended short of K updates)."""
        return {"velocity": copied(self.velocity), "buffer": copied(self.buffer),
                "count": self.count}

    def load_algorithm_state(self, state: dict) -> None:
        self.velocity, self.buffer = copied(state["velocity"]), copied(state["buffer"])
        self.count = int(state["count"])


def copied(arrays: NDArrays | None) -> NDArrays | None:
    """A copy of each array (None stays None)."""
    return None if arrays is None else {k: np.array(v, copy=True) for k, v in arrays.items()}
