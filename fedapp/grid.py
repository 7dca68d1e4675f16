"""The ServerApp's Grid: replies pulled soon after a push and at most 0.1 s apart on both
runtimes, and each exchange's replies let go once the next exchange starts.

Flower 1.41's deployment Grid (``flwr.superlink.grid.http_grid.HttpGrid``) sleeps a
hard-coded 3 s between two pulls in ``send_and_receive``, with no argument, attribute or
environment variable to change it; the simulation's ``InMemoryGrid`` sleeps its
``pull_interval`` of 0.1 s. Every strategy here exchanges through the Grid event loop
(:class:`strategies.engine.event_loop.GridEventLoop`: pulls 5 ms .. 0.1 s apart) on the public
``push_messages`` / ``pull_messages``; :class:`ServerAppGrid` gives a strategy that calls
``send_and_receive`` itself (Flower's own ``Strategy.start``) the same loop. The reply's
arrays are pulled by Flower's ``pull_objects``, whose first retry comes after 1 s; it is
shortened to 0.05 s by the ServerApp (:func:`flower_patches.shorten_object_pulls`,
which it asks for).

Flower's ``Strategy.start`` keeps round r's training replies in a local variable
(``train_replies``) until ``send_and_receive`` returns round r + 1's, so the ServerApp held
two rounds of model-sized replies at once: 40 copies of the model at 20 clients, about
130 MB more than one round's for the 6.65 MB McMahan CNN. ``send_and_receive`` therefore
empties the list it returned last time before it pushes the next messages; by then
Flower's loop (and every strategy here) has aggregated them. A strategy that keeps the
*list* across exchanges finds it empty; one that keeps the messages keeps them.

Its ``silence_timeout`` (the run config's ``silence-timeout``) is what every Grid event loop
on it reads: a task silent that long (and 10x the slowest reply) is given up before the
round timeout.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from strategies.engine.event_loop import PULL_INTERVAL, SILENCE_TIMEOUT, GridEventLoop
from strategies.engine.wrapped_grid import WrappedGrid


class ServerAppGrid(WrappedGrid):
    """``grid`` whose ``send_and_receive`` is the Grid event loop's exchange (pulls at most
    ``pull_interval`` seconds apart, sooner right after the push) and lets go of the previous
    exchange's replies first."""

    def __init__(self, grid: Grid, pull_interval: float | None = None,
                 silence_timeout: float = SILENCE_TIMEOUT) -> None:
        if pull_interval is None:  # the wrapped Grid's own, where it has one (a packed Grid's)
            pull_interval = getattr(grid, "pull_interval", PULL_INTERVAL)
        if not pull_interval > 0:
            raise ValueError(f"pull_interval={pull_interval} must be > 0 seconds")
        super().__init__(grid)
        self.pull_interval = float(pull_interval)
        self.silence_timeout = float(silence_timeout)
        self.last_replies: list[Message] = []  # what send_and_receive returned last

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then pull their replies until all are in or ``timeout``
        seconds have passed (None: until all are in), as Flower's Grids do
        (:meth:`strategies.engine.event_loop.GridEventLoop.exchange`). The list the previous call
        returned is emptied first (module docstring)."""
        self.last_replies.clear()
        self.last_replies = GridEventLoop(self.grid, self.pull_interval).exchange(messages,
                                                                                   timeout)
        return self.last_replies
