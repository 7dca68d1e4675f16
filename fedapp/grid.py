"""The ServerApp's Grid: replies pulled soon after a push and at most 0.1 s apart on both
runtimes, and each exchange's replies let go once the next exchange starts.

Flower 1.41's deployment Grid (``flwr.superlink.grid.http_grid.HttpGrid``) sleeps a
hard-coded 3 s between two pulls in ``send_and_receive``, with no argument, attribute or
environment variable to change it; the simulation's ``InMemoryGrid`` sleeps its
``pull_interval`` of 0.1 s. A reply that arrives just after a pull therefore waits up to
3 s more on the deployment runtime, every round. :class:`ServerAppGrid` wraps any Grid
and runs Flower's own ``send_and_receive`` loop (push, then pull until every reply is in
or ``timeout`` has passed) on the public ``push_messages`` / ``pull_messages`` with a
short sleep; everything else goes to the wrapped Grid unchanged. The sleep grows with the
time since the push (:func:`pull_delay`): an exchange whose replies come within a fraction
of a second (a small model, clients in parallel) is not held up to a whole interval after
its last reply, and a long one is pulled every 0.1 s as before. The reply's arrays are
pulled by Flower's ``pull_objects``, whose first retry comes after 1 s; the ServerApp
shortens it to 0.05 s (:func:`flower_patches.shorten_object_pulls`, which it asks for).

Flower's ``Strategy.start`` keeps round r's training replies in a local variable
(``train_replies``) until ``send_and_receive`` returns round r + 1's, so the ServerApp held
two rounds of model-sized replies at once: 40 copies of the model at 20 clients, about
130 MB more than one round's for the 6.65 MB McMahan CNN. ``send_and_receive`` therefore
empties the list it returned last time before it pushes the next messages; by then
Flower's loop (and every strategy here) has aggregated them. A strategy that keeps the
*list* across exchanges finds it empty; one that keeps the messages keeps them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid


if TYPE_CHECKING:
    from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=no-name-in-module
    from flwr.supercore.run import Run

PULL_INTERVAL = 0.1  # seconds, InMemoryGrid's default pull_interval
FIRST_PULL_DELAY = 0.005  # seconds after the push: the shortest sleep between two pulls
PULL_DELAY_FRACTION = 0.25  # of the time since the push


def pull_delay(since_push: float, pull_interval: float = PULL_INTERVAL) -> float:
    """Seconds to sleep before the next pull, ``since_push`` seconds after the push: a
    quarter of that time, at least 5 ms and at most ``pull_interval``. A reply then waits
    at most about a quarter of its own round trip (or ``pull_interval``) to be pulled,
    against up to a whole ``pull_interval`` with a fixed sleep; the pulls this adds come
    in the first ``4 * pull_interval`` seconds of an exchange (14 more than with a fixed
    0.1 s)."""
    return min(max(PULL_DELAY_FRACTION * since_push, FIRST_PULL_DELAY), pull_interval)


class ServerAppGrid(Grid):
    """``grid`` whose ``send_and_receive`` pulls at most ``pull_interval`` seconds apart
    (sooner right after the push: :func:`pull_delay`) and lets go of the previous
    exchange's replies first."""

    def __init__(self, grid: Grid, pull_interval: float = PULL_INTERVAL) -> None:
        if not pull_interval > 0:
            raise ValueError(f"pull_interval={pull_interval} must be > 0 seconds")
        self.grid = grid
        self.pull_interval = float(pull_interval)
        self.last_replies: list[Message] = []  # what send_and_receive returned last

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then pull their replies until all are in or ``timeout``
        seconds have passed (None: until all are in), as Flower's Grids do, with
        :func:`pull_delay` between two pulls. The list the
        previous call returned is emptied first (module docstring)."""
        self.last_replies.clear()
        pending = set(self.grid.push_messages(messages))
        del messages
        pushed_at = time.time()
        end_time = pushed_at + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end_time:
            pulled = list(self.grid.pull_messages(pending))
            replies.extend(pulled)
            pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not pending:
                break
            time.sleep(pull_delay(time.time() - pushed_at, self.pull_interval))
        self.last_replies = replies
        return replies

    # everything else: the wrapped Grid
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

    def __getattr__(self, name: str) -> object:  # what a Grid subclass adds (close, ...)
        return getattr(self.grid, name)
