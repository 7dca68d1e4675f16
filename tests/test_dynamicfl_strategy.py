"""Tests for strategies.algorithms.dynamicfl.DynamicFL on an in-process push/pull Grid.

The fake Grid queues pushed messages and answers a random few per ``pull_messages``
call (replies arrive out of order and late, as on a real link). A numpy-only ClientApp
does momentum SGD on a quadratic with a deterministic per-(seed, round, partition,
step) noise stream and keeps its momentum in ``Context.state``. The strategy's models
must equal the pure chunk simulator (:func:`tests.oracles.dynamicfl.run_plan`)
run on the same plans.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy
from flwr.supercore.task_identity import TaskIdentity

from strategies import contract as C
from strategies.algorithms import dynacomm as dc
from strategies.algorithms import dynamicfl_schedule as ds
from tests.oracles import dynamicfl as oracle
from strategies.contract import COMM_BUDGET, NUM_STEPS, ROUND_STEPS, START_STEP
from strategies.algorithms.dynamicfl import DynamicFL
from strategies.engine.records import ClientInfo
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record

NUM_NODES = 10
NUM_CLASSES = 4
RNG = np.random.default_rng(123)
HIST = [RNG.multinomial(40 + 10 * p,
                        RNG.dirichlet([0.3] * NUM_CLASSES)).tolist() for p in range(NUM_NODES)]
SIZES = [sum(h) for h in HIST]
TARGETS = [np.linspace(-1, 1, 3) * (p - 4.5) for p in range(NUM_NODES)]
LR, RHO, SEED = 0.05, 0.9, 3


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


def local_steps(pid: int, w: np.ndarray, v: np.ndarray, server_round: int, start: int, n: int,
                seed: int):
    """Momentum SGD on 0.5 ||w - target_p||^2 + noise from default_rng([seed, round, pid, step])."""
    w, v = w.copy(), v.copy()
    for step in range(start, start + n):
        noise = np.random.default_rng([seed, server_round, pid, step]).normal(size=w.shape)
        g = w - TARGETS[pid] + 0.1 * noise
        v = RHO * v + g
        w = w - LR * v
    return w, v


def make_app(budgets=None, fail_pid=None, label_counts=True) -> ClientApp:
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = {C.PARTITION_ID: pid, C.NUM_EXAMPLES: SIZES[pid]}
        if label_counts:
            metrics[C.LABEL_COUNTS] = HIST[pid]
        if budgets is not None:
            metrics[COMM_BUDGET] = float(budgets[pid])
        return Message(RecordDict({C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if pid == fail_pid:
            raise RuntimeError("device lost")
        cfg = msg.content[C.CONFIG]
        w = numpy_of(msg.content[C.ARRAYS])["w"]
        v = (numpy_of(context.state["momentum"])["v"] if "momentum" in context.state
             else np.zeros_like(w))
        w, v = local_steps(pid, w, v, int(cfg[C.SERVER_ROUND]), int(cfg[START_STEP]),
                           int(cfg[NUM_STEPS]), int(cfg[C.SEED]))
        context.state["momentum"] = record({"v": v})
        metrics = MetricRecord({C.NUM_EXAMPLES: SIZES[pid],
                                C.LOCAL_STEPS_TAKEN: int(cfg[NUM_STEPS]),
                                C.TRAIN_LOSS: float(0.5 * np.sum((w - TARGETS[pid]) ** 2))})
        return Message(RecordDict({C.ARRAYS: record({"w": w}), C.METRICS: metrics}), reply_to=msg)

    return app


class PushPullGrid(InProcessGrid):
    """pull_messages runs at most ``per_pull`` of the asked-for queued messages, in random
    order, so replies arrive late and out of order; pushes are recorded and a second chunk
    to a node with one in flight fails the test."""

    def __init__(self, app, per_pull: int = 2, seed: int = 0) -> None:
        super().__init__(app, NUM_NODES, {})
        self.per_pull = per_pull
        self.shuffle = random.Random(seed)
        self.pushes: list[list[tuple[int, int, int]]] = []  # per push call: (node, start, steps)
        self.in_flight: set[int] = set()

    def push_messages(self, messages):
        messages = list(messages)
        batch = []
        for msg in messages:
            if msg.metadata.message_type != MessageType.TRAIN:  # the round's evaluation
                continue
            node = msg.metadata.dst_node_id
            assert node not in self.in_flight, \
                "a node got a second chunk before replying to the first"
            self.in_flight.add(node)
            cfg = msg.content[C.CONFIG]
            batch.append((node, int(cfg[START_STEP]), int(cfg[NUM_STEPS])))
        if batch:
            self.pushes.append(batch)
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        ready = [i for i in message_ids if i in self.queue]
        self.shuffle.shuffle(ready)
        pulled = [self.queue.pop(i) for i in ready[: self.per_pull]]
        self.in_flight.difference_update(m.metadata.dst_node_id for m in pulled
                                         if m.metadata.message_type == MessageType.TRAIN)
        return [self.call(m) for m in pulled]


def pid_of(grid: InProcessGrid, node: int) -> int:
    return int(grid.contexts[node].node_config["partition-id"])


def reference_run(grid, strategy, w0, num_rounds):
    """The pure chunk simulator on the strategy's own plans, momentum per node across rounds."""
    momentum: dict[int, np.ndarray] = {}
    w = {"w": w0}
    for t in range(1, num_rounds + 1):
        def step(node, params, start, n, t=t):
            pid = pid_of(grid, node)
            v = momentum.get(node, np.zeros(3))
            new_w, momentum[node] = local_steps(pid, params["w"], v, t, start, n, SEED)
            return {"w": new_w}
        weights = {n: SIZES[pid_of(grid, n)] for n in grid.node_ids}
        w = oracle.run_plan(w, step, strategy.schedules[t], weights).global_params
    return w["w"]


def run(strategy, grid, rounds=2, w0=None):
    w0 = np.zeros(3) if w0 is None else w0
    result = strategy.start(grid, record({"w": w0}), num_rounds=rounds,
                            train_config=ConfigRecord({C.LR: LR, C.SEED: SEED}))
    return result


# ---------------------------------------------------------------- equality with the simulator
@pytest.mark.parametrize("intervals, steps", [("a-g", 12), ("b-c", 20), ("a", 6), ("c-g", 40)])
def test_strategy_equals_pure_simulator(intervals, steps):
    grid = PushPullGrid(make_app(), per_pull=3)
    strategy = DynamicFL(query_client_info=True,
                         intervals=intervals, local_steps=steps, budget_mode="dynamic", beta=0.4,
                         fraction_train=0.5, seed=SEED, poll_interval=0)
    result = run(strategy, grid, rounds=2)
    expected = reference_run(grid, strategy, np.zeros(3), 2)
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], expected, rtol=1e-12, atol=1e-14)
    # every pushed chunk is one the plan has, in the plan's order per node
    for t, plan in strategy.schedules.items():
        assert set(plan.training) <= set(grid.node_ids)
    sent = {}
    for batch in grid.pushes:
        for node, start, n in batch:
            sent.setdefault(node, []).append((start, n))
    planned = {}
    for t in (1, 2):
        for node, chunks in strategy.schedules[t].chunks.items():
            planned.setdefault(node, []).extend((c.start, c.num_steps) for c in chunks)
    assert sent == planned


def test_long_chunks_overlap_short_ones_and_diagnostics():
    grid = PushPullGrid(make_app(), per_pull=1)
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=10, budget_mode="dynamic", beta=0.4,
                         fraction_train=0.5, seed=SEED, poll_interval=0)
    run(strategy, grid, rounds=1)
    plan = strategy.schedules[1]
    z = [m for m, i in plan.intervals.items() if i == 1]
    low = [m for m, i in plan.intervals.items() if i == 10]
    assert len(z) <= 2 and len(z) + len(low) == 5  # k_max = floor(0.4 * 5) = 2
    # the low group's single 10-step chunk went out with the first push, next to z's 1-step chunks
    assert sorted(grid.pushes[0]) == sorted([(m, 0, 1) for m in z] + [(m, 0, 10) for m in low])
    assert all(node in z for batch in grid.pushes[1:] for node, _, _ in batch)
    d = strategy.round_log(1)
    nu = len(z) * 10 + len(low)
    assert d["syncs"] == nu and d[C.LOG_KAPPA_HAT] == pytest.approx(nu / 50)
    model_bytes = record({"w": np.zeros(3)}).count_bytes()
    assert d[C.LOG_BYTES_DOWN] == d[C.LOG_BYTES_UP] == nu * model_bytes
    assert d[C.LOG_SYNC_EVENTS] == (10 if z else 1) and d[C.LOG_DYNAMICFL_GROUP_SIZE] == len(z)
    assert d[C.LOG_CLIENTS_FAILED] == 0 and "train-loss" in d


def test_dynacomm_group_matches_pure_function():
    grid = PushPullGrid(make_app())
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=5, budget_mode="dynamic", beta=0.6,
                         fraction_train=0.5, seed=SEED, poll_interval=0)
    run(strategy, grid, rounds=1)
    plan = strategy.schedules[1]
    active = list(plan.training)  # partition order
    q = dc.global_label_distribution(HIST)  # ALL ten clients, not the five active
    expected = dc.dynacomm([HIST[pid_of(grid, n)] for n in active], q, k_max=3, rng=[SEED, 1, 7])
    high = sorted(m for m, i in plan.intervals.items() if i == 1)
    assert high == sorted(active[i] for i in expected.members)
    assert strategy.round_log(1)[C.LOG_DYNAMICFL_KL] == pytest.approx(expected.kl)


def test_fix_beta_only_rich_clients_in_the_high_group():
    grid = PushPullGrid(make_app())
    strategy = DynamicFL(query_client_info=True,
                         intervals="b-g", local_steps=8, budget_mode="fix", beta=0.3,
                         fraction_train=0.6, seed=SEED, poll_interval=0)
    run(strategy, grid, rounds=3)
    assert strategy.rich is not None and len(strategy.rich) == 3
    for plan in strategy.schedules.values():
        assert {m for m, i in plan.intervals.items() if i == 4} <= strategy.rich


def test_byte_budgets():
    # model = 3 float64 = 24 bytes (+ record overhead): with L = 8 at 'a', 2 |W| nu_high = 16 |W|
    model_bytes = record({"w": np.zeros(3)}).count_bytes()
    rich = [16 * model_bytes if p % 2 == 0 else 2 * model_bytes for p in range(NUM_NODES)]
    grid = PushPullGrid(make_app(budgets=rich))
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=8, budget_mode="budget", fraction_train=1.0,
                         server_budget=dc.server_budget_for_cap(2, NUM_NODES, 8, 1, model_bytes),
                         seed=SEED, poll_interval=0)
    run(strategy, grid, rounds=1)
    high = [m for m, i in strategy.schedules[1].intervals.items() if i == 1]
    assert len(high) <= 2 and all(pid_of(grid, m) % 2 == 0 for m in high)


def test_failed_client_is_dropped_and_the_round_completes():
    grid = PushPullGrid(make_app(fail_pid=0))
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=6,
                         fraction_train=1.0, seed=SEED, poll_interval=0)
    result = run(strategy, grid, rounds=1)
    assert strategy.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    assert np.isfinite(numpy_of(result.arrays)["w"]).all()


def test_x_star_paper_mode_trains_only_the_high_group():
    grid = PushPullGrid(make_app())
    strategy = DynamicFL(query_client_info=True,
                         intervals="a*", local_steps=5, budget_mode="dynamic", beta=0.4,
                         fraction_train=0.5,
                         seed=SEED, poll_interval=0)
    run(strategy, grid, rounds=1)
    plan = strategy.schedules[1]
    trained = {node for batch in grid.pushes for node, _, _ in batch}
    assert trained == set(plan.training) and len(trained) <= 2
    assert strategy.round_log(1)[C.LOG_KAPPA_HAT] == pytest.approx(len(trained) * 5 / 25)


def test_missing_label_counts_is_a_clear_error():
    grid = PushPullGrid(make_app(label_counts=False))
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=4, seed=SEED,
                         poll_interval=0)
    with pytest.raises(ValueError, match="label-counts"):
        run(strategy, grid, rounds=1)
    # one group ('a'): no DynaComm, no label counts needed
    run(DynamicFL(query_client_info=True,
                         intervals="a", local_steps=4, seed=SEED,
                  poll_interval=0), PushPullGrid(make_app(label_counts=False)), 1)


def test_constructor_validation():
    with pytest.raises(ValueError, match="not known"):
        DynamicFL(query_client_info=True,
                         intervals="a-h")
    with pytest.raises(ValueError, match="budget_mode"):
        DynamicFL(budget_mode="greedy")
    with pytest.raises(ValueError, match="x_star_mode"):
        DynamicFL(x_star_mode="both")
    for name, value in (("local_steps", -1), ("n_ens", 0), ("min_group_size", 0),
                        ("poll_interval", -0.5)):
        with pytest.raises(ValueError, match=f"^{name} must be >= .*got {value}$"):
            DynamicFL(query_client_info=True, **{name: value})


def test_l_from_eq4():
    grid = PushPullGrid(make_app())
    strategy = DynamicFL(query_client_info=True,
                         intervals="a-g", local_steps=0,
                         fraction_train=0.3, seed=SEED, poll_interval=0)
    from flwr.app import ConfigRecord
    strategy.start(grid, record({"w": np.zeros(3)}), num_rounds=1,
                   train_config=ConfigRecord({C.LR: LR, C.SEED: SEED, C.LOCAL_EPOCHS: 1,
                                              C.BATCH_SIZE: 10}))
    assert strategy.local_steps == int(sum(SIZES) / (NUM_NODES * 10))
    assert strategy.round_log(1)["local-steps"] == strategy.local_steps
    assert isinstance(strategy.schedules[1], ds.SyncSchedule)
    assert ROUND_STEPS == "round-steps"


def test_runs_its_own_rounds_and_says_so_to_flowers_loop():
    """A DynamicFL round is several exchanges: its own start runs them; Flower's loop, which
    has one exchange per round, is told to call that start instead of being handed an empty
    round."""
    strategy = DynamicFL(query_client_info=True, intervals="a-g", local_steps=12, beta=0.4,
                         fraction_train=0.5, seed=SEED, poll_interval=0)
    result = strategy.start(PushPullGrid(make_app(), per_pull=3), record({"w": np.zeros(3)}),
                            num_rounds=2, train_config=ConfigRecord({C.LR: LR, C.SEED: SEED}))
    assert result.arrays is not None and strategy.round_log(2)[C.LOG_SYNC_EVENTS] >= 2
    with pytest.raises(RuntimeError, match="its own start"):
        Strategy.start(strategy, PushPullGrid(make_app(), per_pull=3), record({"w": np.zeros(3)}),
                       num_rounds=1, train_config=ConfigRecord({C.LR: LR, C.SEED: SEED}))


def test_a_group_no_client_can_join_is_said_once(caplog):
    """Dynamic-beta with k_max = floor(beta |M^t|) = 0: DynaComm's z is empty and every client
    syncs only at the low interval (FedAvg in effect): one WARNING says so and how to fix it."""
    strategy = DynamicFL(intervals="1-4", local_steps=4, beta=0.3, query_client_info=True)
    nodes = [11, 12, 13]
    for k, node in enumerate(nodes):
        strategy.participation.clients[node] = ClientInfo(partition_id=k, num_examples=10,
                                                          label_counts=[5, 5])
    with caplog.at_level(logging.WARNING):
        for server_round in (1, 2):
            selection = strategy.choose_group(server_round, nodes, nodes, model_bytes=1000)
            assert len(selection.members) == 0
    warnings = [r.getMessage() for r in caplog.records if "high-frequency group" in r.getMessage()]
    assert len(warnings) == 1 and "k_max = 0" in warnings[0] and "Raise beta" in warnings[0]
