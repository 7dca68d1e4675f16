"""The server's copy of each client's state, so that client state survives everything.

Stateful clients (SCAFFOLD's c_i; FedDyn's linear term and MOON's previous model use the
same mechanism) keep their state in ``Context.state``
(:mod:`strategies.client.state`). Three things can make client and server disagree:

(a) a resumed run (``resume-from``) is a new Flower run: every node's ``Context.state``
    starts empty;
(b) a reply is lost or rejected (crash, late, malformed) after the client already
    updated its state;
(c) a deployed SuperNode restarts and loses its ``Context.state``.

The server therefore keeps, per client key (the partition id, which survives restarts;
node ids do not), a mirror of the client's state derived from what the client returned
(for SCAFFOLD c_i <- c_i + delta c_i, computed the same way on both sides), the round
whose accepted reply produced it (``state-round``), and the node known to hold it.

Every train message carries ``state-round`` for its client (0 = the initial state).
When the server cannot be sure the node holds that version, it attaches its copy as the
ArrayRecord ``client-state`` (:func:`must_attach`): the first message to the client in
this server process (e.g. after a resume), a changed node id, or a previous message that
did not end in an accepted reply. The client helper
(:func:`strategies.client.state.resolve_state`) installs an attached copy, else uses its
own state if its round matches, else the initial state when ``state-round`` is 0, else
raises :class:`strategies.client.state.ClientStateLost`: the reply is an error, the round
goes on without that client, and the next message to it carries the copy. Replies echo
the round and the :func:`state_digest` of the state they started from, and the server
rejects a reply whose digest differs from its copy, so a disagreement is never aggregated.

Memory: one model-sized copy per client that has ever replied, on the server (and in
every checkpoint).

The round engine is given a :class:`ClientStates` when its algorithm's contract says its
clients keep state (SCAFFOLD, FedDyn, MOON): it puts ``state-round`` in each node's config,
attaches the copies where needed, checks each reply's echo, hands the algorithm the copies
of the replying clients (:meth:`ClientStates.copies`) and takes their new states
(:meth:`ClientStates.accept`); its state is in every checkpoint.

The server state of SCAFFOLD (c) and FedDyn (h) is the mean of the clients' states over
the total number of clients, N (m), fixed in both papers. :func:`clients_so_far` is that
number on a fleet that changes; :class:`TotalClients` keeps it across rounds.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from .. import contract as C
from .records import to_record
from .round_plan import RoundPlan
from .round_report import ClientStateSection

NDArrays = dict[str, np.ndarray]
STATE_VERSION = 1


def state_digest(arrays: Mapping[str, np.ndarray]) -> int:
    """A 63-bit digest of named arrays (keys, dtypes, shapes and bytes): fits a MetricRecord
    int. Client and server compute it on their versions of the same state."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def must_attach(state_round: int, holder: int | None, node_id: int) -> bool:
    """Whether a train message to ``node_id`` must carry the server's copy of the state.

    Not for the initial state (``state_round`` 0: the client builds it itself); otherwise
    unless ``node_id`` is the node whose accepted reply the server saw last for this client
    in this server process (``holder``; None after a resume, or after a message to it that
    did not end in an accepted reply).
    """
    return state_round > 0 and holder != node_id


class ClientStateMirror:
    """The server's copy of every client's state, by client key (see the module docstring).

    Per round: :meth:`message` for each train message (returns the copy to attach or None),
    :meth:`accept` for each accepted reply, then :meth:`end_round`, which forgets which
    node holds the state of every client whose message did not end in an accepted reply.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, NDArrays] = {}
        self.rounds: dict[str, int] = {}
        self.digests: dict[str, int] = {}
        self.holders: dict[str, int] = {}  # this process only: never checkpointed
        self.pending: dict[str, int] = {}

    def state_round(self, key: str) -> int:
        """The round whose accepted reply produced the copy (0: the initial state)."""
        return self.rounds.get(key, 0)

    def state_of(self, key: str) -> NDArrays | None:
        """The copy of ``key``'s state (None: the initial state)."""
        return self.arrays.get(key)

    def digest_of(self, key: str) -> int | None:
        """:func:`state_digest` of the copy (None: the initial state)."""
        return self.digests.get(key)

    def message(self, key: str, node_id: int) -> NDArrays | None:
        """A train message goes to ``node_id`` for client ``key``: the copy to attach, or None."""
        self.pending[key] = node_id
        if must_attach(self.state_round(key), self.holders.get(key), node_id):
            return self.arrays[key]
        return None

    def accept(self, key: str, node_id: int, server_round: int, arrays: NDArrays) -> None:
        """The client's reply of ``server_round`` was accepted: ``arrays`` is its new state."""
        self.arrays[key] = arrays
        self.rounds[key] = int(server_round)
        self.digests[key] = state_digest(arrays)
        self.holders[key] = node_id
        self.pending.pop(key, None)

    def end_round(self) -> None:
        """Clients sent a message without an accepted reply: their node may hold a newer
        (or no) state, so their next message carries the copy."""
        for key in self.pending:
            self.holders.pop(key, None)
        self.pending.clear()

    def state_dict(self) -> dict:
        """The copies and their rounds (arrays copied); which node holds them is not kept."""
        return {"version": STATE_VERSION,
                "arrays": {k: {n: np.array(v, copy=True) for n, v in a.items()}
                           for k, a in self.arrays.items()},
                "rounds": dict(self.rounds)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; every client's next message carries its
        copy (no node is known to hold it)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"client-state mirror version {state.get('version')!r} is not "
                             f"{STATE_VERSION}")
        self.arrays = {str(k): {n: np.array(v, copy=True) for n, v in a.items()}
                       for k, a in state["arrays"].items()}
        self.rounds = {str(k): int(r) for k, r in state["rounds"].items()}
        self.digests = {k: state_digest(a) for k, a in self.arrays.items()}
        self.holders, self.pending = {}, {}


# ----------------------------------------------------------------- strategy glue
def attach_states(mirror: ClientStateMirror, messages: Iterable[Message],
                  key_of: Callable[[int], str]) -> tuple[int, int]:
    """:meth:`ClientStateMirror.message` for each train message, attaching the copy as the
    ArrayRecord ``client-state`` where needed. Returns (messages with a copy, their bytes)."""
    attached, size = 0, 0
    for msg in messages:
        node = msg.metadata.dst_node_id
        copy = mirror.message(key_of(node), node)
        if copy is not None:
            record = to_record(copy)
            msg.content[C.CLIENT_STATE] = record
            attached += 1
            size += record.count_bytes()
    return attached, size


def state_problem(mirror: ClientStateMirror, key: str, sent_round: int,
                  metrics: Mapping[str, object]) -> str | None:
    """Why a reply did not start from the state the server holds, or None: its
    ``state-round`` / ``state-digest`` are not integers in 0..2^63 - 1 (a bool or a float is
    refused), its ``state-round`` differs from the one sent, or its ``state-digest`` from
    the copy's (both optional in the reply; checked when present)."""
    used = metrics.get(C.STATE_ROUND_USED, sent_round)
    digest = metrics.get(C.STATE_DIGEST)
    for name, value in ((C.STATE_ROUND_USED, used), (C.STATE_DIGEST, digest)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < 2**63):
            return f"'{name}' must be an integer in 0..2^63 - 1, got {value!r}"
    if used != sent_round:
        return (f"the client started from its state of round {used!r}, the server's copy "
                f"is of round {sent_round}")
    expected = mirror.digest_of(key)
    if sent_round > 0 and digest is not None and digest != expected:
        return (f"the client's state of round {sent_round} differs from the server's copy "
                f"(state-digest {digest} vs {expected}); the next message carries the copy")
    return None


class ClientStates:
    """The engine's component for clients that keep state (module docstring): the
    :class:`ClientStateMirror` and the per-round glue around it."""

    def __init__(self) -> None:
        self.mirror = ClientStateMirror()

    def state_round(self, key: str) -> int:
        """The ``state-round`` a train message to client ``key`` carries."""
        return self.mirror.state_round(key)

    def attach(self, plan: RoundPlan, messages: list[Message],
               key_of: Callable[[int], str]) -> None:
        """The server's copy attached where needed (:func:`attach_states`), counted in the
        round's report."""
        attached, _ = attach_states(self.mirror, messages, key_of)
        plan.report.add(ClientStateSection(attached=attached))

    def problem(self, plan: RoundPlan, reply: Message, key: str) -> str | None:
        """Why a reply did not start from the state the server holds (:func:`state_problem`)."""
        sent = int(plan.sent(reply.metadata.src_node_id).get(C.STATE_ROUND, 0))
        return state_problem(self.mirror, key, sent, reply.content[C.METRICS])

    def copies(self, replies: list[Message], key_of: Callable[[int], str]
               ) -> list[NDArrays | None]:
        """The copy of each replying client's state (None: the initial state)."""
        return [self.mirror.state_of(key_of(r.metadata.src_node_id)) for r in replies]

    def accept(self, plan: RoundPlan, accepted: list[Message], new_states: list[NDArrays],
               key_of: Callable[[int], str]) -> None:
        """Each accepted reply's client now holds ``new_states[k]``; clients without an
        accepted reply get their copy attached to their next message. Logs the state round
        each accepted reply started from."""
        used_rounds = []
        for reply, state in zip(accepted, new_states, strict=True):
            node = reply.metadata.src_node_id
            self.mirror.accept(key_of(node), node, plan.server_round, state)
            used_rounds.append(int(reply.content[C.METRICS].get(
                C.STATE_ROUND_USED, plan.sent(node)[C.STATE_ROUND])))
        self.mirror.end_round()
        attached = plan.report.get(ClientStateSection)
        plan.report.add(ClientStateSection(attached and attached.attached, used_rounds))

    def state_dict(self) -> dict:
        """The copies (:meth:`ClientStateMirror.state_dict`)."""
        return self.mirror.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.mirror.load_state_dict(state)


# ----------------------------------------------------------------- N, the total number of clients
def clients_so_far(previous: int, connected: int) -> int:
    """N of SCAFFOLD's c update (Karimireddy et al. 2020, Alg. 1 line 17) and m of FedDyn's h
    update (Acar et al. 2021, Alg. 1): the total number of clients, fixed in both papers, on
    a fleet that changes: max(``previous``, ``connected``), i.e. the most clients connected
    in any round so far (and at least the N given). A client that leaves stays counted, as
    a client not sampled does in both algorithms; a client that joins is counted from the
    round it is connected in (the server state is not rescaled: the papers have no rule
    for a join)."""
    if previous < 0 or connected < 0:
        raise ValueError(f"client counts are >= 0, got {previous} and {connected}")
    return max(int(previous), int(connected))


class TotalClients:
    """N across rounds (:func:`clients_so_far`), starting from ``given`` (0: none given; run
    config key ``key``): :meth:`update` with each round's connected clients. When more
    clients connect than ``given``, N follows them and one WARNING names the key."""

    def __init__(self, given: int, key: str, owner: str) -> None:
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < 0:
            raise ValueError(f"num_clients (run config {key}) is N, the total number of "
                             f"clients whose states {owner}'s server state averages: a whole "
                             f"number >= 1, or 0 for the most clients connected in any round "
                             f"so far; got {given!r}")
        self.given, self.key, self.owner = int(given), key, owner
        self.value, self.warned = int(given), False

    def update(self, connected: int) -> int:
        """N for a round with ``connected`` clients."""
        if self.given and connected > self.given and not self.warned:
            self.warned = True
            log(WARNING, "%s: %d clients are connected, more than %s=%d, the total number of "
                "clients; N is now the most connected so far (set %s to the federation's "
                "size, or 0)", self.owner, connected, self.key, self.given, self.key)
        self.value = clients_so_far(self.value, connected)
        return self.value

    def load(self, value: int | None) -> None:
        """N from a checkpoint (None: a checkpoint from before N was kept)."""
        self.value = clients_so_far(self.given, int(value or 0))
