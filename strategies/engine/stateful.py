"""FedAvg whose clients keep state across rounds that the server mirrors (SCAFFOLD,
FedDyn, MOON).

:class:`StatefulFedAvg` is the Flower-records side of :mod:`strategies.engine.client_states` for a
strategy whose client state the server can derive from the reply (SCAFFOLD's c_i + delta
c_i; FedDyn's linear term from theta_k^t and theta^{t-1}; MOON's previous local model is
the reply's model):

* every train message carries the client's ``state-round`` (:meth:`task_config`), and the
  server's copy as the ArrayRecord ``client-state`` when the node may not hold that version
  (:meth:`prepared_messages`; those bytes count in ``bytes-down``);
* every reply must echo ``state-round`` and ``state-digest`` of the state it started from
  (the client helpers do; :meth:`contract_gap`, which a subclass may replace with its own
  contract); a round whose replies all lack them stops the run with a ClientContractError
  naming the subclass's helper (a stock ClientApp), a single reply that lacks them, fails
  the subclass's :meth:`state_reply_problem`, or started from another state than the
  server's copy, is rejected;
* :meth:`accept_states` updates the copies from the accepted replies, once per round;
* :meth:`state_dict` holds the copies, so a resumed run continues bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ConfigRecord, Message

from .. import contract as C
from .client_states import ClientStateMirror, NDArrays, attach_states, state_problem
from ..algorithms.fedavg import FedAvg
from .round_plan import ClientTask, RoundPlan
from .round_report import ClientStateSection

STATE_VERSION = 1


class StatefulFedAvg(FedAvg):
    """FedAvg plus the server's copy of every client's state (module docstring).

    Subclasses set ``CLIENT_HELPER``, call :meth:`accept_states` when they aggregate and add
    their own state to :meth:`state_dict`.
    """

    def __init__(self, *flower_args, **kwargs) -> None:
        super().__init__(*flower_args, **kwargs)
        self.mirror = ClientStateMirror()

    def client_key(self, node_id: int) -> str:
        """The key of a node's state: its partition id, else ``node-<id>``."""
        return self.participation.client_key(node_id)

    # ------------------------------------------------------------------ configure
    def task_config(self, plan: RoundPlan, task: ClientTask) -> ConfigRecord:
        """FedAvg's per-client config plus this client's ``state-round``."""
        own = ConfigRecord(dict(super().task_config(plan, task)))
        own[C.STATE_ROUND] = self.mirror.state_round(self.client_key(task.node_id))
        return own

    def prepared_messages(self, plan: RoundPlan, messages: list[Message]) -> list[Message]:
        """The server's copy of the state attached where needed."""
        attached, _ = attach_states(self.mirror, messages, self.client_key)
        plan.report.add(ClientStateSection(attached=attached))
        return messages

    # ------------------------------------------------------------------ aggregate
    def accept_states(self, plan: RoundPlan, accepted: list[Message],
                      new_state: Callable[[NDArrays | None, Message], NDArrays]) -> None:
        """The copy of each accepted reply's client becomes ``new_state(copy, reply)`` (copy
        None: the initial state); clients without an accepted reply get their copy attached
        to their next message. Logs the state round each accepted reply started from."""
        used_rounds = []
        for reply in accepted:
            node = reply.metadata.src_node_id
            key = self.client_key(node)
            self.mirror.accept(key, node, plan.server_round,
                               new_state(self.mirror.state_of(key), reply))
            used_rounds.append(int(reply.content[C.METRICS].get(
                C.STATE_ROUND_USED, plan.sent(node)[C.STATE_ROUND])))
        self.mirror.end_round()
        attached = plan.report.get(ClientStateSection)
        plan.report.add(ClientStateSection(attached and attached.attached, used_rounds))

    # ------------------------------------------------------------------ replies
    def contract_gap(self, reply: Message) -> str | None:
        """The client-state echo (``state-round``, ``state-digest``) the helpers send."""
        metrics = reply.content[C.METRICS] if C.METRICS in reply.content.metric_records else {}
        if C.STATE_ROUND_USED not in metrics or C.STATE_DIGEST not in metrics:
            return (f"the metrics '{C.STATE_ROUND_USED}' and '{C.STATE_DIGEST}' (the client "
                    f"state it started from)")
        return None

    def state_reply_problem(self, plan: RoundPlan, reply: Message) -> str | None:
        """What else a subclass checks in a reply that meets :meth:`contract_gap` (SCAFFOLD:
        delta c_i's keys, shapes and values), or None."""
        return None

    def reply_problem(self, plan: RoundPlan, reply: Message) -> str | None:
        """FedAvg's checks plus: the contract (:meth:`contract_gap`) met, the subclass's own
        checks, and the client started from the state the server holds (round and digest)."""
        problem = super().reply_problem(plan, reply)
        if problem:
            return problem
        gap = self.contract_gap(reply)
        if gap:
            return f"needs {gap}: call {self.CLIENT_HELPER} in the ClientApp"
        problem = self.state_reply_problem(plan, reply)
        if problem:
            return problem
        node = reply.metadata.src_node_id
        sent = int(plan.sent(node).get(C.STATE_ROUND, 0))
        return state_problem(self.mirror, self.client_key(node), sent, reply.content[C.METRICS])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """FedAvg's state plus the server's copies of every client's state (copied)."""
        state = super().state_dict()
        state["client-state-version"] = STATE_VERSION
        state["client-states"] = self.mirror.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        if state.get("client-state-version") != STATE_VERSION:
            raise ValueError(f"client-state version {state.get('client-state-version')!r} is "
                             f"not {STATE_VERSION}")
        self.mirror.load_state_dict(state["client-states"])
