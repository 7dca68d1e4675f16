"""A Grid that hands every call to the Grid it wraps: the base of the Grids that change
one thing (the ServerApp's pull schedule, packed mode) and keep the rest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

if TYPE_CHECKING:
    from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=no-name-in-module
    from flwr.supercore.run import Run


class WrappedGrid(Grid):
    """Every method: ``self.grid``'s; a subclass overrides what it changes."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)

    def __getattr__(self, name: str) -> object:  # what a Grid subclass adds (close, ...)
        if name == "grid":  # not set yet (during unpickling, say): no recursion
            raise AttributeError(name)
        return getattr(self.grid, name)
