"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1; option II; global step size eta_g).

Algorithm 1, server side, on the engine's sampling, reply checks and client-state copies:

* line 5: sample S and send (x, c) to each i in S, with the client's ``state-round`` (and
  the server's copy of c_i when the node may not hold it: :mod:`strategies.engine.client_states`);
* lines 16-17: x <- x + eta_g sum_{i in S} c_k (y_i - x), i.e. x + eta_g mean_{i in S}
  delta y_i with the ``uniform`` weighting; c <- c + |S| / N mean_{i in S} delta c_i
  (:func:`strategies.algorithms.scaffold_math.control_step`); the server's copy of each
  c_i <- c_i + delta c_i.

N of line 17 is the total number of clients, fixed in Algorithm 1: ``num_clients`` when
given, and the most clients connected in any round so far if more (or none given)
(:func:`strategies.engine.client_states.clients_so_far`). A client that leaves is then what
Algorithm 1 calls a client not sampled (its c_i stays in c), and c stays the mean of the
server's copies of all N c_i (0 for a client never heard from) while no client joins beyond
N. A client that joins beyond it raises N without rescaling c, so c is no longer that mean:
Algorithm 1 defines no join, and we keep its update (:class:`Scaffold`'s Notes give numbers).

The client side (lines 7-14) is :class:`strategies.client.scaffold.ScaffoldClient`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message

from .. import contract as C
from ..contract import Section, logged
from ..engine import records, trust_gate
from ..engine.algorithm import Algorithm, Contract, Outgoing, RoundInput, RoundUpdate
from ..engine.client_states import TotalClients
from ..engine.keys import Key, at_least
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan
from . import scaffold_math as sm

__all__ = ["ControlVariates", "SCAFFOLD_HELPER", "Scaffold", "scaffold_delta_problem"]

SCAFFOLD_HELPER = "strategies.client.ScaffoldClient"
SCAFFOLD_WEIGHTINGS = ("uniform", "examples")


@dataclass(frozen=True)
class ScaffoldSection(Section):
    """||c|| after the round (Karimireddy et al. 2020, Alg. 1 line 17)."""

    c_norm: float = logged(C.LOG_SCAFFOLD_C_NORM, default=0.0)


class ControlVariates(Algorithm):
    """SCAFFOLD's algorithm: c beside the model, delta c_i checked, x and c updated (lines
    16-17), c its state."""

    name = "SCAFFOLD"
    contract = Contract(helper=SCAFFOLD_HELPER, arrays=(C.SCAFFOLD_DELTA_C,),
                        sends=(C.SCAFFOLD_C,), client_state="optional")

    def __init__(self, num_clients: int = 0) -> None:
        self.control: sm.NDArrays | None = None  # c; the engine holds the copies of c_i
        self.clients = TotalClients(num_clients, "scaffold-num-clients", self.name)  # N

    def send(self, plan: RoundPlan) -> Outgoing:
        """Line 5: c (0 before the first round) to every client."""
        if self.control is None:
            self.control = sm.zero_control(records.to_numpy(plan.arrays))
        return Outgoing(records={C.SCAFFOLD_C: records.to_record(self.control)})

    def check(self, plan: RoundPlan, reply: Message) -> str | None:
        """delta c_i: real bytes with c's keys, shapes and dtypes, finite, and within option
        II's ||c|| + ||x - y_i|| / (K eta_l) (:func:`scaffold_delta_problem`)."""
        return scaffold_delta_problem(reply, control=self.control, global_model=plan.arrays,
                                      sent=plan.sent(reply.metadata.src_node_id))

    def update(self, r: RoundInput) -> RoundUpdate:
        """Lines 16-17: x from the accepted y_i (the engine's average), then c and the
        copies of c_i from their delta c_i (one deserialised at a time), in partition order;
        N from :class:`strategies.engine.client_states.TotalClients`."""
        new, used = r.average()
        clients = self.clients.update(len(r.plan.nodes))
        total, states = None, []
        for k in used:
            delta = records.to_numpy(r.replies[k].content[C.SCAFFOLD_DELTA_C])
            total = sm.add_delta(total, delta)
            states.append(sm.apply_delta(r.states[k] or sm.zero_control(self.control), delta))
        if total is not None:
            self.control = trust_gate.finite_or_previous(
                sm.control_step(self.control, total, len(used), clients),
                self.control, "SCAFFOLD's c", r.server_round)
        return RoundUpdate(new, used, states, [ScaffoldSection(sm.norm(self.control))])

    def state_dict(self) -> dict:
        """c (copied) and N."""
        return {"control": None if self.control is None else
                {k: v.copy() for k, v in self.control.items()}, "clients": self.clients.value}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (a checkpoint without N: N from the next
        round on, as in a new run)."""
        control = state["control"]
        self.control = None if control is None else {k: v.copy() for k, v in control.items()}
        self.clients.load(state.get("clients"))


class Scaffold(RoundEngine):
    """SCAFFOLD: control variates c (server) and c_i (clients) correct the client drift.

    Parameters
    ----------
    weighting : str
        ``"uniform"`` (default): x <- x + eta_g (1 / |S|) sum_{i in S} delta y_i, Alg. 1
        line 16. ``"examples"``: delta y_i weighted by n_i / sum_{j in S} n_j, as NIID-Bench's
        implementation (Li et al., ICDE 2022) and FedAvg do. c is always updated with the
        plain mean (line 17).
    server_lr : float
        eta_g, the global step size (1.0: x is the mean of the y_i).
    straggler_policy : str
        ``"partial"`` by default: option II divides by the K steps a client actually took,
        so a straggler's c_i+ is still a mean-gradient estimate and its work is used.
    num_clients : int
        N of line 17, the total number of clients (the federation's size, if known);
        0 (default): the most clients connected in any round so far. N is never below the
        clients connected (a WARNING says so once).
    **kwargs
        As :class:`FedAvg` (``fraction_train``, ``seed``, ``query_client_info``, ...).

    Notes
    -----
    Partial participation (line 17): |S| is the clients whose reply was accepted and N the
    total number of clients, which Algorithm 1 takes as fixed: ``num_clients``, or the most
    clients connected in any round so far when that is more (or none is given). From
    c = c_i = 0, c is the mean of the server's copies of all N c_i (0 for a client never
    heard from) however many replies fail and whichever clients leave: a client that leaves
    keeps its c_i in c, as Algorithm 1 keeps that of a client not sampled. A client that
    joins beyond N raises N from then on, but Algorithm 1 has no rule for it and we add
    none: c is not rescaled, so it is no longer the mean. With 3 clients for two rounds
    and then 5, each returning delta c_i = i (i = 1..5) every round, c = 2 (6 / 3) +
    2 (15 / 5) = 10, while the copies' mean is (4 + 8 + 12 + 8 + 10) / 5 = 8.4; with
    ``num_clients=5``, c = (2 * 6 + 2 * 15) / 5 = 8.4, the mean.
    Clients are keyed by the partition id they report to the client-info query
    (``query_client_info=True``), else by node id (then c_i does not survive a resumed run
    or a SuperNode that rejoins with another id).

    State: c, N and the copies of every c_i (one model per client:
    :mod:`strategies.engine.client_states`) are in :meth:`state_dict`, so a resumed run
    continues bit for bit.

    Contract
    --------
    Server -> client: ``arrays`` (x), ArrayRecord ``scaffold-c`` (c), config ``lr`` (eta_l)
    and ``state-round``, and ArrayRecord ``client-state`` (the server's c_i) when attached.
    Client -> server: ``arrays`` (y_i, the local model: the server forms delta y_i = y_i - x),
    ArrayRecord ``scaffold-delta-c`` (delta c_i, the keys of ``scaffold-c``), metrics
    ``num-examples``, and ``state-round`` / ``state-digest`` of the c_i it started from.
    :class:`strategies.client.scaffold.ScaffoldClient` does all of it; a round in which
    every reply lacks ``scaffold-delta-c`` stops the run with a ClientContractError
    naming it. The control variates' bytes count in the run log's ``bytes-up`` /
    ``bytes-down``.
    """

    def __init__(self, *flower_args, weighting: str = "uniform",
                 straggler_policy: str = "partial", num_clients: int = 0, **kwargs) -> None:
        if weighting not in SCAFFOLD_WEIGHTINGS:
            raise ValueError(f"SCAFFOLD averages delta y_i with weighting 'uniform' (Alg. 1) or "
                             f"'examples' (NIID-Bench); weighting={weighting!r} is not supported")
        super().__init__(*flower_args, algorithm=ControlVariates(num_clients),
                         weighting=weighting,
                         straggler_policy=straggler_policy, **kwargs)


def scaffold_delta_problem(reply: Message, *, control: Mapping[str, np.ndarray],
                           global_model: ArrayRecord, sent: Mapping[str, object] | None
                           ) -> str | None:
    """What makes SCAFFOLD's delta c_i in a reply (whose ``arrays`` passed
    :func:`train_reply_problem`) unusable, or None: the real bytes of ``scaffold-delta-c``
    against c's keys, shapes and dtypes, finite values of bounded norm, and option II's
    bound ||delta c_i|| <= ||c|| + ||x - y_i|| / (K eta_l)
    (:func:`strategies.algorithms.scaffold_math.delta_bound`; K the reply's ``local-steps``, else 1;
    eta_l the ``lr`` sent: with no ``lr`` sent there is no bound, and the client helper
    refuses to run)."""
    try:
        delta = trust_gate.read_record(C.SCAFFOLD_DELTA_C, reply.content[C.SCAFFOLD_DELTA_C], control)
    except trust_gate.Refused as exc:
        return str(exc)
    lr = (sent or {}).get(C.LR)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (
            math.isfinite(lr) and lr > 0):
        return None
    steps = reply.content[C.METRICS].get(C.LOCAL_STEPS_TAKEN)
    steps = int(steps) if trust_gate.is_integer(steps) and steps >= 1 else 1
    bound = sm.delta_bound(control, trust_gate.record_views(global_model),
                           trust_gate.record_views(reply.content[C.ARRAYS]), steps, float(lr))
    norm = sm.delta_norm(delta)
    if norm <= bound:
        return None
    return (f"'{C.SCAFFOLD_DELTA_C}' has norm {norm:.3g}, above the {bound:.3g} option II "
            f"can give: ||c|| + ||x - y_i|| / (K eta_l) with K = {steps}, eta_l = {lr:g} "
            f"(Karimireddy et al. 2020, Alg. 1 line 12)")


KEYS = (Key("scaffold-num-clients", 0,
            "SCAFFOLD's N in c ← c + (|S|/N)·mean Δc_i (Alg. 1 line 17): the total number of "
            "clients (the federation's size, if known); 0 = the most clients connected in any "
            "round so far ([SCAFFOLD](strategies/scaffold.md#clients-that-join-or-leave))",
            interval=at_least(0), arg="num_clients"),)
register("scaffold", Scaffold, "SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II): control "
         "variates (client helper)", keys=KEYS, client_side="strategies.client.scaffold",
         only=(("weighting", SCAFFOLD_WEIGHTINGS, "SCAFFOLD averages over the sampled clients: "
                "'examples' (NIID-Bench's form) or 'uniform' (Algorithm 1)"),
               ("server-momentum", (0.0,), "SCAFFOLD's server step is x + eta_g mean delta y_i, "
                "Alg. 1 line 17")))
