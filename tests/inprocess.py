"""An in-process Grid: the strategy loop calls the ClientApp directly (no Ray, no SuperLink).

Mirrors what the simulation engine does per message: one Context per node that keeps
its ``state`` across rounds, the node config ``partition-id`` / ``num-partitions``,
and an error reply when the ClientApp raises. It is :class:`simulation.reliability.FaultGrid`
(the reliability tools' Grid) with no kill and no reply hook; ``queue`` and ``call`` are
what the tests' own Grid subclasses build on.
"""

from __future__ import annotations

from flwr.app import Message

from simulation.reliability import FaultGrid


class InProcessGrid(FaultGrid):
    """Grid whose nodes are ClientApp calls in this process."""

    def __init__(
        self, client_app, num_nodes: int, run_config: dict, node_ids: list[int] | None = None
    ) -> None:
        super().__init__(client_app, num_nodes, run_config, node_ids=node_ids)

    @property
    def queue(self) -> dict[str, Message]:
        """Pushed messages not pulled yet, by message id (push order)."""
        return self.pending

    def call(self, msg: Message) -> Message:
        """One ClientApp call; an exception becomes an error reply, as in the simulation engine."""
        return self.deliver(msg, timeout=None)
