"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021,
Algorithm 1), server side, on the engine's sampling, reply checks and client-state copies:

* send theta^{t-1} and alpha to each k in P_t, with the client's ``state-round`` (and the
  server's copy of its linear term grad L_k(theta_k^{t-1}) when the node may not hold it:
  :mod:`strategies.engine.client_states`);
* the copies grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t -
  theta^{t-1}), h^t = h^{t-1} - alpha (1 / m) sum_{k in P_t} (theta_k^t - theta^{t-1}) with
  m all clients, and theta^t = (1 / |P_t|) sum theta_k^t - (1 / alpha) h^t
  (:mod:`strategies.algorithms.feddyn_math`).

m is the total number of clients, fixed in Algorithm 1 (``n_clnt`` in the authors' code):
``num_clients`` when given, and the most clients connected in any round so far if more (or
none given) (:func:`strategies.engine.client_states.clients_so_far`). A client that leaves
keeps its linear term in h, as a client not in P_t does in Algorithm 1, and h stays the
mean of the server's copies of all m linear terms (0 for a client never heard from) while
no client joins beyond m. A client that joins beyond it raises m without rescaling h, so h
is no longer that mean: Algorithm 1 defines no join, and we keep its update
(:class:`FedDyn`'s Notes give numbers).

The client side (the dynamic regulariser and the linear-term update) is
:class:`strategies.client.feddyn.FedDynClient`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import contract as C
from ..contract import Section, logged
from ..engine import records, trust_gate
from ..engine.algorithm import Algorithm, Contract, Outgoing, RoundInput, RoundUpdate
from ..engine.client_states import TotalClients
from ..engine.keys import Key, above, at_least
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan
from . import feddyn_math as fm

__all__ = ["DynamicRegulariser", "FEDDYN_HELPER", "FedDyn"]

FEDDYN_HELPER = "strategies.client.FedDynClient"
FEDDYN_WEIGHTINGS = ("uniform", "examples")


@dataclass(frozen=True)
class FedDynSection(Section):
    """||h^t|| after the round (Acar et al. 2021, Alg. 1)."""

    h_norm: float = logged(C.LOG_FEDDYN_H_NORM, default=0.0)


class DynamicRegulariser(Algorithm):
    """FedDyn's algorithm: alpha beside the model, the linear terms' copies, h (its state)."""

    name = "FedDyn"
    contract = Contract(helper=FEDDYN_HELPER, client_state="required")

    def __init__(self, alpha: float = 0.01, num_clients: int = 0) -> None:
        if not alpha > 0:
            raise ValueError(f"FedDyn's alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)
        self.h: fm.NDArrays | None = None  # h^t
        self.clients = TotalClients(num_clients, "feddyn-num-clients", self.name)  # m

    def send(self, plan: RoundPlan) -> Outgoing:
        """alpha to every client (h^0 = 0 is set up from the first model)."""
        if self.h is None:
            self.h = fm.zero_state(records.to_numpy(plan.arrays))
        return Outgoing(common={C.FEDDYN_ALPHA: self.alpha})

    def update(self, r: RoundInput) -> RoundUpdate:
        """The average of the accepted theta_k^t (the engine's), the copies of the linear
        terms, h^t (m from :class:`strategies.engine.client_states.TotalClients`), and
        theta^t = average - h^t / alpha."""
        average, used = r.average()
        clients = self.clients.update(len(r.plan.nodes))
        previous = r.global_arrays  # theta^{t-1}
        drift: fm.NDArrays | None = None
        states = []
        for k in used:
            local = r.models[k][1]  # theta_k^t
            drift = fm.add_drift(drift, local, previous, self.h)
            states.append(fm.linear_term_update(r.states[k] or fm.zero_state(self.h),
                                                self.alpha, local, previous))
        if drift is not None:
            self.h = trust_gate.finite_or_previous(
                fm.h_step(self.h, drift, self.alpha, clients), self.h, "FedDyn's h",
                r.server_round)
        new = None if average is None else fm.server_model(average, self.h, self.alpha)
        return RoundUpdate(new, used, states, [FedDynSection(fm.norm(self.h))])

    def state_dict(self) -> dict:
        """h (copied) and m."""
        return {"h": None if self.h is None else {k: v.copy() for k, v in self.h.items()},
                "clients": self.clients.value}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (a checkpoint without m: m from the next
        round on, as in a new run)."""
        self.h = None if state["h"] is None else {k: v.copy() for k, v in state["h"].items()}
        self.clients.load(state.get("clients"))


class FedDyn(RoundEngine):
    """FedDyn: a per-client linear term and the server state h make the clients' stationary
    points agree with the global objective's.

    Parameters
    ----------
    alpha : float
        alpha > 0 of the dynamic regulariser (the authors' CIFAR-10 example uses 0.01).
    weighting : str
        ``"uniform"`` (default): the average (1 / |P_t|) sum theta_k^t of Algorithm 1.
        ``"examples"``: weighted by n_k / sum_{j in P_t} n_j, as FedAvg (the app's default
        weighting). h is always updated with Algorithm 1's (1 / m) sum.
    straggler_policy : str
        ``"partial"`` by default: a straggler's model after its reduced work is aggregated
        (and updates its linear term), as FedProx's inexact solutions.
    num_clients : int
        m of the h update, the total number of clients (the federation's size, if known);
        0 (default): the most clients connected in any round so far. m is never below the
        clients connected (a WARNING says so once).
    **kwargs
        As :class:`FedAvg` (``fraction_train``, ``seed``, ``query_client_info``, ...);
        ``server_lr`` must be 1.0 (Algorithm 1 has no server step size).

    Notes
    -----
    m, the total number of clients of Algorithm 1's h update (fixed there), is
    ``num_clients``, or the most clients connected in any round so far when that is more
    (or none is given). From h^0 = 0, h is the mean over all m clients of the server's
    copies of their linear terms (0 for a client never heard from) however many replies
    fail and whichever clients leave (a client that leaves keeps its linear term in h, as
    one not in P_t does). A client that joins beyond m raises m from then on, but h is not
    rescaled, so it is no longer that mean: with 3 clients for two rounds and then 5,
    client k moving theta by k (k = 1..5) every round and alpha = 0.5,
    h = -0.5 (2 (6 / 3) + 2 (15 / 5)) = -5, while the copies' mean is
    -0.5 (4 + 8 + 12 + 8 + 10) / 5 = -4.2 (with ``num_clients=5``: h = -4.2). Clients are keyed by the partition id they
    report to the client-info query (``query_client_info=True``), else by node id. The
    server keeps a copy of every client's linear term (one model-sized array set per client
    that has replied, in memory and in every checkpoint) so that it survives a resumed run,
    a lost reply and a SuperNode restart.

    The regulariser's gradient alpha (theta - theta^{t-1}) - grad L_k(theta_k^{t-1}) enters
    every local gradient before the optimiser step, so the configured local momentum and
    weight decay act on the whole FedDyn objective (weight decay adds (wd / 2) ||theta||^2).

    What the authors' code (alpemreacar/FedDyn, ``utils_methods.train_FedDyn``) does beyond
    Algorithm 1, and what we do: it scales alpha per client by its data share,
    alpha_k = alpha / (n_k / mean n) (1 for balanced data; we use one alpha); it clips
    the local gradient norm at 10 (we do not clip); it folds alpha into SGD's weight decay
    (the same gradient as ours); and its logged test accuracy is of the plain average of
    the clients' models, not of the h-corrected theta^t. The ServerApp here evaluates
    theta^t, the model Algorithm 1 sends to the clients.

    Contract
    --------
    Server -> client: ``arrays`` (theta^{t-1}), config ``feddyn-alpha`` and ``state-round``,
    and ArrayRecord ``client-state`` (the server's copy of the linear term) when attached.
    Client -> server: ``arrays`` (theta_k^t), metrics ``num-examples`` and ``state-round`` /
    ``state-digest`` of the linear term it started from.
    :class:`strategies.client.feddyn.FedDynClient` does all of it; a round in which every
    reply lacks the echo stops the run with a ClientContractError naming it.
    """

    def __init__(self, *flower_args, alpha: float = 0.01, weighting: str = "uniform",
                 straggler_policy: str = "partial", num_clients: int = 0, **kwargs) -> None:
        if weighting not in FEDDYN_WEIGHTINGS:
            raise ValueError(f"FedDyn averages theta_k with weighting 'uniform' (Alg. 1) or "
                             f"'examples' (FedAvg's); weighting={weighting!r} is not supported")
        if kwargs.get("server_lr", 1.0) != 1.0:
            raise ValueError(f"FedDyn's server model is (1 / |P_t|) sum theta_k - h / alpha "
                             f"(Alg. 1): server_lr must be 1.0, got {kwargs['server_lr']}")
        super().__init__(*flower_args, algorithm=DynamicRegulariser(alpha, num_clients),
                         weighting=weighting,
                         straggler_policy=straggler_policy, **kwargs)


FEDDYN_WHY = "FedDyn's server model is the mean of the theta_k minus h / alpha, Alg. 1"
KEYS = (Key("feddyn-alpha", 0.01,
            "FedDyn's α: clients minimise L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²; "
            "the server sends θ^t = mean θ_k − h^t/α (0.01: the authors' CIFAR-10 example)",
            interval=above(0.0), arg="alpha"),
        Key("feddyn-num-clients", 0,
            "FedDyn's m in h^t = h^{t−1} − (α/m)·Σ_k (θ_k − θ^{t−1}) (Alg. 1): the total number "
            "of clients (the federation's size, if known); 0 = the most clients connected in "
            "any round so far ([FedDyn](strategies/feddyn.md#clients-that-join-or-leave))",
            interval=at_least(0), arg="num_clients"))
register("feddyn", FedDyn, "FedDyn (Acar et al. 2021, Alg. 1): dynamic regulariser (client "
         "helper)", keys=KEYS, client_side="strategies.client.feddyn",
         only=(("weighting", FEDDYN_WEIGHTINGS, "FedDyn averages over the sampled clients: "
                "'examples' or 'uniform' (Algorithm 1's 1/|P_t| mean of the θ_k)"),
               ("server-lr", (1.0,), FEDDYN_WHY), ("server-momentum", (0.0,), FEDDYN_WHY)))
