"""An in-process Grid: the strategy loop calls the ClientApp directly (no Ray, no SuperLink).

Mirrors what the simulation engine does per message: one Context per node that keeps
its ``state`` across rounds, the node config ``partition-id`` / ``num-partitions``,
and an error reply when the ClientApp raises. It is :class:`simulation.reliability.FaultGrid`
(the reliability tools' Grid) with no kill and no reply hook; ``queue`` and ``call`` are
what the tests' own Grid subclasses build on. :class:`EchoGrid` is a bare Grid whose nodes
echo the arrays they got, and which counts the replies still alive at each push.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from simulation.reliability import FaultGrid
from strategies import contract as C
from tests.messages import record


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


@contextmanager
def young_heap() -> Iterator[None]:
    """Inside the block, gc.collect() scans only the objects made in it (gc.freeze leaves the
    test session's heap out): EchoGrid's collection at every push stays cheap late in a long
    test run (1.6 s for 8 collections alone, several times that after thousands of tests)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class EchoGrid:
    """Two nodes that echo the arrays they got; at each push, how many of the replies pulled
    so far are still alive (use it inside :func:`young_heap`)."""

    def __init__(self) -> None:
        self.pulled, self.alive_at_push, self.pending = [], [], {}

    def get_node_ids(self):
        return [1, 2]

    def push_messages(self, messages):
        gc.collect()
        self.alive_at_push.append(sum(ref() is not None for ref in self.pulled))
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = message_id = f"m{len(self.pending) + 1}"
            self.pending[message_id] = msg
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = []
        for message_id in message_ids:
            msg = self.pending[message_id]
            arrays = ArrayRecord([a.copy() for a in msg.content["arrays"].to_numpy_ndarrays()])
            reply = Message(RecordDict({"arrays": arrays,
                                        "metrics": MetricRecord({"num-examples": 1})}),
                            reply_to=msg)
            self.pulled.append(weakref.ref(reply))
            replies.append(reply)
        return replies


def partition_facts(msg: Message, context: Context) -> Message:
    """A query handler: partition p reports its id and n = 10 (p + 1)."""
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({C.METRICS: MetricRecord(
        {C.PARTITION_ID: pid, C.NUM_EXAMPLES: 10 * (pid + 1)})}), reply_to=msg)


def adding_app(bad_partition: int | None = None, mods: list | None = None) -> ClientApp:
    """Partition p answers the query (n = 10 (p + 1)) and returns w + p + 1; the
    ``bad_partition`` returns NaN. ``mods``: the ClientApp's mods."""
    app = ClientApp(mods=mods)
    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        w = msg.content[C.ARRAYS]["w"].numpy() + pid + 1
        if pid == bad_partition:
            w = w * np.nan
        return Message(RecordDict({C.ARRAYS: record({"w": w}), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: 10 * (pid + 1), C.TRAIN_LOSS: float(pid)})}), reply_to=msg)

    return app
