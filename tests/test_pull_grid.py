"""fedapp.grid.ServerAppGrid: Flower's send_and_receive loop with pulls 5 ms .. 0.1 s apart
(growing with the time since the push); the previous exchange's replies let go when the next
one starts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from fedapp.grid import ServerAppGrid
from strategies.engine import event_loop
from strategies.engine.event_loop import FIRST_PULL_DELAY, PULL_INTERVAL, pull_delay
from tests.inprocess import EchoGrid, InProcessGrid, young_heap


class Clock:
    """Virtual time for the loop: sleep advances it."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def monotonic(self) -> float:
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
    monkeypatch.setattr(event_loop, "time", fake)
    return fake


def test_pull_delay_is_a_quarter_of_the_time_since_the_push_within_bounds():
    assert pull_delay(0.0) == FIRST_PULL_DELAY == 0.005
    assert pull_delay(0.1) == pytest.approx(0.025)
    assert pull_delay(0.4) == pull_delay(30.0) == PULL_INTERVAL == 0.1
    assert pull_delay(30.0, pull_interval=0.5) == 0.5


def test_pulls_at_most_an_interval_apart_until_all_replies_are_in(clock):
    inner = SlowRepliesGrid(clock, {0: 0.0, 1: 0.35, 2: 1.0})
    replies = ServerAppGrid(inner).send_and_receive([object()] * 3, timeout=60)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert max(clock.sleeps) == PULL_INTERVAL and min(clock.sleeps) == FIRST_PULL_DELAY
    assert clock.sleeps == sorted(clock.sleeps)  # the sleep only grows within an exchange
    assert 1.0 <= clock.now - 1000 <= 1.0 + PULL_INTERVAL  # not 3 s apart
    assert inner.pulls == 1 + len(clock.sleeps) <= 26


def test_a_quick_reply_is_pulled_soon_not_an_interval_later(clock):
    inner = SlowRepliesGrid(clock, {0: 0.0, 1: 0.02})
    assert len(ServerAppGrid(inner).send_and_receive([object()] * 2, timeout=60)) == 2
    assert clock.now - 1000 <= 0.02 + FIRST_PULL_DELAY + 1e-9  # a fixed 0.1 s sleep: 0.1 s


def test_returns_what_arrived_when_the_timeout_passes(clock):
    inner = SlowRepliesGrid(clock, {0: 0.2, 1: None})  # node 1 never answers
    replies = ServerAppGrid(inner).send_and_receive([object()] * 2, timeout=5)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 5 <= clock.now - 1000 <= 5 + PULL_INTERVAL + 1e-9


def test_no_timeout_waits_for_every_reply(clock):
    inner = SlowRepliesGrid(clock, {0: 30.0})
    assert len(ServerAppGrid(inner).send_and_receive([object()], timeout=None)) == 1


def test_the_rest_of_the_grid_is_the_wrapped_one(clock):
    inner = SlowRepliesGrid(clock, {0: 0.0, 1: 0.0})
    grid = ServerAppGrid(inner)
    assert list(grid.get_node_ids()) == list(inner.get_node_ids())
    assert grid.contexts is inner.contexts  # attributes a Grid subclass adds
    with pytest.raises(ValueError, match="pull_interval=0"):
        ServerAppGrid(inner, pull_interval=0)


def test_the_previous_replies_are_let_go_when_the_next_exchange_starts(clock):
    # Flower's Strategy.start keeps round r's train_replies until round r + 1's return
    grid = ServerAppGrid(SlowRepliesGrid(clock, {0: 0.0, 1: 0.0}))
    first = grid.send_and_receive([object()] * 2, timeout=5)
    kept = list(first)  # what a strategy keeps of the messages themselves stays
    assert len(first) == 2
    second = grid.send_and_receive([object()] * 2, timeout=5)
    assert first == [] and len(second) == 2 and len(kept) == 2


def test_flowers_loop_holds_no_reply_of_an_earlier_exchange():
    # without the release, Flower's Strategy.start still held the 2 train replies at the
    # next push, and 4 (train and evaluate) from round 2 on
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as a ServerApp's
    inner = EchoGrid()
    with young_heap():
        FedAvg(min_available_nodes=2).start(grid=ServerAppGrid(inner), num_rounds=3,
                                            initial_arrays=ArrayRecord([np.zeros(3)]))
    assert inner.alive_at_push == [0] * 6  # train and evaluate, 3 rounds
