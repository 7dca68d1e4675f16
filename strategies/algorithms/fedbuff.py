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

from ..engine.async_engine import (
    ASYNC_KEYS,
    Applied,
    AsyncAlgorithm,
    AsyncEngine,
    ClientUpdate,
    ServerStep,
)
from ..engine.averaging import NDArrays, WeightedModelSum, copied
from ..engine.keys import Key, at_least
from ..engine.participation import check_whole
from ..engine.registry import register
from .staleness import STALENESS_KEY, Staleness, add_update, fedbuff_step

__all__ = ["BufferedAsync", "FedBuff"]


class BufferedAsync(AsyncAlgorithm):
    """FedBuff's algorithm: the buffer of staleness-weighted client updates and the server
    step once K are in (Algorithm 1); the buffer and the server momentum its state."""

    name = "FedBuff"

    def __init__(self, buffer_size: int = 10, server_lr: float = 1.0,
                 server_momentum: float = 0.0, staleness: Staleness | str = "fedbuff") -> None:
        check_whole("buffer_size", buffer_size, minimum=1)
        if not (isinstance(server_lr, (int, float)) and server_lr > 0):
            raise ValueError(f"server_lr must be > 0, got {server_lr!r}")
        if not (isinstance(server_momentum, (int, float)) and 0 <= server_momentum < 1):
            raise ValueError(f"server_momentum must be in [0, 1), got {server_momentum!r}")
        self.buffer_size = int(buffer_size)
        self.server_lr, self.server_momentum = float(server_lr), float(server_momentum)
        self.staleness = staleness if isinstance(staleness, Staleness) else Staleness(staleness)
        self.buffer = WeightedModelSum()  # its sum: sum_k s(tau_k) Delta_k
        self.count = 0
        self.velocity: dict | None = None

    def apply(self, update: ClientUpdate) -> Applied:
        """Algorithm 1: the buffer += s(tau_k) Delta_k; ready once it holds K updates."""
        add_update(self.buffer, update.sent, update.client, self.staleness(update.staleness))
        self.count += 1
        return Applied(None, self.count >= self.buffer_size)

    def step(self, model: NDArrays, complete: bool) -> ServerStep:
        """Algorithm 1: x <- x + eta_g (buffer / K) (through momentum); the buffer empties. A
        round that ended short keeps its buffer for the next round."""
        fill = self.count
        if not complete:
            return ServerStep(None, False, fill)
        new, self.velocity = fedbuff_step(model, self.buffer.sum, self.count, self.server_lr,
                                          self.server_momentum, self.velocity)
        self.buffer, self.count = WeightedModelSum(), 0
        return ServerStep(new, True, fill)

    def state_dict(self) -> dict:
        """The server momentum buffer, and the update buffer (empty between rounds unless
        a round ended short of K updates)."""
        return {"velocity": copied(self.velocity),
                "buffer": copied(self.buffer.sum) if self.count else None, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.velocity, self.count = copied(state["velocity"]), int(state["count"])
        self.buffer = WeightedModelSum()
        if state["buffer"] is not None:
            self.buffer.sum, self.buffer.count = copied(state["buffer"]), self.count


class FedBuff(AsyncEngine):
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
        :class:`strategies.engine.async_engine.AsyncEngine`'s: ``arrival``,
        ``fraction_evaluate``, ``seed``, ``min_available_nodes``, ``query_client_info``,
        ``query_timeout``, ``clock``, ``participation``.
    """

    def __init__(self, *flower_args, buffer_size: int = 10, concurrency: int = 20,
                 server_lr: float = 1.0, server_momentum: float = 0.0,
                 staleness: Staleness | str = "fedbuff", **kwargs) -> None:
        super().__init__(*flower_args, concurrency=concurrency, algorithm=BufferedAsync(
            buffer_size, server_lr, server_momentum, staleness), **kwargs)


KEYS = (*ASYNC_KEYS, STALENESS_KEY, Key("fedbuff-buffer-size", 10,
                         "K, client updates per FedBuff server step (one round)",
                         interval=at_least(1), arg="buffer_size"))
register("fedbuff", FedBuff, "FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation, "
         "staleness-weighted", engine="async", keys=KEYS,
         reads={"server-lr": "server_lr", "server-momentum": "server_momentum"},
         only=(("weighting", ("examples",), "FedBuff's server step averages the buffer, 1/K "
                "sum of the weighted updates"),))
