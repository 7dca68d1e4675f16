"""A client whose task timed out is not drawn again at once (issue #57, item 4): with a
round timeout every round it is drawn costs the whole timeout. It sits out the next round,
after a second silence in a row the next two, then four, ...; any reply clears it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedapp import checkpoint_format, faults
from strategies import FedAvg, FedBuff
from strategies import contract as C
from strategies.engine.event_loop import SILENCE_TIMEOUT, GridEventLoop
from strategies.engine.participation import Participation
from strategies.engine.rounds import run_rounds
from strategies.engine.silent_clients import MAX_ROUNDS_OUT, SilentClients
from tests.inprocess import InProcessGrid, partition_facts
from tests.messages import record

SILENT = 3


def app(silent_rounds: set[int] | None = None) -> ClientApp:
    """Partition p returns w + 1; partition SILENT sleeps past the timeout (no reply) in
    ``silent_rounds`` (None: always)."""
    client = ClientApp()
    client.query()(partition_facts)

    @client.train()
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        if pid == SILENT and (silent_rounds is None or server_round in silent_rounds):
            faults.apply_fault(0, server_round, pid, 0.0, 1.0, 0.0)  # late: never answers
        w = msg.content[C.ARRAYS]["w"].numpy() + 1
        return Message(RecordDict({C.ARRAYS: record({"w": w}), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: 10})}), reply_to=msg)

    return client


def rounds_sent_to_silent(strategy: FedAvg, grid: InProcessGrid, rounds: int) -> list[int]:
    run_rounds(strategy, grid, record({"w": np.zeros(1)}), num_rounds=rounds, timeout=0.05,
               train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    node = grid.node_ids[SILENT]
    sent = [r for r in range(1, rounds + 1) if (node, "train") in grid.calls_by_round[r]]
    return sent


class RoundCalls(InProcessGrid):
    """Which (node, kind) calls each round made."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls_by_round: dict[int, set] = {}

    def deliver(self, msg, timeout=None):
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND]) if C.CONFIG in msg.content \
            else 0
        self.calls_by_round.setdefault(server_round, set()).add(
            (msg.metadata.dst_node_id, msg.metadata.message_type))
        return super().deliver(msg, timeout)


def test_a_silent_client_sits_out_1_then_2_then_4_rounds():
    """All four clients are drawn every round (fraction 1.0): before, the silent one was
    sent a task (and waited for) in each of 8 rounds; now in rounds 1, 3, 6."""
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4)
    grid = RoundCalls(app(), 4, {})
    assert rounds_sent_to_silent(strategy, grid, 8) == [1, 3, 6]
    assert [strategy.round_log(r)[C.LOG_CLIENTS_SAMPLED] for r in range(1, 9)] == \
        [4, 3, 4, 3, 3, 4, 3, 3]


def test_a_reply_clears_the_record_and_the_record_resumes():
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4)
    grid = RoundCalls(app(silent_rounds={1}), 4, {})
    assert rounds_sent_to_silent(strategy, grid, 4) == [1, 3, 4]  # back after one round out
    assert strategy.participation.silent.out_until == {}
    silent = SilentClients()
    silent.record(5, ["3"], ["0", "1"])
    silent.record(6, ["3"], [])
    assert silent.sitting_out(7) == silent.sitting_out(8) == {"3"} and not silent.sitting_out(9)
    copy = SilentClients()
    copy.load_state_dict(checkpoint_format.decode(*checkpoint_format.encode(silent.state_dict())))
    assert copy.state_dict() == silent.state_dict()
    for _ in range(10):
        silent.record(9, ["3"], [])
    assert silent.out_until["3"] == 9 + MAX_ROUNDS_OUT


def test_nobody_sits_out_below_min_train_nodes():
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4,
                      min_train_nodes=4)
    grid = RoundCalls(app(), 4, {})
    assert rounds_sent_to_silent(strategy, grid, 3) == [1, 2, 3]


def test_the_state_goes_into_the_checkpoint_only_when_someone_sits_out():
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4)
    assert "silent-clients" not in strategy.participation.state_dict()
    rounds_sent_to_silent(strategy, RoundCalls(app(), 4, {}), 4)
    saved = strategy.participation.state_dict()["silent-clients"]
    resumed = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4)
    resumed.participation.load_state_dict({"silent-clients": saved})
    assert resumed.participation.silent.state_dict() == saved


def test_fedbuff_does_not_give_a_lost_tasks_client_the_next_task():
    """FedBuff, 4 clients, 2 tasks in flight: the silent client's task is lost at the
    timeout and its slot freed. Before, that slot's next task went straight back to it (a
    uniform draw among the idle); now it sits out the next 2 draws, then 4, ... ."""
    strategy = FedBuff(buffer_size=2, concurrency=2, fraction_evaluate=0.0,
                       participation=Participation(query_client_info=True, seed=1))
    grid = InProcessGrid(app(), 4, {})
    run_rounds(strategy, grid, record({"w": np.zeros(1)}), num_rounds=6, timeout=0.05,
               train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    silent = grid.node_ids[SILENT]
    order = [node for node, kind in grid.calls if kind == "train"]
    picks = [k for k, n in enumerate(order) if n == silent]
    gaps = [b - a for a, b in zip(picks, picks[1:])]
    assert picks and all(gap > 2 for gap in gaps), order
    assert strategy.participation.silent.silences[str(SILENT)] == len(picks)


SHORT_SILENCE = 0.2  # seconds: the in-process replies take milliseconds


@pytest.mark.timeout(120)
def test_a_silent_task_costs_a_bounded_wait_not_the_round_timeout():
    """Flower's round timeout of 3600 s: FedAvg waited it in full for the silent client (an
    hour a round); now the silent task is given up once it has waited 10x the slowest reply
    (at least the floor), the round aggregates the others and it sits out the next one."""
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=4)
    grid = RoundCalls(app(), 4, {})
    grid.silence_timeout = SHORT_SILENCE
    run_rounds(strategy, grid, record({"w": np.zeros(1)}), num_rounds=3, timeout=3600,
               train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    assert [strategy.round_log(r)[C.LOG_CLIENTS_RECEIVED] for r in (1, 2, 3)] == [3, 3, 3]
    assert [strategy.round_log(r)[C.LOG_CLIENTS_SAMPLED] for r in (1, 2, 3)] == [4, 3, 4]


@pytest.mark.timeout(120)
def test_fedbuff_in_simulated_order_gives_up_a_silent_task_and_goes_on():
    """FedBuff's simulated arrival order held every later reply behind the silent task
    until its 3600 s timeout; now it is given up at its place on the clock."""
    strategy = FedBuff(buffer_size=2, concurrency=2, fraction_evaluate=0.0,
                       participation=Participation(query_client_info=True, seed=1))
    grid = InProcessGrid(app(), 4, {})
    grid.silence_timeout = SHORT_SILENCE
    run_rounds(strategy, grid, record({"w": np.zeros(1)}),
               num_rounds=4, timeout=3600, train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    assert all(strategy.round_log(r)[C.LOG_BUFFER_FILL] == 2 for r in range(1, 5))
    assert strategy.participation.silent.silences[str(SILENT)] >= 1


def test_the_silence_limit_is_10x_the_slowest_reply_and_at_least_the_grids_timeout():
    grid = InProcessGrid(app(), 1, {})
    loop = GridEventLoop(grid)
    assert loop.silence_timeout == SILENCE_TIMEOUT == 300.0  # the default
    assert loop.silence_limit() is None  # no reply yet: nobody is given up
    loop.slowest_reply = 2.0
    assert loop.silence_limit() == 300.0
    loop.slowest_reply = 40.0
    assert loop.silence_limit() == 400.0
    grid.silence_timeout = 900.0  # seconds; 0: wait the whole timeout of strategy.start
    loop = GridEventLoop(grid)  # what docs/reliability.md tells a user to write
    loop.slowest_reply = 2.0
    assert loop.silence_limit() == 900.0
    grid.silence_timeout = 0
    loop = GridEventLoop(grid)
    loop.slowest_reply = 2.0
    assert loop.silence_limit() is None  # off: the round timeout only
    for bad in (-1, "300", True, float("nan")):
        grid.silence_timeout = bad
        with pytest.raises(ValueError, match="silence_timeout"):
            GridEventLoop(grid)


def test_the_apps_grid_carries_the_run_configs_silence_timeout():
    from fedapp.grid import ServerAppGrid  # noqa: PLC0415

    grid = ServerAppGrid(InProcessGrid(app(), 1, {}), silence_timeout=42.0)
    assert GridEventLoop(grid).silence_timeout == 42.0
    assert GridEventLoop(ServerAppGrid(InProcessGrid(app(), 1, {}))).silence_timeout == 300.0
