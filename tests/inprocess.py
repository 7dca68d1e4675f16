"""An in-process Grid: the strategy loop calls the ClientApp directly (no Ray, no SuperLink).

Mirrors what the simulation engine does per message: one Context per node that keeps
its ``state`` across rounds, the node config ``partition-id`` / ``num-partitions``,
and an error reply when the ClientApp raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    """Grid whose nodes are ClientApp calls in this process."""

    def __init__(self, client_app, num_nodes: int, run_config: dict, node_ids: list[int] | None = None) -> None:
        self.client_app = client_app
        self.node_ids = node_ids or [1000 + 7919 * i for i in range(num_nodes)]
        self.contexts = {
            node: Context(
                run_id=1, node_id=node,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(), run_config=dict(run_config),
            )
            for i, node in enumerate(self.node_ids)
        }
        self.calls: list[tuple[int, str]] = []
        self.queue: dict[str, Message] = {}
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1

    def set_run(self, run) -> None:  # pragma: no cover - not used in-process
        pass

    @property
    def run(self):  # pragma: no cover
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Queue the messages; they run when pulled (in push order)."""
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            self.queue[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Run every queued message asked for and return the replies."""
        return [self.call(self.queue.pop(i)) for i in list(message_ids) if i in self.queue]

    def call(self, msg: Message) -> Message:
        """One ClientApp call; an exception becomes an error reply, as in the simulation engine."""
        node = msg.metadata.dst_node_id
        self.calls.append((node, msg.metadata.message_type))
        try:
            return self.client_app(msg, self.contexts[node])
        except Exception as exc:  # noqa: BLE001 - a failing ClientApp becomes an error reply
            return Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return [self.call(msg) for msg in messages]
