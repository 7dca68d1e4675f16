"""Flower <-> numpy glue of the strategies (the role of Flower's ``strategy_utils``).

* ``ArrayRecord`` <-> ``dict[str, np.ndarray]``;
* the client table: what the optional client-info query tells about each node;
* reply checks shared by every strategy, and the error a strategy raises when the
  clients do not implement its contract.
"""

from __future__ import annotations

import functools
import io
import time
from collections.abc import Iterable, Mapping
from typing import TypeVar
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import (Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord,
                      RecordDict)
from flwr.common.constant import ErrorCode, SType
from flwr.common.logger import log
from flwr.serverapp import Grid

from .. import contract as C
from . import trust_gate
from .node_identity import PartitionMap

NDArrays = dict[str, np.ndarray]

QUERY_HELPER = "strategies.client.client_info_reply"
"""The client helper that answers the client-info query (registered in ``@app.query()``)."""


class ClientContractError(RuntimeError):
    """The clients do not implement what the strategy needs from their replies."""


# ------------------------------------------------------------------ arrays
def array_view(array: Array, key: str = "?") -> np.ndarray:
    """The numpy array of a Flower ``Array``, read-only and without a copy.

    ``Array.numpy()`` runs ``np.load``, which copies the bytes into a new array; here the
    trust gate reads the ``.npy`` header with numpy's own reader and the array is a view
    of the ``Array``'s bytes (it lives as long as they do). Anything but exactly one plain
    numeric ``.npy`` payload whose bytes agree with the declared shape and dtype (another
    ``stype``, an object dtype, truncated or trailing bytes) raises
    :class:`strategies.engine.trust_gate.Refused` (:func:`strategies.engine.trust_gate.read_array`).
    """
    return trust_gate.read_array(array, None, trust_gate.array_label("", key))


def to_numpy(record: ArrayRecord) -> NDArrays:
    """ArrayRecord -> {key: numpy array}: read-only views of the record's bytes
    (:func:`array_view`; copy an array before changing it)."""
    return {key: array_view(array, key) for key, array in record.items()}


@functools.lru_cache(maxsize=1024)
def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    """The ``.npy`` 1.0 header ``np.save`` writes for a C-ordered array of ``dtype`` and
    ``shape`` (None where version 1.0 cannot hold it). Cached: a model's arrays repeat."""
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, {
            "descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
            "shape": shape})
    except ValueError:  # a header too large for version 1.0: np.save picks another
        return None
    return header.getvalue()


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, as ``Array`` declares it (cached)."""
    return str(dtype)


def array_of(value: np.ndarray) -> Array:
    """numpy array -> Flower ``Array`` holding the same ``.npy`` bytes as ``Array(value)``
    (``np.save``'s version 1.0 header), written with one copy of the data instead of
    ``np.save``'s growing buffer and final copy."""
    value = np.asarray(value)
    if not value.flags.c_contiguous:
        value = np.array(value, order="C")
    if value.dtype.hasobject:
        return Array(value)  # Flower refuses it (no pickles)
    shape = tuple(int(d) for d in value.shape)
    header = npy_header(value.dtype, shape)
    if header is None:
        return Array(value)
    data = b"".join((header, value.reshape(-1).view(np.uint8)))
    return Array(dtype_name(value.dtype), shape, SType.NUMPY, data)


R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)


def record_of(content: RecordDict, key: str, kind: type[R]) -> R | None:
    """``content[key]`` when it is a ``kind`` record, else None: one lookup, where Flower's
    ``content.config_records`` / ``array_records`` / ``metric_records`` build a new mapping of
    every record of the kind on each access (a ClientApp asks every registered client side
    whether a message is its own; the server checks every reply)."""
    record = content.get(key)
    return record if isinstance(record, kind) else None


def sent_config(content: RecordDict) -> ConfigRecord | None:
    """The message's ConfigRecord ``"config"``, or None (:func:`record_of`)."""
    return record_of(content, C.CONFIG, ConfigRecord)


def sent_arrays(content: RecordDict, key: str) -> ArrayRecord | None:
    """The message's ArrayRecord ``key``, or None (:func:`record_of`)."""
    return record_of(content, key, ArrayRecord)


def array_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ArrayRecord holding the ``arrays`` themselves, in their order: ``ArrayRecord(dict)``
    builds a copy of each ``Array`` (the bytes shared), which costs as much again as making
    them (cnn-small has 10 arrays: a packed round of 1000 clients unpacks 10,000)."""
    record = ArrayRecord()
    for key, array in arrays.items():
        record[key] = array
    return record


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """{key: numpy array} -> ArrayRecord (:func:`array_of`)."""
    return array_record({key: array_of(value) for key, value in arrays.items()})


def array_bytes(content: RecordDict) -> int:
    """Bytes of every ArrayRecord in ``content`` (Flower's ``count_bytes``), read in place:
    ``RecordDict.array_records`` would build a new mapping on each call."""
    return sum(record.count_bytes() for record in content.values()
               if isinstance(record, ArrayRecord))


# ------------------------------------------------------------------ client table
@dataclass
class ClientInfo:
    """What the server knows of one node (from the client-info query)."""

    partition_id: int | None = None
    num_examples: int | None = None
    label_counts: list[int] | None = None
    comm_budget: float | None = None
    unreached: bool = False  # the query never reached the node: ask again next round
    refused: bool = False  # the trust gate refused its answer: treated as no answer
    unbound: bool = False  # its key does not allow the partition it claims: never selected


# error codes of a query that never reached the ClientApp (Flower's SuperLink answers a
# message to a node that missed its heartbeats with NODE_UNAVAILABLE); any other error is
# the ClientApp's own answer (no query handler, its data missing) and is not asked again
UNREACHED = (ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
             ErrorCode.REPLY_MESSAGE_UNAVAILABLE)


def wait_for_nodes(grid: Grid, min_nodes: int) -> list[int]:
    """Connected node ids, sorted, once at least ``min_nodes`` are connected."""
    last_log = 0.0
    while len(nodes := sorted(grid.get_node_ids())) < min_nodes:
        if time.monotonic() - last_log > 10:
            log(INFO, "Waiting for nodes: %d connected, need %d", len(nodes), min_nodes)
            last_log = time.monotonic()
        time.sleep(1)
    return nodes


def client_info(node: int, reply: Message) -> ClientInfo:
    """The facts of one answered client-info query, checked by the trust gate
    (:func:`strategies.engine.trust_gate.client_facts`): a refused field drops the whole answer
    (one WARNING naming node, field, value and fix) and the node counts as one that did
    not answer (``refused``)."""
    if C.METRICS not in reply.content.metric_records:
        return ClientInfo()
    facts = trust_gate.client_facts(reply.content[C.METRICS])
    if isinstance(facts, trust_gate.FactRefusal):
        log(WARNING, "%s", facts.line(node))
        return ClientInfo(refused=True)
    return ClientInfo(partition_id=facts.partition_id, num_examples=facts.num_examples,
                      label_counts=facts.label_counts, comm_budget=facts.comm_budget)


def query_client_info(grid: Grid, node_ids: list[int], timeout: float) -> dict[int, ClientInfo]:
    """Ask each node for its ``partition-id``, ``num-examples``, ``label-counts`` and
    ``comm-budget`` (a ``query`` message; see :data:`QUERY_HELPER`). A node that does
    not answer gets an empty :class:`ClientInfo`, marked ``unreached`` when the query
    never got to its ClientApp (no reply, or an :data:`UNREACHED` error); an answer the
    trust gate refuses (:func:`client_info`) an empty one marked ``refused``."""
    content = RecordDict({C.CONFIG: ConfigRecord({C.QUERY: C.QUERY_CLIENT_INFO})})
    messages = [Message(content=content, message_type=MessageType.QUERY, dst_node_id=n)
                for n in node_ids]
    table = {n: ClientInfo(unreached=True) for n in node_ids}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if node not in table:  # a reply from a node that was not asked
            log(WARNING, "Client-info reply from node %s ignored: it was not asked", node)
            continue
        if reply.has_error():  # e.g. the node's data is missing: its reason says why
            log(WARNING, "Node %s could not answer the '%s' query: %s",
                node, C.QUERY_CLIENT_INFO, reply.error.reason)
            table[node] = ClientInfo(unreached=reply.error.code in UNREACHED)
            continue
        table[node] = client_info(node, reply)
    return table


def update_clients(grid: Grid, clients: dict[int, ClientInfo], *, min_nodes: int, query: bool,
                   timeout: float, owner: str, warned: bool,
                   partition_map: PartitionMap | None = None) -> tuple[list[int], bool]:
    """Wait for ``min_nodes`` connected nodes and enter new ones in ``clients`` (in place):
    with ``query``, what :func:`query_client_info` returns, else empty facts. A node the
    query did not reach (e.g. a SuperNode still reconnecting after a SuperLink restart) is
    asked again at the next call, so its partition id still orders it once it is back.
    With a ``partition_map``, each answer's partition id is checked against what the node's
    registered key may serve, read from ``grid.get_nodes()`` at each query (nodes join
    mid-run; :func:`enter_clients`).

    Logs one WARNING per run (``warned`` says whether it was logged before) when facts are
    missing. Returns the connected node ids, sorted, and the new ``warned``.
    """
    nodes = wait_for_nodes(grid, min_nodes)
    unknown = [n for n in nodes if n not in clients or (query and clients[n].unreached)]
    if not unknown:
        return nodes, warned
    if not query:
        clients.update({n: ClientInfo() for n in unknown})
        if not warned:
            warn_no_query(owner)
        return nodes, True
    answers = query_client_info(grid, unknown, timeout)
    keys = partition_map.node_partitions(grid.get_nodes()) if partition_map else None
    enter_clients(clients, answers, nodes, partition_map, keys)
    unreached = [n for n in unknown if clients[n].unreached]
    if unreached:
        log(INFO, "%s: the '%s' query did not reach node(s) %s; asking again next round",
            owner, C.QUERY_CLIENT_INFO, ", ".join(map(str, unreached)))
    silent = [n for n in unknown if clients[n].partition_id is None and not clients[n].unreached]
    if silent and not warned:
        log(WARNING, "%s: %d node(s) did not answer the '%s' query with '%s': they are sampled "
            "in node-id order, which is not reproducible across runs (register %s in their "
            "@app.query())", owner, len(silent), C.QUERY_CLIENT_INFO, C.PARTITION_ID,
            QUERY_HELPER)
        return nodes, True
    return nodes, warned


def enter_clients(clients: dict[int, ClientInfo], answers: Mapping[int, ClientInfo],
                  connected: Iterable[int], partition_map: PartitionMap | None = None,
                  keys: Mapping[int, int | str] | None = None) -> None:
    """Enter ``answers`` in ``clients`` (in place) in node-id order; an answer whose partition
    id another connected node already holds, or whose label counts have another length than
    the other connected nodes', is refused (:func:`strategies.engine.trust_gate.facts_conflict`: one
    WARNING; the node counts as one that did not answer).

    With a ``partition_map`` (``keys``: its :meth:`~strategies.engine.node_identity.PartitionMap.
    node_partitions` of the connected nodes), first the claim: an answered query whose
    partition id is not the one the node's registered key may serve (or whose key is in no
    map) is refused with one WARNING naming the node, the claim and what its key allows; the
    node is marked ``unbound`` and never selected."""
    connected = list(connected)
    for node in sorted(answers):
        info = answers[node]
        if partition_map is not None and not info.unreached and not info.refused:
            problem = partition_map.claim_problem(node, info.partition_id, keys or {})
            if problem is not None:
                log(WARNING, "%s", trust_gate.FactRefusal(
                    C.PARTITION_ID, info.partition_id, problem,
                    partition_map.fix(node, keys or {})).line(node))
                clients[node] = ClientInfo(refused=True, unbound=True)
                continue
        others = [clients[n] for n in connected if n != node and n in clients]
        facts = trust_gate.ClientFacts(info.partition_id, info.num_examples, info.label_counts,
                                       info.comm_budget)
        conflict = trust_gate.facts_conflict(facts, others)
        if conflict is not None:
            log(WARNING, "%s", conflict.line(node))
            info = ClientInfo(refused=True)
        clients[node] = info


def bound_nodes(nodes: Iterable[int], clients: Mapping[int, ClientInfo]) -> list[int]:
    """``nodes`` without those whose key does not allow the partition they claimed
    (:func:`enter_clients` with a partition map): they are never selected."""
    return [n for n in nodes if not clients.get(n, ClientInfo()).unbound]


def usable_nodes(nodes: Iterable[int], clients: Mapping[int, ClientInfo]) -> list[int]:
    """``nodes`` without those whose client-info answer the trust gate refused or that the
    query did not reach (asked again next round), for what needs every node's facts: the
    simulated clock, DynamicFL's grouping."""
    def usable(info: ClientInfo) -> bool:
        return not (info.refused or info.unreached)
    return [n for n in nodes if usable(clients.get(n, ClientInfo()))]


def partition_order(nodes: Iterable[int], clients: Mapping[int, ClientInfo]) -> list[int]:
    """Nodes sorted by reported partition id; nodes without one after, by node id."""
    def key(node: int) -> tuple[int, int]:
        info = clients.get(node)
        pid = info.partition_id if info is not None else None
        return (0, pid) if pid is not None else (1, node)
    return sorted(nodes, key=key)


def client_key(clients: Mapping[int, ClientInfo], node_id: int) -> str:
    """A client's key in cross-round tables: its partition id, else ``node-<id>`` (node ids
    change when a SuperNode restarts or a run is resumed; partition ids do not)."""
    info = clients.get(node_id)
    pid = info.partition_id if info is not None else None
    return str(pid) if pid is not None else f"node-{node_id}"


def replies_in_order(replies: Iterable[Message], clients: Mapping[int, ClientInfo]
                     ) -> list[Message]:
    """Replies in :func:`partition_order` of their senders, not in arrival order.

    The floating-point sums of an aggregation depend on the order, so a fixed order is
    what makes two runs with the same seed, and a resumed run, bit-identical.
    """
    by_node: dict[int, list[Message]] = {}
    for reply in replies:
        by_node.setdefault(reply.metadata.src_node_id, []).append(reply)
    return [r for node in partition_order(by_node, clients) for r in by_node[node]]


def clock_partition_id(strategy: str, clients: Mapping[int, ClientInfo], node_id: int) -> int:
    """The node's partition id, which the simulated clock keys device profiles by; an error
    that names the query helper when the node reported none."""
    pid = clients.get(node_id, ClientInfo()).partition_id
    if pid is None:
        raise ValueError(f"{strategy}: node {node_id} reported no '{C.PARTITION_ID}', which the "
                         f"simulated clock keys device profiles by: either its ClientApp failed "
                         f"to answer the client-info query (the WARNING 'could not answer' above "
                         f"gives its error) or it does not register {QUERY_HELPER} in the "
                         f"ClientApp's @app.query()")
    return pid


def warn_no_query(strategy: str) -> None:
    """The one WARNING of a strategy that does not query its clients."""
    log(WARNING, "%s: client-info query off (query_client_info=False): clients are sampled in "
        "node-id order, which is not reproducible across runs, and the sizes n_k of clients "
        "not sampled are unknown. For partition-keyed sampling register %s in the "
        "ClientApp's @app.query() and pass query_client_info=True", strategy, QUERY_HELPER)


def query_required(strategy: str, what: str, alternative: str) -> ValueError:
    """The error of a configuration that needs the client-info query while it is off."""
    return ValueError(f"{strategy}: {what} needs the client-info query: register {QUERY_HELPER} "
                      f"in the ClientApp's @app.query() and pass query_client_info=True"
                      f"{', or ' + alternative if alternative else ''}")


# ------------------------------------------------------------------ replies
def contract_error(strategy: str, server_round: int, num_replies: int, missing: str,
                   helper: str) -> ClientContractError:
    """The error of a round in which every reply lacks what the strategy's contract needs."""
    return ClientContractError(
        f"{strategy}: all {num_replies} train replies of round {server_round} lack {missing}, so "
        f"the ClientApp does not implement {strategy}'s contract. Call {helper} in the "
        f"ClientApp's @app.train() (or use a strategy that a stock ClientApp serves: "
        f"FedAvg, FedProx, FedExP, FedBuff, FedAsync; FedNova given local_epochs and "
        f"batch_size)")


class ContractEvidence:
    """Whether replies that lack the contract show a ClientApp without it, or one bad
    client: the run stops (:func:`contract_error`) only when no reply ever met the
    contract and the rounds in which every reply lacked it came from at least
    :data:`MIN_CLIENTS` distinct clients or number :data:`MIN_ROUNDS`. Until then each such
    reply is refused alone (one log line) and the round goes on without it."""

    MIN_CLIENTS = 2
    MIN_ROUNDS = 3

    def __init__(self) -> None:
        self.met = False  # some reply met the contract: the ClientApp implements it
        self.lacking: set[str] = set()
        self.rounds = 0

    def conclusive(self, lacking: Iterable[str], met: bool) -> bool:
        """Record one round's answered replies (the clients whose replies lacked the
        contract, whether any met it); True when the evidence says the ClientApp lacks it."""
        self.met = self.met or met
        lacking = set(lacking)
        if self.met or not lacking:
            return False
        self.lacking |= lacking
        self.rounds += 1
        return len(self.lacking) >= self.MIN_CLIENTS or self.rounds >= self.MIN_ROUNDS


def mean_metrics(replies: list[Message]) -> dict[str, float]:
    """num-examples-weighted mean of every scalar metric that all replies share."""
    return mean_of_metrics([r.content[C.METRICS] for r in replies])


def mean_of_metrics(records: list[MetricRecord]) -> dict[str, float]:
    """:func:`mean_metrics` of the replies' MetricRecords ``records``."""
    weights = [float(m[C.NUM_EXAMPLES]) for m in records]
    w = np.asarray(weights, dtype=np.float64)
    shared = set(records[0].keys()).intersection(*[set(m.keys()) for m in records[1:]])
    out: dict[str, float] = {}
    bookkeeping = {C.NUM_EXAMPLES, C.PARTITION_ID, C.STATE_ROUND_USED, C.STATE_DIGEST}
    for key in sorted(shared - bookkeeping):
        values = [m[key] for m in records]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float(np.dot(w, np.asarray(values, dtype=np.float64)) / w.sum())
    out[C.NUM_EXAMPLES] = float(sum(weights))
    return out
