"""The round engine's components: the Grid event loop, the participation model, the typed
round plan and report, and the one round loop (resume by ``first_round``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.supercore.task_identity import TaskIdentity

from strategies import FedAvg, FedNova
from strategies import contract as C
from strategies.algorithms.fedveca import FedVecaSection
from strategies.engine.event_loop import GridEventLoop
from strategies.engine.participation import Participation, RandomSelection
from strategies.engine.round_plan import RoundPlan
from strategies.engine.round_report import (
    Aggregation,
    ClockTime,
    ParticipationSection,
    RoundReport,
)
from strategies.engine.rounds import round_log, run_rounds
from tests.inprocess import EchoGrid, InProcessGrid, adding_app, young_heap
from tests.messages import numpy_of, record


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


# ---------------------------------------------------------------- the Grid event loop
class ScriptedGrid:
    """Replies come ``delay`` virtual seconds after the push (None: never); the link takes
    at most ``accept`` messages per push."""

    def __init__(self, delays: dict[int, float | None], accept: int | None = None) -> None:
        self.delays, self.accept, self.now, self.pushed, self.pulls = delays, accept, 0.0, {}, 0

    def push_messages(self, messages):
        ids = []
        for msg in list(messages)[: self.accept]:
            message_id = f"m{len(self.pushed)}"
            self.pushed[message_id] = (msg, self.now, self.delays[msg])
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        for message_id in message_ids:
            msg, at, delay = self.pushed[message_id]
            if delay is not None and at + delay <= self.now:
                out.append(SimpleNamespace(metadata=SimpleNamespace(
                    reply_to_message_id=message_id), msg=msg))
        return out

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def loop_on(grid: ScriptedGrid) -> GridEventLoop:
    return GridEventLoop(grid, sleep=grid.sleep, now=lambda: grid.now)


def test_exchange_returns_the_replies_that_came_by_the_timeout():
    grid = ScriptedGrid({"a": 0.0, "b": 0.3, "c": None})
    replies = loop_on(grid).exchange(["a", "b", "c"], timeout=2.0)
    assert sorted(r.msg for r in replies) == ["a", "b"]
    assert 2.0 <= grid.now <= 2.1


def test_run_until_calls_back_per_reply_and_the_callback_may_push_more():
    grid = ScriptedGrid({"a": 0.0, "b": 0.2, "a2": 0.1})
    loop = loop_on(grid)
    loop.push(["a", "b"], ["tag-a", "tag-b"])
    seen = []

    def on_reply(tag, reply):
        seen.append(tag)
        if tag == "tag-a":  # a's next task goes out as soon as a's reply is in
            loop.push(["a2"], ["tag-a2"])

    lost = loop.run_until(lambda: len(seen) == 3, on_reply, timeout=10)
    assert lost == [] and seen[0] == "tag-a" and sorted(seen) == ["tag-a", "tag-a2", "tag-b"]


def test_run_until_gives_up_only_the_awaited_tags_at_the_timeout():
    grid = ScriptedGrid({"a": None, "b": None})
    loop = loop_on(grid)
    loop.push(["a", "b"], ["A", "B"])
    lost = loop.run_until(lambda: False, lambda *_: None, timeout=1.0,
                          waiting_for=lambda: ["A"])
    assert lost == ["A"] and loop.pending_tags() == ["B"]


def test_messages_the_link_refuses_are_lost_at_once():
    grid = ScriptedGrid({"a": 0.0, "b": 0.0, "c": 0.0}, accept=1)
    loop = loop_on(grid)
    assert loop.push(["a", "b", "c"], [1, 2, 3]) == [2, 3]
    assert loop.pending_tags() == [1]
    with pytest.raises(ValueError, match="tags"):
        loop.push(["a"], [])


# ---------------------------------------------------------------- the participation model
class EveryOther:
    """A selection policy: the candidates at even positions, once each."""

    def __init__(self) -> None:
        self.calls = []

    def select(self, server_round, candidates, num_sampled, fraction, probabilities):
        self.calls.append((server_round, list(candidates)))
        return {k: 1 for k in range(0, len(candidates), 2)}


def test_a_selection_policy_given_to_the_participation_model_picks_the_clients():
    grid = InProcessGrid(adding_app(), 6, {})
    policy = EveryOther()
    strategy = FedAvg(participation=Participation(query_client_info=True, selection=policy))
    messages = list(strategy.configure_train(1, record({"w": np.zeros(1)}), ConfigRecord(),
                                             grid))
    pids = sorted(int(grid.contexts[m.metadata.dst_node_id].node_config["partition-id"])
                  for m in messages)
    assert pids == [0, 2, 4]
    assert policy.calls[0][0] == 1 and len(policy.calls[0][1]) == 6
    assert strategy.round_log(1)[C.LOG_CLIENTS_SAMPLED] == 3


def test_random_selection_is_the_paper_sampling_keyed_by_seed_and_round():
    a = RandomSelection(3).select(2, list(range(10)), None, 0.5, None)
    assert a == RandomSelection(3).select(2, list(range(10)), None, 0.5, None)
    assert a != RandomSelection(3).select(3, list(range(10)), None, 0.5, None)
    assert len(a) == 5 and set(a.values()) == {1}


def test_strategy_and_participation_arguments_are_alternatives_checked_alike():
    with pytest.raises(ValueError, match="fraction_train"):
        Participation(fraction_train=0)
    with pytest.raises(ValueError, match="straggler_policy"):
        FedAvg(straggler_policy="sometimes")
    given = Participation(fraction_train=0.3, min_available_nodes=4)
    s = FedAvg(participation=given)
    assert s.participation is given and s.fraction_train == 0.3 and s.min_available_nodes == 4


def test_the_plan_goes_from_configure_to_aggregate_and_carries_the_report():
    grid = InProcessGrid(adding_app(), 3, {})
    s = FedAvg(query_client_info=True, straggler_fraction=0.4, straggler_policy="partial",
               seed=1)
    messages = list(s.configure_train(1, record({"w": np.zeros(1)}),
                                      ConfigRecord({C.LOCAL_STEPS: 8}), grid))
    plan = s.plans[1]
    assert set(plan.tasks) == {m.metadata.dst_node_id for m in messages}
    assert len(plan.straggler_work) == 1  # floor(0.4 * 3)
    (straggler, work), = plan.straggler_work.items()
    assert plan.tasks[straggler].config[C.LOCAL_STEPS] == work == plan.tasks[straggler].reduced_work
    replies = [InProcessGrid.call(grid, m) for m in messages]
    arrays, metrics = s.aggregate_train(1, replies)
    # w = sum_k n_k (pid_k + 1) / sum n_k with n_k = 10 (pid_k + 1): (10 + 40 + 90) / 60
    np.testing.assert_allclose(numpy_of(arrays)["w"], [140 / 60])
    log = s.round_log(1)
    assert log[C.LOG_CLIENTS_STRAGGLERS] == 1 and log[C.LOG_CLIENTS_RECEIVED] == 3
    assert metrics[C.LOG_CLIENTS_RECEIVED] == 3 and metrics[C.LOG_MODEL_KEPT] == 0
    with pytest.raises(RuntimeError, match="without configure_train"):
        s.aggregate_train(2, replies)


# ---------------------------------------------------------------- the typed report
def test_report_sections_log_their_contract_keys_and_metrics_only_numbers():
    report = RoundReport(3)
    report.add(ParticipationSection(sampled=4, bytes_down=100, lr=None))
    report.add(Aggregation(received=3, failed=1, local_steps=[2, 3, 4], model_kept=False))
    report.add(ClockTime(1.5, 10.0))
    report.add(FedVecaSection(tau={"0": 5}, smoothness=None))
    log = report.log_record()
    assert log[C.LOG_CLIENTS_SAMPLED] == 4 and C.LOG_LR not in log  # None: left out
    assert log[C.LOG_FEDVECA_L] is None  # keep_none: "not computable this round"
    assert C.LOG_SIM_WAIT_SECONDS not in log and log[C.LOG_SIM_ELAPSED] == 10.0
    metrics = report.metric_items()
    assert metrics[C.LOG_LOCAL_STEPS] == [2, 3, 4] and metrics[C.LOG_MODEL_KEPT] == 0
    assert C.LOG_FEDVECA_TAU not in metrics and C.LOG_FEDVECA_L not in metrics
    report.add(Aggregation(received=2))  # a section of the same type replaces the first
    assert report.log_record()[C.LOG_CLIENTS_RECEIVED] == 2
    assert round_log(object(), 3) == {}  # a strategy that reports nothing


# ---------------------------------------------------------------- the round loop
@pytest.mark.parametrize("cls", [FedAvg, FedNova])
def test_resuming_at_round_r_gives_the_uninterrupted_models(cls):
    def strategy():
        return cls(query_client_info=True, fraction_train=0.5, seed=4)

    train = ConfigRecord({C.LOCAL_STEPS: 1})
    full = run_rounds(strategy(), InProcessGrid(adding_app(), 6, {}), record({"w": np.zeros(2)}),
                      num_rounds=4, train_config=train)
    first = run_rounds(strategy(), InProcessGrid(adding_app(), 6, {}),
                       record({"w": np.zeros(2)}), num_rounds=2, train_config=train)
    evaluated = []
    resumed = run_rounds(strategy(), InProcessGrid(adding_app(), 6, {}), first.arrays,
                         num_rounds=4, train_config=train, first_round=3,
                         evaluate_fn=lambda r, _: evaluated.append(r))
    assert numpy_of(resumed.arrays)["w"].tobytes() == numpy_of(full.arrays)["w"].tobytes()
    assert evaluated == [3, 4]  # round 2's model is not evaluated again
    with pytest.raises(ValueError, match="first_round"):
        run_rounds(strategy(), InProcessGrid(adding_app(), 6, {}), first.arrays, first_round=0)


def test_the_round_loop_holds_no_reply_of_an_earlier_exchange():
    inner = EchoGrid()
    with young_heap():
        FedAvg(min_available_nodes=2).start(grid=inner, num_rounds=3,
                                            initial_arrays=ArrayRecord([np.zeros(3)]))
    assert inner.alive_at_push == [0] * 6  # train and evaluate, 3 rounds


def test_plan_of_sent_keys_tasks_by_node():
    plan = RoundPlan.of_sent(2, record({"w": np.zeros(1)}), {5: {C.LR: 0.1}, 3: {}},
                             partition_ids={5: 1, 3: 0}, draws={5: 2})
    assert plan.nodes == (3, 5) and plan.tasks[5].draws == 2 and plan.tasks[3].partition_id == 0
    assert plan.sent(5)[C.LR] == 0.1 and len(plan.sent(99)) == 0


def test_clock_order_delivers_by_simulated_completion_whatever_the_arrival_order():
    # real arrival: c (0.0 s), b (0.1 s), a (0.5 s); simulated completion: a 1, b 2, c 3
    grid = ScriptedGrid({"a": 0.5, "b": 0.1, "c": 0.0, "d": 0.0})
    loop = loop_on(grid)
    loop.push(["a", "b", "c"], ["a", "b", "c"])
    completion = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 2.5}
    seen = []

    def on_reply(tag, reply):
        seen.append(tag)
        if tag == "a":  # a freed client gets a new task that completes at 2.5 on the clock
            loop.push(["d"], ["d"])

    assert loop.run_in_clock_order(lambda: len(seen) == 4, on_reply, completion.get) == []
    assert seen == ["a", "b", "d", "c"]


def test_clock_order_gives_up_the_late_and_delivers_what_it_held():
    grid = ScriptedGrid({"a": None, "b": 0.0})  # a (completes first) never replies
    loop = loop_on(grid)
    loop.push(["a", "b"], ["a", "b"])
    seen = []
    lost = loop.run_in_clock_order(lambda: False, lambda t, _: seen.append(t),
                                   {"a": 1.0, "b": 2.0}.get, timeout=1.0)
    assert lost == ["a"] and seen == ["b"]


def test_time_the_server_spends_between_pulls_never_loses_a_reply_that_is_in():
    """A task pushed while the server handles a reply, which then keeps the server busy past
    the task's expiry (an aggregation, an evaluation), is not given up: its reply is in by
    the next pull. Only a pull that began after the expiry decides (the fedbuff flake of CI
    at b287b40: under load two healthy clients counted as failed)."""
    grid = ScriptedGrid({"a": 0.0, "b": 0.0, "c": 0.1, "late": None})
    loop = loop_on(grid)
    loop.push(["a", "late"], ["a", "late"])
    seen, lost = [], []

    def on_reply(tag, reply):
        seen.append(tag)
        if tag == "a":
            loop.push(["b"], ["b"])
            grid.now += 5.0  # the server is busy for longer than expire_after
        if tag == "b":
            loop.push(["c"], ["c"])

    loop.run_in_clock_order(lambda: len(seen) + len(lost) == 4, on_reply,
                            {"a": 1.0, "late": 9.0, "b": 2.0, "c": 3.0}.get,
                            expire_after=1.0, on_lost=lost.append)
    assert seen == ["a", "b", "c"] and lost == ["late"]
    grid = ScriptedGrid({"a": 0.0, "b": 0.0})
    loop = loop_on(grid)
    loop.push(["a"], ["a"])
    got = []

    def busy(tag, reply):
        got.append(tag)
        if tag == "a":
            loop.push(["b"], ["b"])
            grid.now += 5.0

    assert loop.run_until(lambda: len(got) == 2, busy, expire_after=1.0) == []
    assert got == ["a", "b"]
