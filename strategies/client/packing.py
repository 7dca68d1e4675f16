"""Packed mode on the client: one ClientApp call serves many virtual clients.

Add the mod to any ClientApp (``ClientApp(mods=[virtual_clients])``): a message from a
:class:`strategies.engine.packing.PackedGrid` holds a share of virtual clients, and the mod calls
the app's own handler (``@app.train``, ``@app.evaluate``, ``@app.query``) once per virtual
client, in the order sent, each with its own message and its own ``Context``: node id
the virtual client's, ``node_config`` the SuperNode's with ``partition-id`` /
``num-partitions`` the virtual client's (and ``virtual-client`` = True), ``state`` the
virtual client's (it travels with the client: the server sends it and gets it back). The
replies go back in one message (their records joined into a few byte strings:
:class:`strategies.engine.packed_records.ReplyWriter`). Any other message goes to the handler
unchanged, so the same ClientApp serves packed and unpacked runs. Whatever the handler keeps in memory
(a model object, the data) stays warm from one virtual client to the next.

A handler that raises gives its virtual client an error reply (the others go on); one
that raises :class:`NoReply` gives it none, as a client that never answers.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Error, Message, MessageType, Metadata, RecordDict
from flwr.common.constant import ErrorCode

from .. import contract as C
from ..engine.packed_records import ReplyWriter, take

__all__ = ["NoReply", "ShareTrainer", "is_packed", "packed_clients", "virtual_clients"]


class NoReply(Exception):  # noqa: N818 - it is a control signal, not an error
    """Raised by a handler: this virtual client sends no reply (the server's timeout
    decides, as for a client that never answers)."""


ShareTrainer = Callable[[list[tuple[int, Message, Context]]], dict[int, "Message | BaseException"]]
"""``train_share(clients)``: the outcomes, by number, of the virtual clients it trained
(:func:`packed_clients`)."""


def is_packed(message: Message) -> bool:
    """Whether ``message`` holds a share of virtual clients."""
    return not message.has_error() and C.PACKED in message.content


def virtual_clients(message: Message, context: Context, call_next) -> Message:
    """The mod (module docstring): run each virtual client of a packed ``message``."""
    return serve_share(message, context, call_next, None)


def packed_clients(train_share: ShareTrainer | None = None):
    """The mod :func:`virtual_clients`, or with ``train_share`` a mod that hands the virtual
    clients of a packed train message to ``train_share`` first: it returns the outcome of
    those it trained (a reply :class:`~flwr.app.Message`, or the exception its handler
    would have raised: :class:`NoReply` for none, any other for an error reply); the others
    go to the app's handler one by one, as :func:`virtual_clients` runs them. The replies go
    back in the order sent either way (vectorised packed mode:
    :mod:`strategies.client.vectorised_sgd`)."""

    def mod(message: Message, context: Context, call_next) -> Message:
        return serve_share(message, context, call_next, train_share)

    return mod


def serve_share(message: Message, context: Context, call_next,
                train_share: ShareTrainer | None) -> Message:
    """Run each virtual client of a packed ``message`` (``train_share``: see
    :func:`packed_clients`); any other message goes to ``call_next`` unchanged."""
    if not is_packed(message):
        return call_next(message, context)
    clients = share_clients(message, context)
    done: dict[int, Message | BaseException] = {}
    if train_share is not None and message.metadata.message_type == MessageType.TRAIN:
        done = train_share(clients)
    reply = ReplyWriter()
    for number, virtual, own in clients:
        outcome = done[number] if number in done else handler_outcome(call_next, virtual, own)
        if isinstance(outcome, NoReply):
            continue
        if isinstance(outcome, BaseException):  # this client's error reply, the others go on
            reply.error(number, Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(outcome).__name__}: {outcome}"))
        elif outcome.has_error():
            reply.error(number, outcome.error)
        else:
            reply.add(number, [(C.PACKED_CONTENT, outcome.content), (C.PACKED_STATE, own.state)])
    return Message(reply.finish(), reply_to=message)


def handler_outcome(call_next, virtual: Message, own: Context) -> Message | Exception:
    """The handler's reply for one virtual client, or the exception it raised."""
    try:
        return call_next(virtual, own)
    except Exception as exc:  # noqa: BLE001 - this client's outcome; the others go on
        return exc


def share_clients(message: Message, context: Context) -> list[tuple[int, Message, Context]]:
    """The virtual clients of a packed ``message``: (number, its message, its Context)."""
    index = message.content[C.PACKED]
    nodes = list(index[C.PACKED_NODE_IDS])
    partitions = list(index[C.PACKED_PARTITION_IDS])
    message_ids = list(index[C.PACKED_MESSAGE_IDS])
    num_partitions = int(index[C.PACKED_NUM_PARTITIONS])
    if not len(nodes) == len(partitions) == len(message_ids):
        raise ValueError(f"packed message: {len(nodes)} node ids, {len(partitions)} "
                         f"partition ids and {len(message_ids)} message ids")
    parts, _, _ = take(message.content)
    clients = []
    asked = message.metadata
    for number, (node, partition, message_id) in enumerate(zip(nodes, partitions,
                                                               message_ids)):
        records = parts.get(number, {})
        virtual = Message(records.get(C.PACKED_CONTENT, RecordDict()), metadata=Metadata(
            run_id=asked.run_id, message_id=message_id, src_node_id=asked.src_node_id,
            dst_node_id=node, reply_to_message_id="", group_id=asked.group_id,
            created_at=asked.created_at, ttl=asked.ttl, message_type=asked.message_type))
        node_config = {**context.node_config, "partition-id": partition,
                       "num-partitions": num_partitions, C.VIRTUAL_CLIENT: True}
        state = RecordDict(dict(records.get(C.PACKED_STATE, RecordDict()).items()))
        clients.append((number, virtual, Context(
            run_id=context.run_id, node_id=node, node_config=node_config, state=state,
            run_config=context.run_config)))
    return clients
