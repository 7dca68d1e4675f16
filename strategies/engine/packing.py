"""Packed mode: N virtual clients served by the W SuperNodes of a Flower Grid.

:class:`PackedGrid` is a Grid that a strategy uses as it would any: ``get_node_ids`` gives
the N virtual clients (partitions 0 .. N - 1, node ids :func:`virtual_node_id`), and the
messages pushed to them come back as one reply each. Underneath, each push sends every
SuperNode (a *worker*) one message holding its share of the pushed messages; the worker's
ClientApp (with the mod :func:`strategies.client.packing.virtual_clients`) runs its share
one after another, with the model and data kept in memory, through its usual handlers,
and replies once; the reply is split back into one reply per virtual client. A strategy,
the Grid event loop and the trust gate see exactly what they would see with N SuperNodes.

* **Balance.** The shares are balanced by each task's expected cost (examples it trains
  on: local steps x batch size, or epochs x its size from its client-info reply; for a
  client sent a sub-model of width r, times that width's compute share,
  :func:`width_task_cost`), longest first onto the least-loaded worker. Which worker runs
  a client changes nothing in what it computes: its seed comes from its partition id and
  the round.
* **Client state follows the client.** A virtual client's ``Context.state`` comes back
  with its reply and goes out with its next message, whichever worker serves it; a
  failed call keeps the state it had (as Flower keeps a node's context when its ClientApp
  raises). The server's copies of SCAFFOLD / FedDyn / MOON state
  (:mod:`strategies.engine.client_states`) work as without packing.
* **Failures.** A virtual client whose handler raises gets an error reply (its own); one
  that does not answer (``NoReply``: a late fault) gets none, and the event loop's timeout
  decides, as for a SuperNode. A worker whose whole message fails, or that the SuperLink
  refuses, gives an error reply to each of its virtual clients, naming the worker.
* **Hostile replies.** A worker's reply is trusted for its own share only: records named
  for a virtual client it was not sent, or that follow no scheme, are dropped with one
  log line naming the worker. A virtual client's returned ``Context.state`` is kept only
  when its arrays are well-formed ``.npy`` (the trust gate's reader) and it holds at most
  :data:`STATE_FACTOR` x the largest model sent + :data:`STATE_SLACK` bytes
  (:func:`state_problem`); otherwise the client keeps the state it had, one log line says
  why, and nothing of it is held or sent on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from logging import WARNING

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, Metadata, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from .. import contract as C
from . import trust_gate
from .event_loop import GridEventLoop
from .packed_records import error_of, put, read_reply, take
from .wrapped_grid import WrappedGrid

__all__ = ["PackedGrid", "VIRTUAL_NODE_BASE", "balance", "task_cost", "virtual_node_id",
           "width_task_cost"]

VIRTUAL_NODE_BASE = 1_000_000_000  # virtual client p has node id 1e9 + p: "node 1000000004" = p 4
LOST_WORKER = 5  # Flower's ErrorCode.NODE_UNAVAILABLE
STATE_FACTOR = 8  # a client's Context.state: optimiser buffers, c_i, h_i, the last model
STATE_SLACK = 1 << 20  # bytes beyond them: scalars, counters, config values


def virtual_node_id(partition_id: int) -> int:
    """The node id of virtual client ``partition_id``."""
    return VIRTUAL_NODE_BASE + int(partition_id)


def state_problem(state: RecordDict, limit: int) -> str | None:
    """Why a virtual client's returned ``Context.state`` is not kept (None: it is): a
    malformed array, or more than ``limit`` bytes in all."""
    total = 0
    for name, record in state.items():
        if isinstance(record, ArrayRecord):
            for key, array in record.items():
                try:
                    trust_gate.read_array(array, None, trust_gate.array_label(name, key))
                except trust_gate.Refused as exc:
                    return str(exc)
        total += record.count_bytes()
        if total > limit:
            return (f"its Context.state holds more than {limit} bytes ({STATE_FACTOR} x the "
                    f"largest model sent + {STATE_SLACK})")
    return None


def task_cost(message: Message, num_examples: int | None) -> float:
    """Examples a task trains on: local-steps x batch-size, else local-epochs x the client's
    size (its client-info reply), else 1 (queries, evaluations: about equal)."""
    if message.metadata.message_type != MessageType.TRAIN or C.CONFIG not in message.content:
        return 1.0
    config = message.content[C.CONFIG]
    steps, batch = config.get(C.LOCAL_STEPS, 0), config.get(C.BATCH_SIZE, 0)
    if isinstance(steps, int) and steps > 0 and isinstance(batch, int) and batch > 0:
        return float(steps * batch)
    epochs = config.get(C.LOCAL_EPOCHS, 1)
    if num_examples and isinstance(epochs, (int, float)) and epochs > 0:
        return float(epochs) * num_examples
    return 1.0


def width_task_cost(compute_share: Callable[[float], float]
                    ) -> Callable[[Message, int | None], float]:
    """:func:`task_cost` times the compute share of the width a train task is sent
    (``model-width`` in its config; HeteroFL / FjORD / FedRolex): ``compute_share(r)`` is the
    strategy's own (:meth:`strategies.engine.submodels.SubModels.compute_share`, the clock's too), so a
    client at width 1/16 weighs what its sub-model costs, not what the full model does."""

    def cost(message: Message, num_examples: int | None) -> float:
        examples = task_cost(message, num_examples)
        if message.metadata.message_type != MessageType.TRAIN or C.CONFIG not in message.content:
            return examples
        width = message.content[C.CONFIG].get(C.MODEL_WIDTH)
        if isinstance(width, bool) or not isinstance(width, (int, float)):
            return examples
        return examples * compute_share(float(width))

    return cost


def balance(costs: Sequence[float], num_workers: int) -> list[list[int]]:
    """Indices of ``costs`` split into ``num_workers`` shares: longest task first onto the
    least-loaded share (ties: the lower share); each share in the tasks' own order."""
    loads = [0.0] * num_workers
    shares: list[list[int]] = [[] for _ in range(num_workers)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        loads[worker] += costs[index]
        shares[worker].append(index)
    return [sorted(share) for share in shares]


class PackedGrid(WrappedGrid):
    """N virtual clients on the SuperNodes of ``grid`` (module docstring)."""

    # seconds between pulls at most (the Grid event loop's): a pull asks for W messages, not
    # N, so pulling every 20 ms costs little and a share's reply waits at most that long
    pull_interval = 0.02

    def __init__(self, grid: Grid, num_clients: int,
                 cost: Callable[[Message, int | None], float] | None = None) -> None:
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients={num_clients!r}: packed mode needs an int >= 1 "
                             "(the virtual clients, partitions 0 .. N - 1)")
        super().__init__(grid)
        self.num_clients = num_clients
        self.cost = cost or task_cost
        self.node_ids = [virtual_node_id(p) for p in range(num_clients)]
        self.states: dict[int, RecordDict] = {}  # virtual node -> its Context.state records
        self.examples: dict[int, int] = {}  # virtual node -> n_k from its client-info reply
        self.packs: dict[str, tuple[int, list[tuple[str, Message]]]] = {}  # id -> (worker, share)
        self.packed_id: dict[str, str] = {}  # virtual message id -> its packed message's id
        self.ready: dict[str, Message] = {}  # virtual replies pulled, not yet returned
        self.counter = itertools.count(1)
        self.shares: list[int] = []  # virtual clients per worker message of the last push
        self.largest_model = 0  # bytes of the largest ArrayRecords a message carried

    # the virtual clients --------------------------------------------------------
    def get_node_ids(self) -> Iterable[int]:
        """The virtual clients, once at least one SuperNode is connected."""
        return list(self.node_ids) if self.workers() else []

    def workers(self) -> list[int]:
        return sorted(self.grid.get_node_ids())

    def partition_of(self, node_id: int) -> int:
        partition = node_id - VIRTUAL_NODE_BASE
        if not 0 <= partition < self.num_clients:
            raise ValueError(f"node {node_id} is not a virtual client of this packed Grid "
                             f"(its nodes are {VIRTUAL_NODE_BASE} .. "
                             f"{VIRTUAL_NODE_BASE + self.num_clients - 1})")
        return partition

    # push: one message per worker and message kind ------------------------------
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push ``messages`` (to virtual clients) as one message per worker; the virtual
        messages' ids, in order."""
        messages = list(messages)
        for message in messages:
            self.partition_of(message.metadata.dst_node_id)  # a clear error for a stray node
        workers = self.workers()
        ids = [f"virtual-{next(self.counter)}" for _ in messages]
        for message, message_id in zip(messages, ids):
            message.metadata.__dict__["_message_id"] = message_id  # as Flower's Grids set it
        if not workers:
            self.fail(list(zip(ids, messages)), "no SuperNode is connected to serve it")
            return ids
        kinds: dict[tuple[str, str], list[int]] = {}
        for index, message in enumerate(messages):
            kinds.setdefault((message.metadata.message_type, message.metadata.group_id),
                             []).append(index)
        packed, shares, self.shares = [], [], []
        for indices in kinds.values():
            costs = [self.cost(messages[i], self.examples.get(messages[i].metadata.dst_node_id))
                     for i in indices]
            for worker, share in zip(workers, balance(costs, len(workers))):
                if share:
                    share = [(ids[indices[i]], messages[indices[i]]) for i in share]
                    packed.append(self.pack(worker, share))
                    shares.append((worker, share))
                    self.shares.append(len(share))
        pushed = list(self.grid.push_messages(packed))
        for number, (worker, share) in enumerate(shares):
            if number >= len(pushed):
                self.fail(share, f"the SuperLink refused the packed message to SuperNode {worker}")
                continue
            self.packs[pushed[number]] = (worker, share)
            for message_id, _ in share:
                self.packed_id[message_id] = pushed[number]
        return ids

    def pack(self, worker: int, share: list[tuple[str, Message]]) -> Message:
        """One message to ``worker`` holding ``share`` (module docstring of
        :mod:`strategies.engine.packed_records`)."""
        content = RecordDict()
        nodes = [message.metadata.dst_node_id for _, message in share]
        content[C.PACKED] = ConfigRecord({
            C.PACKED_NODE_IDS: nodes,
            C.PACKED_PARTITION_IDS: [self.partition_of(n) for n in nodes],
            C.PACKED_MESSAGE_IDS: [message_id for message_id, _ in share],
            C.PACKED_NUM_PARTITIONS: self.num_clients,
        })
        for index, (_, message) in enumerate(share):
            self.largest_model = max(self.largest_model, sum(
                r.count_bytes() for r in message.content.array_records.values()))
            put(content, index, C.PACKED_CONTENT, message.content)
            put(content, index, C.PACKED_STATE, self.states.get(nodes[index], {}))
        first = share[0][1].metadata
        ttl = max(message.metadata.ttl for _, message in share)
        return self.grid.create_message(content, first.message_type, worker, first.group_id,
                                        ttl)

    # pull: split each worker's reply ----------------------------------------------
    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies of the virtual messages ``message_ids`` that are in."""
        message_ids = list(message_ids)
        packs = {self.packed_id[i] for i in message_ids
                 if i not in self.ready and i in self.packed_id}
        if packs:
            for reply in self.grid.pull_messages(sorted(packs)):
                self.unpack(reply)
        return [self.ready.pop(i) for i in message_ids if i in self.ready]

    def unpack(self, reply: Message) -> None:
        """Split a worker's ``reply`` into its virtual clients' replies."""
        entry = self.packs.pop(reply.metadata.reply_to_message_id, None)
        if entry is None:
            return
        worker, share = entry
        for message_id, _ in share:
            self.packed_id.pop(message_id, None)
        if reply.has_error():
            self.fail(share, f"SuperNode {worker}, which served it packed, replied with an "
                      f"error: {reply.error.reason}", reply.error.code)
            return
        try:
            content = read_reply(reply.content)
        except ValueError as exc:
            self.fail(share, f"SuperNode {worker}, which served it packed, sent a malformed "
                      f"reply: {exc}")
            return
        parts, errors, unknown = take(content)
        stray = sorted((set(parts) | set(errors)) - set(range(len(share))))
        if unknown or stray:
            log(WARNING, "Packed reply of SuperNode %s: dropped records %s (they name no "
                "virtual client it was sent)", worker,
                unknown + [f"virtual client #{i}" for i in stray])
        for index, (message_id, message) in enumerate(share):
            node = message.metadata.dst_node_id
            if index in errors:
                self.ready[message_id] = self.reply(message, reply, error=error_of(errors[index]))
            elif C.PACKED_CONTENT in parts.get(index, {}):
                content = parts[index][C.PACKED_CONTENT]
                self.keep_state(worker, node, parts[index].get(C.PACKED_STATE, RecordDict()))
                if message.metadata.message_type == MessageType.QUERY:
                    self.note_examples(node, content)
                self.ready[message_id] = self.reply(message, reply, content=content)
            # neither: the virtual client did not answer; the event loop's timeout decides

    def keep_state(self, worker: int, node: int, state: RecordDict) -> None:
        """``state`` as virtual client ``node``'s Context.state, unless :func:`state_problem`."""
        problem = state_problem(state, STATE_FACTOR * self.largest_model + STATE_SLACK)
        if problem is None:
            self.states[node] = state
            return
        log(WARNING, "Packed reply of SuperNode %s: virtual client %s (partition %d): %s; it "
            "keeps the Context.state it had", worker, node, self.partition_of(node), problem)

    def note_examples(self, node: int, content: RecordDict) -> None:
        metrics = content.get(C.METRICS)
        examples = None if metrics is None else metrics.get(C.NUM_EXAMPLES)
        if isinstance(examples, int) and examples >= 0:
            self.examples[node] = examples

    @staticmethod
    def reply(message: Message, packed_reply: Message, *, content: RecordDict | None = None,
              error: Error | None = None) -> Message:
        """The reply of virtual ``message``, as its own node would have sent it."""
        asked = message.metadata
        metadata = Metadata(
            run_id=asked.run_id, message_id=f"{asked.message_id}-reply",
            src_node_id=asked.dst_node_id, dst_node_id=asked.src_node_id,
            reply_to_message_id=asked.message_id, group_id=asked.group_id,
            created_at=packed_reply.metadata.created_at, ttl=packed_reply.metadata.ttl,
            message_type=asked.message_type)
        if error is not None:
            return Message(error=error, metadata=metadata)
        return Message(content=content, metadata=metadata)

    def fail(self, share: list[tuple[str, Message]], why: str,
             code: int = LOST_WORKER) -> None:
        """An error reply for each message of ``share``."""
        for message_id, message in share:
            error = Error(code=code, reason=f"virtual client {message.metadata.dst_node_id}: "
                          f"{why}")
            self.ready[message_id] = self.reply(message, message, error=error)

    # what a packed Grid has not --------------------------------------------------
    def get_nodes(self):
        raise NotImplementedError("a packed Grid's virtual clients have no NodeInfo; "
                                  "use get_node_ids()")

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return GridEventLoop(self).exchange(messages, timeout)  # the one exchange loop
