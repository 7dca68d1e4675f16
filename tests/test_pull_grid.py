"""fedapp.grid.PullIntervalGrid: Flower's send_and_receive loop with a 0.1 s pull interval."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import fedapp.grid
from fedapp.grid import PULL_INTERVAL, PullIntervalGrid
from tests.inprocess import InProcessGrid


class Clock:
    """Virtual time for the loop: sleep advances it."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class SlowRepliesGrid(InProcessGrid):
    """Each reply is pulled only after ``delay`` virtual seconds (None: never)."""

    def __init__(self, clock: Clock, delays: dict[int, float | None]) -> None:
        super().__init__(None, len(delays), {})
        self.clock, self.delays, self.pushed, self.pulls = clock, delays, {}, 0

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            ids.append(f"m{i}")
            self.pushed[f"m{i}"] = (self.clock.now + (self.delays[i] or 0), self.delays[i])
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        due = [i for i in sorted(message_ids) if self.pushed[i][1] is not None
               and self.pushed[i][0] <= self.clock.now]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in due]


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(fedapp.grid, "time", fake)
    return fake


def test_pulls_every_interval_until_all_replies_are_in(clock):
    inner = SlowRepliesGrid(clock, {0: 0.0, 1: 0.35, 2: 1.0})
    replies = PullIntervalGrid(inner).send_and_receive([object()] * 3, timeout=60)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert set(clock.sleeps) == {PULL_INTERVAL} and 10 <= inner.pulls <= 12  # not 3 s apart


def test_returns_what_arrived_when_the_timeout_passes(clock):
    inner = SlowRepliesGrid(clock, {0: 0.2, 1: None})  # node 1 never answers
    replies = PullIntervalGrid(inner).send_and_receive([object()] * 2, timeout=5)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 5 <= clock.now - 1000 <= 5 + PULL_INTERVAL + 1e-9


def test_no_timeout_waits_for_every_reply(clock):
    inner = SlowRepliesGrid(clock, {0: 30.0})
    assert len(PullIntervalGrid(inner).send_and_receive([object()], timeout=None)) == 1


def test_the_rest_of_the_grid_is_the_wrapped_one(clock):
    inner = SlowRepliesGrid(clock, {0: 0.0, 1: 0.0})
    grid = PullIntervalGrid(inner)
    assert list(grid.get_node_ids()) == list(inner.get_node_ids())
    assert grid.contexts is inner.contexts  # attributes a Grid subclass adds
    with pytest.raises(ValueError, match="pull_interval=0"):
        PullIntervalGrid(inner, pull_interval=0)
