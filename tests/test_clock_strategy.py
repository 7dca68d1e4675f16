"""The strategies keep the simulated clock: round times and deadline cut-offs of FedAvg, FedProx,
FedNova and DynamicFL on an in-process Grid against hand-computed numbers (eq. 1 of
strategies.engine.clock), availability, state, and the constructor checks."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from strategies import DynamicFL, FedAvg, FedNova, FedProx, FedVeca
from strategies import contract as C
from strategies.engine.clock import SimClock
from strategies.engine.devices import DeviceProfile, TraceFleet
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record
from tests.test_dynamicfl_strategy import make_app as make_dynamicfl_app

C_EX = 0.01  # seconds per example on the reference device
B = 10  # batch size; every partition has n = 100 > B examples
STEPS = 4
MODEL = {"w": np.zeros(125)}
SIZE = record(MODEL).count_bytes()  # bytes of the model each way
T = SIZE / 1e6  # seconds per transfer at 8 Mbit/s (10^6 bytes/s)
# compute of the full work, STEPS * B * C_EX / speed: 0.4, 0.8, 1.6 s
FLEET = TraceFleet({0: DeviceProfile(1.0, 8.0, 8.0), 1: DeviceProfile(0.5, 8.0, 8.0),
                    2: DeviceProfile(0.25, 8.0, 8.0)})
KW = {"query_client_info": True, "fraction_evaluate": 0.0}  # the server evaluates nothing
TRAIN = ConfigRecord({C.LR: 0.1, C.LOCAL_STEPS: STEPS, C.BATCH_SIZE: B})


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


def make_app(fail_pid: int | None = None) -> ClientApp:
    """Partition p: n = 100; trains ``local-steps`` steps (w + steps) and reports them."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({C.PARTITION_ID: pid, C.NUM_EXAMPLES: 100})
        return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if pid == fail_pid:
            raise RuntimeError("device lost")
        steps = int(msg.content[C.CONFIG][C.LOCAL_STEPS])
        arrays = {k: v + steps for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.NUM_EXAMPLES: 100, C.LOCAL_STEPS_TAKEN: steps})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)

    return app


class RecordingGrid(InProcessGrid):
    """Keeps (round, partition id, local-steps) of every train message it delivers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[int, int, int]] = []

    def deliver(self, msg: Message, timeout: float | None = None) -> Message | None:
        if msg.metadata.message_type == "train":
            config = msg.content[C.CONFIG]
            pid = int(self.contexts[msg.metadata.dst_node_id].node_config["partition-id"])
            self.sent.append((int(config[C.SERVER_ROUND]), pid, int(config[C.LOCAL_STEPS])))
        return super().deliver(msg, timeout)


def run(strategy, rounds: int = 2, fail_pid: int | None = None, fleet_nodes: int = 3):
    grid = RecordingGrid(make_app(fail_pid), fleet_nodes, {})
    strategy.start(grid, record(MODEL), num_rounds=rounds, train_config=ConfigRecord(dict(TRAIN)))
    return grid


def clock(fleet=FLEET) -> SimClock:
    return SimClock(fleet, seconds_per_example=C_EX)


def sent_steps(grid: RecordingGrid, server_round: int) -> dict[int, int]:
    """partition id -> local-steps of the train messages of one round."""
    return {pid: steps for r, pid, steps in grid.sent if r == server_round}


# ---------------------------------------------------------------- round times
def test_no_deadline_waits_for_the_slowest_client():
    strategy = FedAvg(**KW, clock=clock())
    run(strategy)
    for r in (1, 2):
        diag = strategy.round_log(r)
        assert diag[C.LOG_SIM_SECONDS] == pytest.approx(2 * T + 1.6)
        assert diag[C.LOG_CLIENTS_UNAVAILABLE] == 0
    assert strategy.round_log(2)[C.LOG_SIM_ELAPSED] == pytest.approx(2 * (2 * T + 1.6))


def test_deadline_fedprox_aggregates_the_part_that_fits():
    # D = 2T + 1.0: p2 fits floor(1.0 / 0.4) = 2 of its 4 steps; the others fit all 4
    strategy = FedProx(**KW, clock=clock(), round_deadline=2 * T + 1.0)
    grid = run(strategy)
    assert sent_steps(grid, 1) == {0: 4, 1: 4, 2: 2}
    diag = strategy.round_log(1)
    assert (diag[C.LOG_CLIENTS_STRAGGLERS], diag[C.LOG_CLIENTS_DROPPED]) == (1, 0)
    assert diag[C.LOG_CLIENTS_RECEIVED] == 3
    assert diag[C.LOG_SIM_SECONDS] == pytest.approx(2 * T + 0.8)  # p1 and p2 finish last


def test_deadline_fedavg_drops_the_client_and_waits_until_the_deadline():
    strategy = FedAvg(**KW, clock=clock(), round_deadline=2 * T + 1.0)
    grid = run(strategy)
    assert sent_steps(grid, 1) == {0: 4, 1: 4}
    diag = strategy.round_log(1)
    assert (diag[C.LOG_CLIENTS_STRAGGLERS], diag[C.LOG_CLIENTS_DROPPED]) == (1, 1)
    assert diag[C.LOG_SIM_SECONDS] == pytest.approx(2 * T + 1.0)


def test_deadline_fednova_drops_only_a_client_that_fits_no_step():
    # D = 2T + 0.3: p0 fits 3 steps, p1 1 step, p2 none (0.3 < 0.4)
    strategy = FedNova(**KW, clock=clock(), round_deadline=2 * T + 0.3)
    grid = run(strategy)
    assert sent_steps(grid, 1) == {0: 3, 1: 1}
    diag = strategy.round_log(1)
    assert (diag[C.LOG_CLIENTS_STRAGGLERS], diag[C.LOG_CLIENTS_DROPPED]) == (3, 1)
    assert diag[C.LOG_LOCAL_STEPS] == [3, 1] and diag[C.LOG_A_NORMS] == [3.0, 1.0]
    assert diag[C.LOG_SIM_SECONDS] == pytest.approx(2 * T + 0.3)  # waited for p2


def test_a_failed_client_counts_its_planned_time():
    strategy = FedAvg(**KW, clock=clock())
    run(strategy, rounds=1, fail_pid=2)
    diag = strategy.round_log(1)
    assert diag[C.LOG_CLIENTS_FAILED] == 1
    assert diag[C.LOG_SIM_SECONDS] == pytest.approx(2 * T + 1.6)


def test_offline_devices_are_not_sampled():
    fleet = TraceFleet({**FLEET.devices, 1: DeviceProfile(0.5, 8.0, 8.0, availability=0.0)})
    strategy = FedAvg(**KW, clock=clock(fleet))
    grid = run(strategy, rounds=2)
    for r in (1, 2):
        assert sorted(sent_steps(grid, r)) == [0, 2]
        assert strategy.round_log(r)[C.LOG_CLIENTS_UNAVAILABLE] == 1
        assert strategy.round_log(r)[C.LOG_CLIENTS_SAMPLED] == 2


def test_m_counts_every_connected_client():
    # C = 0.5 of K = 3 connected: m = 1, drawn among the online ones
    fleet = TraceFleet({p: DeviceProfile(availability=0.5) for p in range(3)})
    strategy = FedAvg(**KW, clock=clock(fleet), fraction_train=0.5, seed=3)
    run(strategy, rounds=4)
    assert all(strategy.round_log(r)[C.LOG_CLIENTS_SAMPLED] <= 1 for r in range(1, 5))


def test_waiting_for_a_window_is_part_of_the_round():
    fleet = TraceFleet({p: DeviceProfile(windows=((600.0, 86400.0),)) for p in range(3)})
    strategy = FedAvg(**KW, clock=clock(fleet))
    run(strategy, rounds=2)
    first, second = strategy.round_log(1), strategy.round_log(2)
    down, up = SIZE / (20e6 / 8), SIZE / (5e6 / 8)  # DeviceProfile's default bandwidths
    round_time = down + STEPS * B * C_EX + up
    assert first[C.LOG_SIM_WAIT_SECONDS] == 600.0
    assert first[C.LOG_SIM_SECONDS] == pytest.approx(600.0 + round_time)
    assert C.LOG_SIM_WAIT_SECONDS not in second
    assert second[C.LOG_SIM_ELAPSED] == pytest.approx(600.0 + 2 * round_time)


def test_the_clock_resumes_from_the_state_dict():
    strategy = FedNova(**KW, clock=clock())
    run(strategy, rounds=1)
    restored = FedNova(**KW, clock=clock())
    restored.load_state_dict(strategy.state_dict())
    assert restored.participation.timer.elapsed == strategy.participation.timer.elapsed == pytest.approx(2 * T + 1.6)
    veca = FedVeca(**KW, clock=clock())
    veca.participation.timer.elapsed = 12.5
    again = FedVeca(**KW, clock=clock())
    again.load_state_dict(veca.state_dict())
    assert again.participation.timer.elapsed == 12.5


def test_without_a_clock_nothing_is_logged():
    strategy = FedAvg(query_client_info=True)
    run(strategy, rounds=1)
    assert not {C.LOG_SIM_SECONDS, C.LOG_SIM_ELAPSED,
                C.LOG_CLIENTS_UNAVAILABLE} & set(strategy.round_log(1))
    assert "sim-elapsed" not in strategy.state_dict()


def test_fedveca_plans_the_gradient_upload_and_needs_two_steps():
    rec = record({"w": np.zeros(125), "count": np.zeros(3, dtype=np.int64)})
    w_only = record({"w": np.zeros(125)}).count_bytes()
    assert FedVeca(query_client_info=True).work.expected_bytes(rec) == (rec.count_bytes(),
                                                                   rec.count_bytes() + w_only)
    assert FedAvg().work.expected_bytes(rec) == (rec.count_bytes(), rec.count_bytes())
    assert FedVeca().work.min_partial_steps == 2 and FedAvg().work.min_partial_steps == 1


def test_fedveca_counts_its_gradient_pass_and_same_batch_estimate():
    from strategies.engine.records import ClientInfo  # noqa: PLC0415

    veca = FedVeca(query_client_info=True, clock=clock())
    veca.participation.clients = {7: ClientInfo(partition_id=0, num_examples=100)}
    common = ConfigRecord({C.BATCH_SIZE: B})
    assert veca.work.extra_examples(7, common) == 100  # grad F_i(w_k) over all 100 examples
    assert veca.work.examples_per_step(7, common) == B  # round 1: no estimate yet
    veca.algorithm.gnorm2_prev = 1.0  # from now on beta and delta are estimated
    assert veca.work.examples_per_step(7, common) == 2 * B  # same-batch: a second gradient per step
    literal = ConfigRecord({C.BATCH_SIZE: B, C.FEDVECA_ESTIMATE: True, C.BETA_MODE: "literal"})
    assert veca.work.examples_per_step(7, literal) == B
    sub = FedVeca(query_client_info=True, clock=clock(), grad_subsample=30)
    sub.participation.clients = veca.participation.clients
    assert sub.work.extra_examples(7, common) == 30
    assert FedAvg(query_client_info=True).work.extra_examples(7, common) == 0


# ---------------------------------------------------------------- DynamicFL per sync event
def dynamicfl_fleet() -> TraceFleet:
    # p0: steps of 10 examples * 0.01 s = 0.1 s, 10^6 B/s both ways;
    # p1: 0.2 s per step, uploads at 0.5 * 10^6 B/s
    return TraceFleet({0: DeviceProfile(1.0, 8.0, 8.0), 1: DeviceProfile(0.5, 8.0, 4.0)})


def test_dynamicfl_round_time_is_its_sync_events():
    strategy = DynamicFL(intervals="1-2", local_steps=2, beta=0.5, fraction_train=1.0,
                         **KW, clock=clock(dynamicfl_fleet()), seed=3)
    model = {"w": np.zeros(3)}
    t = record(model).count_bytes() / 1e6
    grid = InProcessGrid(make_dynamicfl_app(), 2, {})
    strategy.start(grid, record(model), num_rounds=1,
                   train_config=ConfigRecord({C.LR: 0.05, C.BATCH_SIZE: 10, C.SEED: 3}))
    plan = strategy.schedules[1]
    (high,) = [strategy.participation.clients[n].partition_id for n, i in plan.intervals.items() if i == 1]
    if high == 0:  # p0 syncs at steps 1 and 2 (events at 2t + 0.1, then 4t + 0.2); p1 at 2
        expected = max(4 * t + 0.2, t + 2 * 0.2 + 2 * t)
    else:  # p1 at 1 (3t + 0.2) and 2 (6t + 0.4); p0 at 2 (2t + 0.2)
        expected = max(6 * t + 0.4, 2 * t + 0.2)
    diag = strategy.round_log(1)
    assert diag[C.LOG_SIM_SECONDS] == pytest.approx(expected)
    assert diag[C.LOG_SIM_ELAPSED] == pytest.approx(expected)
    assert diag[C.LOG_SIM_SECONDS_PER_EVENT] == pytest.approx(expected / 2)


def test_dynamicfl_budgets_from_bandwidth_pick_the_high_group():
    # 'a' at L = 2 needs 2 syncs = 4 model transfers; p0 moves 10^6 B/s, p1 2/3 of that:
    # with 4 |W| / 0.8e6 seconds only p0 can afford it
    model = {"w": np.zeros(3)}
    size = record(model).count_bytes()
    strategy = DynamicFL(intervals="1-2", local_steps=2, budget_mode="budget",
                         fraction_train=1.0, **KW,
                         clock=clock(dynamicfl_fleet()), budget_seconds=4 * size / 0.8e6)
    grid = InProcessGrid(make_dynamicfl_app(), 2, {})
    strategy.start(grid, record(model), num_rounds=2,
                   train_config=ConfigRecord({C.LR: 0.05, C.BATCH_SIZE: 10, C.SEED: 3}))
    for r in (1, 2):
        plan = strategy.schedules[r]
        assert [strategy.participation.clients[n].partition_id for n, i in plan.intervals.items()
                if i == 1] == [0]


# ---------------------------------------------------------------- constructor checks
@pytest.mark.parametrize("make, word", [
    (lambda: FedAvg(clock=clock()), "client-info query"),
    (lambda: FedAvg(query_client_info=True, round_deadline=5.0), "needs a simulated clock"),
    (lambda: FedAvg(**KW, clock=clock(), round_deadline=-1.0),
     "round_deadline"),
    (lambda: FedProx(**KW, clock=clock(), round_deadline=5.0,
                     straggler_fraction=0.5), "alternatives"),
    (lambda: DynamicFL(intervals="a", local_steps=2, budget_seconds=5.0, clock=clock(),
                       query_client_info=True), "budget_mode='budget'"),
    (lambda: DynamicFL(intervals="a", local_steps=2, budget_mode="budget", budget_seconds=5.0),
     "a clock"),
    (lambda: DynamicFL(intervals="a", local_steps=2, budget_seconds=-1.0), "budget_seconds"),
])
def test_bad_clock_arguments_say_what_to_do(make, word):
    with pytest.raises(ValueError, match=word):
        make()


def test_scaffold_plans_the_control_variates_in_its_transfers():
    """SCAFFOLD moves c down and delta c_i up beside the model: twice the model's floating
    bytes each way in the clock's plan."""
    from strategies import Scaffold  # noqa: PLC0415
    from strategies.engine.records import to_record  # noqa: PLC0415

    arrays = to_record({"w": np.ones((3, 4), np.float32), "n": np.zeros(1, np.int64)})
    model_bytes = arrays.count_bytes()
    floats = to_record({"w": np.zeros((3, 4), np.float32)}).count_bytes()
    down, up = Scaffold().work.expected_bytes(arrays)
    assert (down, up) == (model_bytes + floats, model_bytes + floats)
