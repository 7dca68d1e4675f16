"""Rules the papers (and their authors' code) set, each against a re-derivation written here:

* SCAFFOLD's c and FedDyn's h when clients join or leave (Karimireddy et al. 2020, Alg. 1
  line 17; Acar et al. 2021, Alg. 1): N / m is the ``num_clients`` given, or the most
  clients connected in any round so far when more; a client that leaves is a client not
  sampled, a client that joins beyond N raises N without a rescaling of c / h (which are
  then no longer the mean of the clients' states);
* FedAsync's staleness of an update trained from the newest model (Xie, Koyejo and Gupta
  2019, Alg. 1): 0 as in the authors' code (xcgoner/async_fl) by default, 1 (Algorithm 1
  read literally) as an option;
* FedNova's client that took no local step (Wang et al. 2020, eq. 6): left out of the
  round, reported or derived alike, p_i over the other replies; never a crash.

The strategies run on the in-process Grid with numpy-only ClientApps (no torch, no Ray).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from strategies import FedAsync, FedDyn, FedNova, Scaffold
from strategies import contract as C
from strategies.algorithms import feddyn_math as fm
from strategies.algorithms import fedasync as fedasync_module
from strategies.algorithms import feddyn as feddyn_module
from strategies.algorithms import scaffold as scaffold_module
from strategies.algorithms import scaffold_math as sm
from strategies.algorithms.fednova import stock_loop_steps
from strategies.algorithms.staleness import Staleness, fedasync_weight
from strategies.client.info import client_info_reply
from strategies.client.state import resolve_state, save_state
from strategies.engine.client_states import TotalClients, clients_so_far, state_digest
from strategies.engine.participation import Participation
from strategies.engine.rounds import run_rounds
from tests.inprocess import InProcessGrid, adding_app
from tests.messages import instruction, numpy_of, prepared_round, record


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


# ================================================================ a fleet that changes
class FleetGrid(InProcessGrid):
    """max(fleet) nodes (partition ids 0, 1, ...), of which the first ``fleet[r - 1]`` are
    connected in round r (the round is read from the train messages pushed so far)."""

    def __init__(self, app: ClientApp, fleet: list[int]) -> None:
        super().__init__(app, max(fleet), {})
        self.fleet, self.round = fleet, 0

    def get_node_ids(self):
        return self.node_ids[:self.fleet[min(self.round, len(self.fleet) - 1)]]

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            if msg.metadata.message_type == "train":
                self.round = max(self.round, int(msg.content[C.CONFIG][C.SERVER_ROUND]))
        return super().push_messages(messages)


def stateful_app(kind: str) -> ClientApp:
    """Client k = partition id + 1 returns the model moved by k; SCAFFOLD's delta c_i = k,
    FedDyn's linear term updated from that move (Acar et al., Alg. 1), both kept with the
    generic client-state helpers."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"]) + 1
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        theta = numpy_of(msg.content[C.ARRAYS])
        local = {key: v + k for key, v in theta.items()}
        content = RecordDict({C.ARRAYS: record(local)})
        if kind == "scaffold":
            control = numpy_of(msg.content[C.SCAFFOLD_C])
            state, used = resolve_state(context.state, "s", msg.content,
                                        sm.zero_control(control))
            delta = {key: np.full_like(v, k) for key, v in control.items()}
            save_state(context.state, "s", sm.apply_delta(state, delta), server_round)
            content[C.SCAFFOLD_DELTA_C] = record(delta)
        else:
            state, used = resolve_state(context.state, "s", msg.content, fm.zero_state(theta))
            alpha = float(msg.content[C.CONFIG][C.FEDDYN_ALPHA])
            save_state(context.state, "s", fm.linear_term_update(state, alpha, local, theta),
                       server_round)
        content[C.METRICS] = MetricRecord({C.NUM_EXAMPLES: 10, C.STATE_ROUND_USED: used,
                                           C.STATE_DIGEST: state_digest(state)})
        return Message(content, reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return client_info_reply(msg, partition_id=int(context.node_config["partition-id"]),
                                 num_examples=10)

    return app


def run_fleet(strategy, kind: str, fleet: list[int]):
    grid = FleetGrid(stateful_app(kind), fleet)
    result = strategy.start(grid, record({"w": np.zeros(2, np.float32)}),
                            num_rounds=len(fleet), train_config=ConfigRecord({C.LR: 0.1}))
    copies = {k: strategy.client_states.mirror.state_of(str(k - 1)) for k in range(1, 6)}
    return result, {k: (0.0 if c is None else float(c["w"][0])) for k, c in copies.items()}


def algorithm_1(fleet: list[int], scale: float = 1.0):
    """Algorithm 1's server state, re-derived round by round for clients k = 1..fleet[r]
    that all reply with delta_k = scale * k (SCAFFOLD: delta c_k = k; FedDyn's linear term:
    -alpha (theta_k - theta) = -alpha k): state += (1 / N) sum_{k in S} delta_k with N the
    most clients connected so far, and each client's own state += delta_k. Returns the
    state after each round, and each client's state at the end."""
    state, most, own, states = 0.0, 0, {k: 0.0 for k in range(1, 6)}, []
    for connected in fleet:
        most = max(most, connected)
        state += sum(scale * k for k in range(1, connected + 1)) / most
        states.append(state)
        for k in range(1, connected + 1):
            own[k] += scale * k
    return states, own


# ---------------------------------------------------------------- SCAFFOLD
def test_scaffold_c_when_clients_join_is_line_17_with_the_larger_n():
    # 3 clients for 2 rounds, then 5: c = 2 * 6 / 3 + 2 * 15 / 5 = 10; the copies' mean is
    # (4 + 8 + 12 + 8 + 10) / 5 = 8.4: a join is not rescaled (Algorithm 1 has none)
    fleet = [3, 3, 5, 5]
    strategy = Scaffold(query_client_info=True, fraction_evaluate=0.0)
    _, copies = run_fleet(strategy, "scaffold", fleet)
    (*_, c), own = algorithm_1(fleet)
    assert c == pytest.approx(10.0) and np.mean(list(own.values())) == pytest.approx(8.4)
    np.testing.assert_allclose(strategy.algorithm.control["w"], [c, c], rtol=1e-6)
    assert copies == pytest.approx(own)
    assert strategy.algorithm.clients.value == 5


def test_scaffold_c_when_clients_leave_stays_the_mean_of_all_copies():
    # 5 clients for 2 rounds, then 3: N stays 5 (the 2 that left are clients not sampled),
    # c = 2 * 15 / 5 + 2 * 6 / 5 = 8.4 = (4 + 8 + 12 + 8 + 10) / 5
    fleet = [5, 5, 3, 3]
    strategy = Scaffold(query_client_info=True, fraction_evaluate=0.0)
    _, copies = run_fleet(strategy, "scaffold", fleet)
    (*_, c), own = algorithm_1(fleet)
    assert c == pytest.approx(8.4) == pytest.approx(np.mean(list(own.values())))
    np.testing.assert_allclose(strategy.algorithm.control["w"], [c, c], rtol=1e-6)
    assert copies == pytest.approx(own)
    # the connected-count N of before would have made it 6 + 2 + 2 = 10
    assert strategy.algorithm.clients.value == 5


def test_scaffold_c_when_clients_leave_and_rejoin():
    fleet = [5, 3, 5, 3]
    strategy = Scaffold(query_client_info=True, fraction_evaluate=0.0)
    _, copies = run_fleet(strategy, "scaffold", fleet)
    (*_, c), own = algorithm_1(fleet)
    np.testing.assert_allclose(strategy.algorithm.control["w"], [c, c], rtol=1e-6)
    assert c == pytest.approx(np.mean(list(copies.values())))


def test_scaffold_n_survives_a_checkpoint():
    strategy = Scaffold(query_client_info=True, fraction_evaluate=0.0)
    run_fleet(strategy, "scaffold", [5, 3])
    state = strategy.state_dict()
    assert state["algorithm"]["clients"] == 5
    fresh = Scaffold(query_client_info=True)
    fresh.load_state_dict(state)
    assert fresh.algorithm.clients.value == 5
    del state["algorithm"]["clients"]  # a checkpoint from before: N from the next round
    fresh.load_state_dict(state)
    assert fresh.algorithm.clients.value == 0


# ---------------------------------------------------------------- FedDyn
@pytest.mark.parametrize("fleet, h_expected, mean_expected", [
    ([3, 3, 5, 5], -5.0, -4.2),  # join: h = -0.5 (2 * 6 / 3 + 2 * 15 / 5); not the mean
    ([5, 5, 3, 3], -4.2, -4.2),  # leave: m stays 5, h is the mean of all 5 linear terms
    ([5, 3, 5, 3], None, None),
], ids=["join", "leave", "leave-rejoin"])
def test_feddyn_h_and_model_when_clients_join_or_leave(fleet, h_expected, mean_expected):
    alpha = 0.5
    strategy = FedDyn(alpha=alpha, query_client_info=True, fraction_evaluate=0.0)
    result, copies = run_fleet(strategy, "feddyn", fleet)
    hs, own = algorithm_1(fleet, scale=-alpha)
    h, theta = hs[-1], 0.0
    for connected, h_t in zip(fleet, hs):  # theta^t = mean_k theta_k^t - h^t / alpha
        theta = theta + np.mean(np.arange(1, connected + 1)) - h_t / alpha
    if h_expected is not None:
        assert h == pytest.approx(h_expected)
        assert np.mean(list(own.values())) == pytest.approx(mean_expected)
    if fleet[-1] < max(fleet) and fleet[0] == max(fleet):
        assert h == pytest.approx(np.mean(list(own.values())))  # leaves keep h the mean
    np.testing.assert_allclose(strategy.algorithm.h["w"], [h, h], rtol=1e-6)
    assert copies == pytest.approx(own)
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [theta, theta], rtol=1e-6)
    assert strategy.algorithm.clients.value == 5
    assert strategy.state_dict()["algorithm"]["clients"] == 5


def test_n_is_the_most_clients_connected_so_far_or_the_n_given():
    assert clients_so_far(0, 3) == 3 and clients_so_far(3, 5) == 5
    assert clients_so_far(5, 3) == 5
    with pytest.raises(ValueError, match="client counts"):
        clients_so_far(-1, 3)
    given = TotalClients(5, "scaffold-num-clients", "SCAFFOLD")
    assert [given.update(n) for n in (3, 5, 2)] == [5, 5, 5]
    given.load(None)  # a checkpoint from before N was kept
    assert given.value == 5


@pytest.mark.parametrize("cls, kind", [(Scaffold, "scaffold"), (FedDyn, "feddyn")])
def test_a_given_n_keeps_the_server_state_the_mean_when_clients_join(cls, kind):
    # num_clients = 5 from the start: clients 4 and 5 count with state 0 until they join,
    # so after 3, 3, 5, 5 clients the state is (2 * 6 + 2 * 15) / 5 = 8.4 (x -alpha), the mean
    strategy = cls(query_client_info=True, fraction_evaluate=0.0, num_clients=5)
    _, copies = run_fleet(strategy, kind, [3, 3, 5, 5])
    state = (strategy.algorithm.control if kind == "scaffold" else strategy.algorithm.h)["w"]
    scale = 1.0 if kind == "scaffold" else -0.01  # FedDyn's default alpha
    assert np.mean(list(copies.values())) == pytest.approx(8.4 * scale)
    np.testing.assert_allclose(state, [8.4 * scale] * 2, rtol=1e-6)


@pytest.mark.parametrize("cls, key", [(Scaffold, "scaffold-num-clients"),
                                      (FedDyn, "feddyn-num-clients")])
def test_more_clients_than_the_n_given_raise_n_with_one_warning(cls, key, caplog):
    strategy = cls(query_client_info=True, fraction_evaluate=0.0, num_clients=3)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_fleet(strategy, "scaffold" if cls is Scaffold else "feddyn", [3, 5, 5])
    lines = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(lines) == 1 and "5 clients are connected" in lines[0]
    assert strategy.algorithm.clients.value == 5


@pytest.mark.parametrize("cls, key", [(Scaffold, "scaffold-num-clients"),
                                      (FedDyn, "feddyn-num-clients")])
@pytest.mark.parametrize("bad", [-1, 2.5, True, "5"])
def test_a_bad_n_is_refused_naming_the_key(cls, key, bad):
    with pytest.raises(ValueError) as info:
        cls(num_clients=bad)
    message = str(info.value)
    assert key in message and repr(bad) in message and "0 for the most clients" in message


@pytest.mark.parametrize("module, key", [(scaffold_module, "scaffold-num-clients"),
                                         (feddyn_module, "feddyn-num-clients")])
def test_the_n_key_is_declared_beside_the_algorithm(module, key):
    declared = next(k for k in module.KEYS if k.name == key)
    assert declared.default == 0 and declared.arg == "num_clients"
    assert declared.refusal(5) is None and declared.refusal(-1) is not None


# ================================================================ FedAsync's staleness
def authors_code_delays(pulled: list[int]) -> list[int]:
    """xcgoner/async_fl: server epoch e applies one update, the model it makes is stamped
    e + 1 (x_0 is stamped 0), worker_delay = epoch - the stamp of the model pulled."""
    return [epoch - stamp for epoch, stamp in enumerate(pulled)]


def algorithm_1_delays(pulled: list[int]) -> list[int]:
    """Algorithm 1 read literally: the Updater's epoch t = 1, 2, ... makes x_t, t - tau with
    tau the time stamp of the model pulled."""
    return [t - stamp for t, stamp in enumerate(pulled, start=1)]


class FirstIdle:
    """A selection policy: the first candidate (lowest partition id)."""

    def select(self, server_round, candidates, num_sampled, fraction, probabilities):
        return {0: 1}


@pytest.mark.parametrize("fresh, delays", [
    (0, authors_code_delays([0, 0])), (1, algorithm_1_delays([0, 0]))],
    ids=["authors-code", "algorithm-1"])
def test_fedasync_staleness_of_a_fresh_update(fresh, delays):
    # two tasks sent x_0 (stamp 0); p0's model x = 1 is applied first, then p1's x = 2
    alpha = 0.5
    kwargs = {} if fresh == 0 else {"fresh_staleness": 1}
    strategy = FedAsync(alpha=alpha, concurrency=2, updates_per_round=2, fraction_evaluate=0.0,
                        participation=Participation(query_client_info=True,
                                                    selection=FirstIdle()), **kwargs)
    result = run_rounds(strategy, InProcessGrid(adding_app(), 2, {}), record({"w": np.zeros(1)}),
                        num_rounds=1, train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    x = 0.0
    for delay, x_new in zip(delays, (1.0, 2.0)):
        a_t = alpha * (delay + 1) ** -0.5  # polynomial s, a = 0.5
        x = (1 - a_t) * x + a_t * x_new
    assert numpy_of(result.arrays)["w"][0] == pytest.approx(x, abs=1e-15)
    assert strategy.round_log(1)[C.LOG_STALENESS] == [0, 1]  # versions behind, both ways


def test_fedasync_weight_of_a_fresh_update():
    poly, hinge = Staleness("polynomial", a=0.5), Staleness("hinge", a=10.0, b=4.0)
    assert fedasync_weight(0.6, poly, 0) == 0.6  # the authors' code: alpha
    assert fedasync_weight(0.6, poly, 0, fresh_staleness=1) == pytest.approx(0.6 / math.sqrt(2))
    assert fedasync_weight(0.6, hinge, 4) == 0.6  # t - tau = 4 <= b
    assert fedasync_weight(0.6, hinge, 4, 1) == pytest.approx(0.6 / (10 * (5 - 4) + 1))


@pytest.mark.parametrize("bad", [2, -1, True, 0.5, "1"])
def test_fedasync_fresh_staleness_is_checked(bad):
    with pytest.raises(ValueError) as info:
        FedAsync(fresh_staleness=bad)
    message = str(info.value)
    assert "fedasync-fresh-staleness" in message and repr(bad) in message
    assert "0 (the authors' code) or 1" in message


def test_fedasync_fresh_staleness_key_is_declared_beside_it():
    key = next(k for k in fedasync_module.KEYS if k.name == "fedasync-fresh-staleness")
    assert key.default == 0 and key.arg == "fresh_staleness"
    assert key.refusal(1) is None and key.refusal(2) is not None
    assert key.arguments(1) == {"fresh_staleness": 1}


# ================================================================ FedNova, no local step
def reply(node: int, values, n: int, **metrics) -> Message:
    """A train reply of ``node`` with arrays {"w": values} and metrics num-examples = n."""
    content = RecordDict({C.ARRAYS: record({"w": np.asarray(values, dtype=np.float64)}),
                          C.METRICS: MetricRecord({C.NUM_EXAMPLES: n, **metrics})})
    return Message(content, reply_to=instruction(node))


def fednova_eq6(w, clients):
    """Wang et al. 2020, eq. (6) by hand over (w_i, n_i, tau_i) of the clients aggregated:
    p_i = n_i / sum n, d_i = (w - w_i) / tau_i, w - tau_eff sum p_i d_i."""
    n = np.array([c[1] for c in clients], dtype=float)
    p = n / n.sum()
    tau_eff = sum(p_i * c[2] for p_i, c in zip(p, clients))
    step = sum(p_i * (np.asarray(w) - np.asarray(c[0])) / c[2] for p_i, c in zip(p, clients))
    return np.asarray(w) - tau_eff * step


def nova(**kwargs):
    strategy = FedNova(query_client_info=True, **kwargs)
    return prepared_round(strategy, {"w": np.zeros(2)}, {1: {}, 2: {}, 3: {}})


def test_a_stock_client_that_takes_no_step_is_left_out(caplog):
    # E = 2, B = 8, drop_last: n = 10 -> 2 steps, n = 30 -> 6, n = 5 -> none (5 < 8)
    s = nova(local_epochs=2, batch_size=8, drop_last=True)
    w1, w2, w3 = [2.0, 2.0], [6.0, 12.0], [0.0, 0.0]  # the third never stepped
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = s.aggregate_train(1, [reply(1, w1, 10), reply(2, w2, 30), reply(3, w3, 5)])
    expected = fednova_eq6([0.0, 0.0], [(w1, 10, 2), (w2, 30, 6)])
    np.testing.assert_allclose(numpy_of(arrays)["w"], expected, atol=1e-14)
    np.testing.assert_allclose(expected, [5.0, 8.75])
    counted_as_one = fednova_eq6([0.0, 0.0], [(w1, 10, 2), (w2, 30, 6), (w3, 5, 1)])
    assert np.abs(counted_as_one - expected).max() > 1.0  # what counting it as 1 step did
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    assert s.round_log(1)[C.LOG_A_NORMS] == [2.0, 6.0]
    lines = [r.getMessage() for r in caplog.records if "no local step" in r.getMessage()]
    assert len(lines) == 1 and "n_i = 5" in lines[0] and "drop_last=True" in lines[0]


def test_a_reply_reporting_no_step_is_left_out_the_same_way(caplog):
    s = nova()
    w1, w2 = [2.0, 2.0], [6.0, 12.0]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = s.aggregate_train(1, [reply(1, w1, 10, **{C.LOCAL_STEPS_TAKEN: 2}),
                                          reply(2, w2, 30, **{C.LOCAL_STEPS_TAKEN: 6}),
                                          reply(3, [9.0, 9.0], 5, **{C.LOCAL_STEPS_TAKEN: 0})])
    expected = fednova_eq6([0.0, 0.0], [(w1, 10, 2), (w2, 30, 6)])
    np.testing.assert_allclose(numpy_of(arrays)["w"], expected, atol=1e-14)
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    assert len([r for r in caplog.records if "node 3" in r.getMessage()]) == 1


@pytest.mark.parametrize("metrics, kwargs", [
    ({C.LOCAL_STEPS_TAKEN: 0}, {}),
    ({}, {"local_epochs": 1, "batch_size": 8, "drop_last": True}),
    ({}, {"local_epochs": 0.1, "batch_size": 8}),  # floor(0.1 * 1) = 0
], ids=["reported", "derived-drop-last", "derived-fraction"])
def test_a_round_in_which_no_client_stepped_keeps_the_model(metrics, kwargs, caplog):
    s = nova(**kwargs)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = s.aggregate_train(1, [reply(node, [1.0, 1.0], 5, **metrics)
                                          for node in (1, 2, 3)])
    assert arrays is None
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 3
    assert any("global model is kept" in r.getMessage() for r in caplog.records)


def no_step_app(silent_partition: int) -> ClientApp:
    """A stock-like ClientApp (no local-steps) whose partition ``silent_partition`` has 3
    examples: with B = 8 and drop_last its loop takes no step and returns the model."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        n = 3 if pid == silent_partition else 16
        step = 0.0 if pid == silent_partition else 0.1 * (pid + 1) * 2  # 2 steps of 0.1 (pid+1)
        arrays = {k: v + step for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        return Message(RecordDict({C.ARRAYS: record(arrays),
                                   C.METRICS: MetricRecord({C.NUM_EXAMPLES: n})}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return client_info_reply(msg, partition_id=pid,
                                 num_examples=3 if pid == silent_partition else 16)

    return app


def test_fednova_runs_on_with_a_client_that_never_steps():
    # partitions 0 and 2 (n = 16, B = 8, E = 1, drop_last: 2 steps), partition 1 none
    strategy = FedNova(query_client_info=True, local_epochs=1, batch_size=8, drop_last=True,
                       fraction_evaluate=0.0)
    result = strategy.start(InProcessGrid(no_step_app(1), 3, {}), record({"w": np.zeros(1)}),
                            num_rounds=2, train_config=ConfigRecord({C.LR: 0.1}))
    w = np.zeros(1)
    for _ in range(2):
        w = fednova_eq6(w, [(w + 0.2, 16, 2), (w + 0.6, 16, 2)])
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], w, atol=1e-12)
    assert all(strategy.round_log(r)[C.LOG_CLIENTS_FAILED] == 1 for r in (1, 2))


@pytest.mark.parametrize("n, b, e, drop_last, expected", [
    (10, 8, 2, True, 2),  # floor(10 / 8) = 1 batch per epoch
    (5, 8, 2, True, 0),  # drop_last drops the only (short) batch: no step
    (10, 32, 2, True, 0),  # drop_last with n < B
    (10, 32, 2, False, 2),  # one short batch per epoch
    (100, 32, 0.3, False, 1),  # floor(0.3 * 4)
    (1, 32, 0.5, False, 0),  # floor(0.5 * 1)
    (100, 0, 3, False, 3),  # B = 0: one full batch per epoch
    (0, 8, 1, False, 0),
])
def test_stock_loop_steps_by_hand(n, b, e, drop_last, expected):
    assert stock_loop_steps(n, b, e, drop_last=drop_last) == expected


# ================================================================ the run-config keys
@pytest.mark.parametrize("user, read", [
    ({"strategy": "scaffold", "scaffold-num-clients": 7}, lambda a: a.clients.given == 7),
    ({"strategy": "feddyn", "feddyn-num-clients": 4}, lambda a: a.clients.given == 4),
    ({"strategy": "fedasync", "fedasync-fresh-staleness": 1}, lambda a: a.fresh_staleness == 1),
    ({"strategy": "fedasync"}, lambda a: a.fresh_staleness == 0),  # the authors' code
    ({"strategy": "scaffold"}, lambda a: a.clients.given == 0),
], ids=["scaffold-n", "feddyn-m", "fedasync-literal", "fedasync-default", "scaffold-default"])
def test_the_run_config_keys_reach_the_algorithms(user, read):
    from fedapp.config import RunConfig
    from fedapp.registry import build_strategy

    strategy, _ = build_strategy(RunConfig.from_user_config(user))
    assert read(strategy.algorithm)


@pytest.mark.parametrize("user", [{"strategy": "fedasync", "fedasync-fresh-staleness": 2},
                                  {"strategy": "scaffold", "scaffold-num-clients": -1},
                                  {"strategy": "feddyn", "feddyn-num-clients": -3}])
def test_a_bad_run_config_value_names_the_key_and_the_fix(user):
    from fedapp.config import ConfigError, RunConfig

    key, value = next((k, v) for k, v in user.items() if k != "strategy")
    with pytest.raises(ConfigError) as info:
        RunConfig.from_user_config(user)
    message = str(info.value)
    assert f"{key}={value!r}" in message and f'--run-config "{key}=0"' in message
