"""FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019, Algorithm 1)
on Flower's Message API.

Up to ``concurrency`` clients train at once; each client model x_new, trained from version
tau, is mixed in as it is applied: x_t = (1 - alpha_t) x_(t-1) + alpha_t x_new with
alpha_t = alpha s(t - tau) (Sec. 3: s constant, polynomial or hinge). t - tau of an update
trained from the newest model is 0, as in the authors' code (``fresh_staleness`` 1:
Algorithm 1 read literally; :mod:`strategies.algorithms.staleness` says why). A round of
Flower's loop is ``updates_per_round`` such updates. The math is
:mod:`strategies.algorithms.staleness`; the tasks, their arrival order and the simulated
clock are :mod:`strategies.engine.async_tasks`.

Contract: Flower's template (as :class:`strategies.FedBuff`). The paper's clients add a
proximal term (rho / 2) ||x - x_t||^2; FedAsync sends ``proximal-mu`` = rho when
``rho`` > 0, which :func:`strategies.client.fedprox` honours.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import contract as C
from ..engine.async_engine import (
    ASYNC_KEYS,
    Applied,
    AsyncAlgorithm,
    AsyncEngine,
    ClientUpdate,
    ServerStep,
)
from ..engine.averaging import NDArrays
from ..engine.keys import Interval, Key, at_least
from ..engine.participation import check_whole
from ..engine.registry import register
from .staleness import (
    FRESH_STALENESS,
    STALENESS_KEY,
    Staleness,
    check_fresh_staleness,
    fedasync_mix,
    fedasync_weight,
)

__all__ = ["AsyncMixing", "FedAsync"]


class AsyncMixing(AsyncAlgorithm):
    """FedAsync's algorithm: each client model mixed in as it is applied (Algorithm 1)."""

    name = "FedAsync"

    def __init__(self, alpha: float = 0.6, staleness: Staleness | str = "polynomial",
                 updates_per_round: int = 1, rho: float = 0.0, fresh_staleness: int = 0
                 ) -> None:
        if not (isinstance(alpha, (int, float)) and 0 < alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        check_whole("updates_per_round", updates_per_round, minimum=1)
        if not (isinstance(rho, (int, float)) and rho >= 0):
            raise ValueError(f"rho must be >= 0, got {rho!r}")
        self.fresh_staleness = check_fresh_staleness(fresh_staleness)
        self.staleness = staleness if isinstance(staleness, Staleness) else Staleness(staleness)
        self.alpha, self.rho = float(alpha), float(rho)
        self.updates_per_round = int(updates_per_round)
        self.mixed = 0  # this round's mixes

    def send(self) -> Mapping[str, object]:
        """``proximal-mu`` = rho when rho > 0 (the paper's client proximal term)."""
        return {C.PROXIMAL_MU: self.rho} if self.rho > 0 else {}

    def apply(self, update: ClientUpdate) -> Applied:
        """Algorithm 1: x_t = (1 - alpha_t) x_(t-1) + alpha_t x_new, alpha_t = alpha s(t - tau)
        (:func:`strategies.algorithms.staleness.fedasync_weight`; t - tau = the versions made
        since the client's + ``fresh_staleness``); each mix a model version."""
        alpha_t = fedasync_weight(self.alpha, self.staleness, update.staleness,
                                  self.fresh_staleness)
        self.mixed += 1
        return Applied(fedasync_mix(update.model, update.client, alpha_t),
                       self.mixed >= self.updates_per_round)

    def step(self, model: NDArrays, complete: bool) -> ServerStep:
        """The model after the round's mixes (each already a server update); None when the
        round mixed nothing."""
        mixed, self.mixed = self.mixed, 0
        return ServerStep(model if mixed else None, False)


class FedAsync(AsyncEngine):
    """FedAsync, asynchronous mixing (module docstring).

    Parameters
    ----------
    alpha : float
        alpha in (0, 1], the mixing weight of a fresh update (0.6 among the paper's).
    staleness : Staleness or str
        s: ``"polynomial"`` (a = 0.5), ``"hinge"`` (a = 10, b = 4), ``"constant"``
        (:class:`strategies.algorithms.staleness.Staleness` for other parameters).
    updates_per_round : int
        Client updates mixed in per round of Flower's loop (each round is evaluated).
    concurrency : int
        Most clients training at once.
    rho : float
        The clients' proximal weight, sent as ``proximal-mu`` (0: not sent).
    fresh_staleness : int
        t - tau of an update trained from the newest model: 0 (default, the authors' code:
        a fresh update mixes at alpha) or 1 (Algorithm 1 read literally: alpha s(1), e.g.
        alpha / sqrt(2) with the polynomial s). The run log's ``staleness`` is the versions
        made since the client's model either way.
    **kwargs
        :class:`strategies.engine.async_engine.AsyncEngine`'s.
    """

    def __init__(self, *flower_args, alpha: float = 0.6,
                 staleness: Staleness | str = "polynomial", updates_per_round: int = 1,
                 concurrency: int = 20, rho: float = 0.0, fresh_staleness: int = 0,
                 **kwargs) -> None:
        super().__init__(*flower_args, concurrency=concurrency, algorithm=AsyncMixing(
            alpha, staleness, updates_per_round, rho, fresh_staleness), **kwargs)


FEDASYNC_WHY = "FedAsync's server step is its mixing weight fedasync-alpha (Xie et al., Alg. 1)"
KEYS = (*ASYNC_KEYS, STALENESS_KEY,
        Key("fedasync-alpha", 0.6, "FedAsync's α: x ← (1 − α·s(τ))·x + α·s(τ)·x_client",
            interval=Interval(0.0, 1.0, open_low=True), arg="alpha"),
        Key("fedasync-updates-per-round", 10,
            "client updates FedAsync mixes in per round (each round is evaluated; 10 = as much "
            "client work per round as FedBuff's K = 10)", interval=at_least(1),
            arg="updates_per_round"),
        Key("fedasync-rho", 0.0, "FedAsync's proximal ρ, sent to clients as `proximal-mu` "
            "(0 = not sent)", interval=at_least(0.0), arg="rho"),
        Key("fedasync-fresh-staleness", 0,
            "FedAsync's staleness t − τ of an update trained from the newest model: 0 = the "
            "authors' code (it mixes at α), 1 = Algorithm 1 read literally (α·s(1))",
            interval=Interval(FRESH_STALENESS[0], FRESH_STALENESS[-1]), arg="fresh_staleness"))
register("fedasync", FedAsync, "FedAsync (Xie, Koyejo and Gupta 2019): each arriving model mixed "
         "in, staleness-weighted", engine="async", keys=KEYS,
         client_side="strategies.client.fedprox",
         only=tuple((key, (value,), FEDASYNC_WHY) for key, value in (
             ("weighting", "examples"), ("server-lr", 1.0), ("server-momentum", 0.0))))
