"""The Grid event loop: the one place that pushes messages and pulls their replies.

Every exchange of a strategy goes through :class:`GridEventLoop`: a synchronous round
(:meth:`GridEventLoop.exchange`, what Flower's ``Grid.send_and_receive`` does), DynamicFL's
sync events and, later, asynchronous strategies (:meth:`GridEventLoop.push` then
:meth:`GridEventLoop.run_until` with a callback per reply). It handles

* the pull schedule: the sleep between two pulls is a quarter of the time since the last
  push, 5 ms .. ``pull_interval`` (:func:`pull_delay`), so fast replies are not held a
  whole interval, and a long exchange is pulled every ``pull_interval`` (the Grid's own
  ``pull_interval`` where it has one: a packed Grid pulls every 20 ms at most);
* timeouts: a message without a reply ``timeout`` seconds after the wait started is lost;
  its tag is returned, nothing else is held up. "Without a reply" means a pull that began
  after the deadline did not bring it: time the server spends between two pulls (its own
  aggregation, an evaluation) never makes a reply that is already in count as lost;
* replies the link refuses to take (``push_messages`` returned fewer ids) count as lost;
* silence: a message still without a reply :meth:`GridEventLoop.silence_limit` seconds
  after its push (``SILENCE_FACTOR`` x the slowest reply this loop has seen, at least the
  grid's ``silence_timeout`` attribute, else :data:`SILENCE_TIMEOUT` = 300 s; 0: off; only
  once some reply has come) is given up as lost before the timeout: a silent client costs
  a bounded wait, not the round timeout (3600 s by default), while a slow one that answers
  within 10x the others' time, or within the floor, is waited for. The floor is minutes,
  not a multiple of the replies alone: an honest SuperNode reconnecting after a SuperLink
  restart (Flower's retry backoff) was seen to take 136 s where the others took seconds;
* the order of delivery: as the replies arrive (:meth:`GridEventLoop.run_until`, real time),
  or by simulated completion time (:meth:`GridEventLoop.run_in_clock_order`): a reply is
  held until every message that completes earlier on the simulated clock has replied or
  been given up, so the callbacks see the same order whatever order the real replies
  come in, and a run is deterministic (and resumable bit for bit).

Each pushed message carries a *tag* (a node id, a DynamicFL chunk, ...) that the callback
gets back with the reply, so callers never handle message ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from flwr.app import Message
from flwr.serverapp import Grid

__all__ = ["FIRST_PULL_DELAY", "GridEventLoop", "PULL_DELAY_FRACTION", "PULL_INTERVAL",
           "SILENCE_FACTOR", "SILENCE_TIMEOUT", "pull_delay"]

PULL_INTERVAL = 0.1  # seconds, Flower's InMemoryGrid's default pull_interval
FIRST_PULL_DELAY = 0.005  # seconds after the push: the shortest sleep between two pulls
PULL_DELAY_FRACTION = 0.25  # of the time since the push
SILENCE_TIMEOUT = 300.0  # seconds: the shortest wait before a silent message is given up
SILENCE_FACTOR = 10.0  # x the slowest reply so far

Tag = TypeVar("Tag", bound=Hashable)
LOST = object()  # held in place of the reply of a message given up (run_in_clock_order)


def pull_delay(since_push: float, pull_interval: float = PULL_INTERVAL) -> float:
    """Seconds to sleep before the next pull, ``since_push`` seconds after the push: a
    quarter of that time, at least 5 ms and at most ``pull_interval``. A reply then waits
    at most about a quarter of its own round trip (or ``pull_interval``) to be pulled,
    against up to a whole ``pull_interval`` with a fixed sleep; the pulls this adds come
    in the first ``4 * pull_interval`` seconds of an exchange (14 more than with a fixed
    0.1 s)."""
    return min(max(PULL_DELAY_FRACTION * since_push, FIRST_PULL_DELAY), pull_interval)


class GridEventLoop(Generic[Tag]):
    """Push / pull / timeouts over ``grid`` (module docstring)."""

    def __init__(self, grid: Grid, pull_interval: float | None = None, *,
                 sleep: Callable[[float], None] | None = None,
                 now: Callable[[], float] | None = None,
                 silence_timeout: float | None = None) -> None:
        if pull_interval is None:  # the Grid's own, where it has one (a packed Grid's)
            pull_interval = getattr(grid, "pull_interval", PULL_INTERVAL)
        if not pull_interval >= 0:
            raise ValueError(f"pull_interval={pull_interval} must be >= 0 seconds")
        self.grid = grid
        self.pull_interval = float(pull_interval)
        self.sleep = sleep if sleep is not None else time.sleep
        self.now = now if now is not None else time.monotonic
        self.pending: dict[str, Tag] = {}  # message id -> tag, in push order
        self.pushed = 0  # messages pushed so far: a tag's push number breaks clock ties
        self.push_number: dict[Tag, int] = {}
        self.push_time: dict[Tag, float] = {}
        self.pushed_at = self.now()
        self.polled_at = self.now()  # when the last pull began: deadlines are checked against it
        self.held: dict[Tag, Message] = {}  # replies pulled but not yet delivered, by tag
        if silence_timeout is None:  # the grid's own (fedapp's `silence-timeout`), or 300 s
            silence_timeout = getattr(grid, "silence_timeout", SILENCE_TIMEOUT)
        if not (isinstance(silence_timeout, (int, float)) and not isinstance(silence_timeout, bool)
                and silence_timeout >= 0):
            raise ValueError(f"silence_timeout={silence_timeout!r} must be a number of seconds "
                             f">= 0 (0: wait the whole round timeout for a silent client)")
        self.silence_timeout = float(silence_timeout)
        self.slowest_reply = 0.0  # seconds from push to pull of the slowest reply so far

    def push(self, messages: Sequence[Message], tags: Sequence[Tag]) -> list[Tag]:
        """Push ``messages`` (tagged ``tags``, one each); the tags of those the link did not
        take (lost at once)."""
        if len(messages) != len(tags):
            raise ValueError(f"{len(messages)} messages but {len(tags)} tags")
        if not messages:
            return []
        ids = list(self.grid.push_messages(messages))
        self.pushed_at = self.now()
        for message_id, tag in zip(ids, tags):
            self.pending[message_id] = tag
            self.push_number[tag] = self.pushed
            self.push_time[tag] = self.pushed_at
            self.pushed += 1
        return list(tags[len(ids):])

    def pending_tags(self) -> list[Tag]:
        """Tags of the messages without a reply yet, in push order."""
        return list(self.pending.values())

    def poll(self) -> list[tuple[Tag, Message]]:
        """One pull: the replies that are in, with their messages' tags."""
        self.polled_at = self.now()
        if not self.pending:
            return []
        arrived = []
        for reply in self.grid.pull_messages(list(self.pending)):
            tag = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if tag is not None:
                arrived.append((tag, reply))
                self.slowest_reply = max(self.slowest_reply,
                                         self.polled_at - self.push_time.get(tag, self.polled_at))
        return arrived

    def silence_limit(self) -> float | None:
        """Seconds after its push that a message without a reply is given up as silent
        (module docstring); None before any reply has come, or with ``silence_timeout`` 0."""
        if self.slowest_reply <= 0 or self.silence_timeout == 0:
            return None
        return max(self.silence_timeout, SILENCE_FACTOR * self.slowest_reply)

    def silent(self) -> list[Tag]:
        """The pending tags silent for :meth:`silence_limit` at the last pull, taken off
        pending."""
        limit = self.silence_limit()
        if limit is None:
            return []
        return self.expired(limit)

    def run_until(self, done: Callable[[], bool],
                  on_reply: Callable[[Tag, Message], None],
                  timeout: float | None = None,
                  waiting_for: Callable[[], Iterable[Tag]] | None = None,
                  hold_after_done: bool = False,
                  expire_after: float | None = None) -> list[Tag]:
        """Pull until ``done()`` (checked after every pull), calling ``on_reply(tag, reply)``
        for each reply as it comes; the callback may push more. Stops when nothing is pending
        any more; after ``timeout`` seconds (None: no limit) the messages still pending
        whose tags are in ``waiting_for()`` (default: all pending) are given up. Returns the
        tags given up (their replies are never delivered). With ``hold_after_done``, replies
        of a pull that come after ``done()`` turned true are held for the next call (which
        delivers them first) instead of delivered. With ``expire_after``, a message without a
        reply that many seconds after its own push is given up (the call returns its tag,
        with those of the others that expired by then)."""
        deadline = None if timeout is None else self.now() + timeout
        held, self.held = list(self.held.items()), {}
        for number, (tag, reply) in enumerate(held):
            if done():
                self.held.update(held[number:])
                return []
            on_reply(tag, reply)
        while not done() and self.pending:
            arrived = self.poll()
            for tag, reply in arrived:
                if hold_after_done and done():
                    self.held[tag] = reply
                    continue
                on_reply(tag, reply)
            if done() or not self.pending:
                break
            expired = self.expired(expire_after) + self.silent()
            if expired:
                return expired
            if deadline is not None and self.polled_at >= deadline:
                late = set(waiting_for() if waiting_for is not None else self.pending.values())
                lost = [tag for tag in self.pending.values() if tag in late]
                self.pending = {i: t for i, t in self.pending.items() if t not in late}
                return lost
            self.sleep(pull_delay(self.now() - self.pushed_at, self.pull_interval))
        return []

    def run_in_clock_order(self, done: Callable[[], bool],
                           on_reply: Callable[[Tag, Message], None],
                           completion: Callable[[Tag], float],
                           timeout: float | None = None,
                           expire_after: float | None = None,
                           on_lost: Callable[[Tag], None] | None = None) -> list[Tag]:
        """As :meth:`run_until`, but ``on_reply`` gets the replies in the order of their
        simulated completion time ``completion(tag)`` (ties: push order): an arrived reply
        waits until every pending message that completes earlier has replied or been given
        up. After ``timeout`` seconds the pending messages are given up, the held replies
        delivered in order, and the tags given up returned. With ``expire_after`` (and
        ``on_lost``), a message without a reply that many seconds after its own push is given
        up and ``on_lost(tag)`` called at its place in the completion order, as a reply would
        be: what the callbacks see then depends only on which messages are lost, not on when
        each was found lost. Replies pulled but not delivered when ``done()`` turns true are
        held for the next call."""
        if expire_after is not None and on_lost is None:
            raise ValueError("expire_after needs on_lost (what to do with a lost message)")
        def key(tag: Tag) -> tuple[float, int]:
            return completion(tag), self.push_number.get(tag, 0)

        arrived = self.held

        def deliver() -> None:
            while arrived and not done():
                first = min([*arrived, *self.pending.values()], key=key)
                if first not in arrived:
                    return  # an earlier completion is still on its way
                reply = arrived.pop(first)
                if reply is LOST:
                    on_lost(first)
                else:
                    on_reply(first, reply)

        deadline = None if timeout is None else self.now() + timeout
        while not done() and (self.pending or arrived):
            arrived.update(self.poll())
            deliver()
            if done() or not self.pending:
                continue
            expired = self.expired(expire_after)
            if on_lost is not None:
                expired += self.silent()
            if expired:
                arrived.update(dict.fromkeys(expired, LOST))
                deliver()
                continue
            if deadline is not None and self.polled_at >= deadline:
                lost = list(self.pending.values())
                self.pending.clear()
                deliver()
                return lost
            self.sleep(pull_delay(self.now() - self.pushed_at, self.pull_interval))
        return []

    def expired(self, expire_after: float | None) -> list[Tag]:
        """The pending tags pushed ``expire_after`` seconds or more before the last pull
        began (that pull did not bring their replies), taken off pending (none without
        ``expire_after``)."""
        if expire_after is None:
            return []
        expired = [t for t in self.pending.values()
                   if self.polled_at - self.push_time[t] >= expire_after]
        if expired:
            gone = set(expired)
            self.pending = {i: t for i, t in self.pending.items() if t not in gone}
        return expired

    def exchange(self, messages: Iterable[Message], timeout: float | None) -> list[Message]:
        """Push ``messages`` and pull their replies until all are in or ``timeout`` seconds
        have passed (None: until all are in): Flower's ``send_and_receive``. Replies in
        arrival order; a message without a reply by then, or silent
        (:meth:`silence_limit`), has none."""
        messages = list(messages)
        replies: list[Message] = []
        tags = list(range(len(messages)))
        self.push(messages, tags)
        del messages
        deadline = None if timeout is None else self.now() + timeout
        while set(tags) & set(self.pending.values()):  # given up silent: the rest go on
            left = None if deadline is None else max(deadline - self.now(), 0.0)
            self.run_until(lambda: False, lambda _, reply: replies.append(reply), left)
            if deadline is not None and self.now() >= deadline:
                break
        return replies
