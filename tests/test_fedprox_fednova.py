"""Tests for FedNova's math, FedProx / FedNova strategies, stragglers and the registry.

* FedNova normalised averaging (``strategies.engine.averaging.fednova_*``) against numbers
  computed by hand and written here (FedVeca eq. 5, FedNova eq. 6; ARCHITECTURE.md's
  norms of a_i), and empirically against torch's SGD (momentum, proximal term);
* straggler helpers (``choose_stragglers``, ``straggler_steps``, ``steps_for_epochs``);
* the strategies on real Flower Messages, through the in-process Grid and a numpy-only
  ClientApp (no torch, no Ray);
* ``fedapp.registry.build_strategy`` for fedprox / fednova.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedapp.config import RunConfig
from fedapp.registry import build_strategy
from strategies import WEIGHTINGS, FedAvg, FedNova, FedProx
from strategies.engine import averaging as agg
from strategies.engine import sampling
from strategies import contract as C
from strategies.client import local_sgd
from task.models import ClassifierModule
from tests.inprocess import InProcessGrid
from tests.messages import instruction, numpy_of, prepared_round, record


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages can only be built inside a run; pretend to be the ServerApp task."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


# ================================================================ helpers


def reply(node_or_instr, values, n, **metrics) -> Message:
    """A train reply with arrays {"w": values} and metrics num-examples = n plus ``metrics``."""
    instr = node_or_instr if isinstance(node_or_instr, Message) else instruction(node_or_instr)
    content = RecordDict({
        C.ARRAYS: record({"w": np.asarray(values, dtype=np.float64)}),
        C.METRICS: MetricRecord({C.NUM_EXAMPLES: n, **metrics}),
    })
    return Message(content, reply_to=instr)


def fednova(global_arrays, clients, a_norms, weights, momentum_buffer=None, server_momentum=0.0):
    """One FedNova update over all clients through the run-time path (coefficients_fednova +
    fednova_update); returns the new model and the momentum buffer."""
    coefficients = agg.coefficients_fednova(weights, a_norms)
    new, buffer, used, _ = agg.fednova_update(global_arrays, enumerate(clients), coefficients,
                                              1.0, momentum_buffer, server_momentum)
    assert used == list(range(len(clients)))
    return new, buffer


def steps(k: int) -> dict:
    return {C.LOCAL_STEPS_TAKEN: k}


def nova(global_w, nodes, sent: dict[int, dict] | None = None, **kwargs) -> FedNova:
    """A FedNova in the state configure_train leaves behind."""
    s = FedNova(query_client_info=True, **kwargs)
    return prepared_round(s, {"w": np.asarray(global_w, dtype=np.float64)},
                          {n: dict((sent or {}).get(n, {})) for n in nodes})


def result_w(arrays: ArrayRecord) -> np.ndarray:
    return numpy_of(arrays)["w"]


def node_partition(grid: InProcessGrid, node: int) -> int:
    return int(grid.contexts[node].node_config["partition-id"])


# ---------------------------------------------------------------- numpy-only ClientApp
DELTA = 0.01  # a client moves every weight by DELTA * (partition id + 1) per local step


def _size(context: Context, pid: int) -> int:
    sizes = [int(s) for s in str(context.run_config.get("sizes", "")).split(",") if s]
    return sizes[pid] if sizes else 10 * (pid + 1)


def make_app(received: list | None = None) -> ClientApp:
    """Query: partition-id + num-examples. Train: w + DELTA (pid + 1) tau, tau the steps asked for.

    tau = ``local-steps`` if > 0, else floor(E n / B) (B = 0: E). ``received`` collects
    (partition id, config dict) of every train message.
    """
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({C.PARTITION_ID: pid, C.NUM_EXAMPLES: _size(context, pid)})
        return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        n = _size(context, pid)
        config = msg.content[C.CONFIG]
        if received is not None:
            received.append((pid, dict(config)))
        tau = int(config.get(C.LOCAL_STEPS, 0))
        if tau <= 0:
            e, b = int(config.get(C.LOCAL_EPOCHS, 1)), int(config.get(C.BATCH_SIZE, 0))
            tau = e if b <= 0 or b >= n else (e * n) // b
        arrays = {k: v + DELTA * (pid + 1) * tau for k,
                  v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.NUM_EXAMPLES: n, C.TRAIN_LOSS: float(pid),
                                C.LOCAL_STEPS_TAKEN: tau})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)

    return app


NODES_A = [1000 + 7919 * i for i in range(10)]
# descending: node order != partition order
NODES_B = [9_000_000_000 - 104_729 * i for i in range(10)]
NODES_C = [int(x) for x in np.random.default_rng(5).permutation(10**6)[:10] + 1]


# ================================================================ FedNova math (pure numpy)
def test_fednova_equal_a_is_fedavg_weighted_average():
    rng = np.random.default_rng(0)
    global_arrays = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)}
    clients = [{k: v + rng.normal(size=v.shape) for k,
                v in global_arrays.items()} for _ in range(4)]
    n = [10.0, 30.0, 5.0, 55.0]
    for a in (1.0, 3.0, 7.25):
        new, buffer = fednova(global_arrays, clients, [a] * 4, n)
        expected, _, _ = agg.streamed_update(global_arrays, enumerate(clients),
                                             agg.coefficients_by_examples(n))
        assert buffer is None
        for key in global_arrays:
            np.testing.assert_allclose(new[key], expected[key], rtol=1e-12, atol=1e-12)
            # and literally sum_k p_k w_k
            literal = sum(n_k / 100.0 * c[key] for n_k, c in zip(n, clients))
            np.testing.assert_allclose(new[key], literal, rtol=1e-12, atol=1e-12)


def test_fednova_two_clients_unequal_tau_equal_weights():
    # d1 = (0 - [1, 2]) / 1 = [-1, -2]; d2 = (0 - [3, 6]) / 4 = [-0.75, -1.5]
    # tau_eff = (1 + 4) / 2 = 2.5; w = 0 - 2.5 * ([-1.75, -3.5] / 2) = [2.1875, 4.375]
    new, _ = fednova({"w": np.zeros(2)}, [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}],
                                [1, 4], [1, 1])
    np.testing.assert_allclose(new["w"], [2.1875, 4.375], rtol=0, atol=1e-14)


def test_fednova_two_clients_unequal_tau_weights_one_to_three():
    # p = (0.25, 0.75); tau_eff = 0.25 * 1 + 0.75 * 4 = 3.25
    # sum p d = 0.25 [-1, -2] + 0.75 [-0.75, -1.5] = [-0.8125, -1.625]
    # w = 3.25 * [0.8125, 1.625] = [2.640625, 5.28125]; FedAvg would give [2.5, 5.0]
    new, _ = fednova({"w": np.zeros(2)}, [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}],
                                [1, 4], [10, 30])
    np.testing.assert_allclose(new["w"], [2.640625, 5.28125], rtol=0, atol=1e-14)


def test_fednova_nonzero_global_model():
    # w = [1, -1]; clients [2, 1] (a 1), [5, 7] (a 4); deltas [1, 2], [4, 8] -> /a: [1, 2], [1, 2]
    # tau_eff = 2.5, w' = w + 2.5 * [1, 2] = [3.5, 4]
    new, _ = fednova({"w": np.array([1.0, -1.0])},
                     [{"w": np.array([2.0, 1.0])}, {"w": np.array([5.0, 7.0])}], [1, 4], [2, 2])
    np.testing.assert_allclose(new["w"], [3.5, 4.0], rtol=0, atol=1e-14)


def test_fednova_norm_momentum_hand_computed():
    # a = [(1 - .5^3)/.5, (1 - .5^2)/.5, (1 - .5)/.5] = [1.75, 1.5, 1]
    assert agg.fednova_norm_momentum(3, 0.5) == pytest.approx(4.25, abs=1e-14)
    assert agg.fednova_norm_momentum(1, 0.9) == pytest.approx(1.0, abs=1e-14)
    # tau = 2, rho = 0.9: a = [1.9, 1] -> 2.9
    assert agg.fednova_norm_momentum(2, 0.9) == pytest.approx(2.9, abs=1e-14)


def test_fednova_norm_proximal_hand_computed():
    # alpha = 0.1: a = [0.81, 0.9, 1] -> 2.71
    assert agg.fednova_norm_proximal(3, 0.1, 1.0) == pytest.approx(2.71, abs=1e-14)
    assert agg.fednova_norm_proximal(3, 0.05, 2.0) == pytest.approx(2.71, abs=1e-14)
    assert agg.fednova_norm_proximal(1, 0.1, 1.0) == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("tau", [1, 2, 5, 17])
def test_fednova_norms_reduce_to_tau(tau):
    assert agg.fednova_norm_sgd(tau) == tau
    assert agg.fednova_norm_momentum(tau, 0.0) == tau
    assert agg.fednova_norm_proximal(tau, 0.1, 0.0) == tau
    assert agg.fednova_norm_proximal(tau, 0.0, 0.5) == tau
    # continuity at rho -> 0 and alpha -> 0
    assert agg.fednova_norm_momentum(tau, 1e-9) == pytest.approx(tau, rel=1e-7)
    assert agg.fednova_norm_proximal(tau, 1e-9, 1.0) == pytest.approx(tau, rel=1e-7)


@pytest.mark.parametrize("tau", [1, 2, 3, 10, 50])
@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.99])
def test_fednova_norm_momentum_closed_form_equals_sum(tau, rho):
    a = [(1 - rho ** (tau - j)) / (1 - rho) for j in range(tau)]
    assert agg.fednova_norm_momentum(tau, rho) == pytest.approx(sum(a), rel=1e-10)


@pytest.mark.parametrize("tau", [1, 2, 3, 10, 50])
@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.1, 0.5])
def test_fednova_norm_proximal_closed_form_equals_sum(tau, alpha):
    a = [(1 - alpha) ** (tau - 1 - j) for j in range(tau)]
    assert agg.fednova_norm_proximal(tau, alpha, 1.0) == pytest.approx(sum(a), rel=1e-10)
    assert agg.fednova_norm_proximal(tau, 0.1, alpha / 0.1) == pytest.approx(sum(a), rel=1e-10)


def test_fednova_server_momentum_two_rounds_hand_computed():
    # round 1: w = 0, clients [1] (a 1) and [3] (a 4), equal weights: plain FedNova -> 2.1875
    #          v = 0.5 * 0 + (0 - 2.1875) = -2.1875, w1 = 0 - v = 2.1875
    g0 = {"w": np.zeros(1)}
    w1, v1 = fednova(g0, [{"w": np.array([1.0])}, {"w": np.array([3.0])}], [1, 4], [1, 1],
                                momentum_buffer=None, server_momentum=0.5)
    np.testing.assert_allclose(w1["w"], [2.1875], atol=1e-14)
    np.testing.assert_allclose(v1["w"], [-2.1875], atol=1e-14)
    # round 2: w1 = 2.1875, clients w1 + 1 (a 1) and w1 + 4 (a 4): d = -1, -1 -> plain step 2.5
    #          v = 0.5 * (-2.1875) - 2.5 = -3.59375, w2 = 2.1875 + 3.59375 = 5.78125
    w2, v2 = fednova(w1, [{"w": np.array([3.1875])}, {"w": np.array([6.1875])}], [1, 4], [1, 1],
                                momentum_buffer=v1, server_momentum=0.5)
    np.testing.assert_allclose(w2["w"], [5.78125], atol=1e-14)
    np.testing.assert_allclose(v2["w"], [-3.59375], atol=1e-14)
    # without momentum round 2 would give 2.1875 + 2.5
    plain, none = fednova(w1, [{"w": np.array([3.1875])}, {"w": np.array([6.1875])}], [1, 4],
                          [1, 1])
    np.testing.assert_allclose(plain["w"], [4.6875], atol=1e-14)
    assert none is None


def test_fednova_integer_arrays_not_normalised_dtype_kept():
    # equal a: the weighted mean 0.25 * 110 + 0.75 * 130 = 125, never multiplied by tau_eff
    global_arrays = {"w": np.zeros(2, np.float32), "nbt": np.array([100], np.int64)}
    clients = [{"w": np.array([1.0, 2.0], np.float32), "nbt": np.array([110], np.int64)},
               {"w": np.array([3.0, 6.0], np.float32), "nbt": np.array([130], np.int64)}]
    new, _ = fednova(global_arrays, clients, [4, 4], [10, 30])
    assert new["w"].dtype == np.float32 and new["nbt"].dtype == np.int64
    np.testing.assert_allclose(new["w"], [2.5, 5.0])
    assert new["nbt"].tolist() == [125]
    # unequal a: still a rounded mean of the clients' values (not tau_eff-scaled), dtype kept
    new, buffer = fednova(global_arrays, clients, [1, 4], [1, 1], server_momentum=0.5)
    assert new["nbt"].dtype == np.int64 and 110 <= int(new["nbt"][0]) <= 130
    assert "nbt" not in buffer  # server momentum only on floating arrays
    np.testing.assert_allclose(new["w"], [2.1875, 4.375], rtol=1e-6)  # float32


def test_fednova_update_rejects_bad_inputs():
    g, c = {"w": np.zeros(1)}, [{"w": np.ones(1)}]
    for a_norms in ([0.0], [-1.0], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError):
            fednova(g, c, a_norms, [1.0])
    with pytest.raises(ValueError):
        fednova(g, c, [1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        agg.coefficients_fednova([], [])
    with pytest.raises(ValueError):
        fednova(g, c, [1.0], [0.0])


# ---------------------------------------------------------------- norms vs torch's SGD
class LinearLoss(ClassifierModule):
    """One float64 parameter w with loss g * w: a constant gradient g at every step."""

    def __init__(self, w0: float, g: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w0], dtype=torch.float64))
        self.g = g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(len(x))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.g * outputs.mean()


@pytest.mark.parametrize("tau", [1, 3, 8])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_momentum_norm_matches_torch_sgd_displacement(tau, rho):
    lr, g, w0 = 0.05, 1.7, 0.3
    w = torch.tensor([w0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=lr, momentum=rho)
    for _ in range(tau):
        opt.zero_grad()
        (g * w).sum().backward()
        opt.step()
    displacement = w0 - float(w.detach())
    assert displacement == pytest.approx(lr * g * agg.fednova_norm_momentum(tau, rho), rel=1e-12)
    # the project's own local solver does the same
    model = LinearLoss(w0, g)
    x, y = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64)
    result = local_sgd(model, x, y, lr=lr, batch_size=2, steps=tau, momentum=rho)
    assert result.local_steps == tau
    expected = lr * g * agg.fednova_norm_momentum(tau, rho)
    assert w0 - float(model.w.detach()) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tau", [1, 3, 8])
@pytest.mark.parametrize("mu", [0.0, 0.5, 4.0])
def test_proximal_norm_matches_local_sgd_displacement(tau, mu):
    # x_{t+1} = x_t - lr (g + mu x_t), x = w - w0: x_tau = -lr g sum_j (1 - lr mu)^j
    lr, g, w0 = 0.05, -2.3, 1.1
    w = w0
    for _ in range(tau):
        w -= lr * (g + mu * (w - w0))
    expected = lr * g * agg.fednova_norm_proximal(tau, lr, mu)
    assert w0 - w == pytest.approx(expected, rel=1e-12)
    model = LinearLoss(w0, g)
    x, y = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64)
    local_sgd(model, x, y, lr=lr, batch_size=2, steps=tau, proximal_mu=mu)
    assert w0 - float(model.w.detach()) == pytest.approx(expected, rel=1e-12)


def test_fednova_with_momentum_norms_recovers_average_gradient():
    # Clients with constant gradients g_i, momentum 0.9 and unequal tau_i: with the momentum
    # norm, d_i = lr g_i exactly, so w' = w - lr tau_eff sum p_i g_i (no objective inconsistency).
    lr, rho, w0 = 0.01, 0.9, 0.0
    gs, taus, n = [1.0, -0.5, 2.0], [2, 5, 11], [10.0, 20.0, 70.0]
    clients = []
    for g, tau in zip(gs, taus):
        model = LinearLoss(w0, g)
        local_sgd(model, torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64),
                             lr=lr, batch_size=4, steps=tau, momentum=rho)
        clients.append({"w": model.w.detach().numpy().copy()})
    a = [agg.fednova_norm_momentum(t, rho) for t in taus]
    new, _ = fednova({"w": np.array([w0])}, clients, a, n)
    p = np.asarray(n) / sum(n)
    tau_eff = float(np.dot(p, a))
    np.testing.assert_allclose(new["w"], [w0 - lr * tau_eff * float(np.dot(p, gs))], rtol=1e-10)


# ================================================================ step counts and stragglers
def test_steps_for_epochs_hand_computed():
    assert C.steps_for_epochs(100, 32, 2) == 6  # floor(200 / 32)
    assert C.steps_for_epochs(10, 8, 2) == 2
    assert C.steps_for_epochs(10, 0, 3) == 3  # full batch: E steps
    assert C.steps_for_epochs(10, 10, 3) == 3  # B >= n: E steps
    assert C.steps_for_epochs(10, 50, 3) == 3
    assert C.steps_for_epochs(0, 8, 3) == 0
    assert C.steps_for_epochs(10, 8, 0) == 0
    assert C.steps_for_epochs(3, 2, 1) == 1  # floor(1.5)


@pytest.mark.parametrize("m", [10, 7])
@pytest.mark.parametrize("fraction, expected", [(0.0, {10: 0, 7: 0}), (0.5, {10: 5, 7: 3}),
                                                (0.9, {10: 9, 7: 6}), (1.0, {10: 10, 7: 7})])
def test_choose_stragglers_count(m, fraction, expected):
    for seed in range(5):
        mask = sampling.choose_stragglers(np.random.default_rng([seed, 1, 1]), m, fraction)
        assert mask.dtype == bool and mask.shape == (m,)
        assert int(mask.sum()) == expected[m] == math.floor(fraction * m)


def test_choose_stragglers_deterministic_and_varies_with_seed():
    masks = [sampling.choose_stragglers(np.random.default_rng([s, 2, 1]), 10,
                                        0.5).tolist() for s in range(8)]
    again = [sampling.choose_stragglers(np.random.default_rng([s, 2, 1]), 10,
                                        0.5).tolist() for s in range(8)]
    assert masks == again
    assert len({tuple(m) for m in masks}) > 1


def test_straggler_steps_range_and_uniformity():
    rng = np.random.default_rng(42)
    full = [1, 5, 10]
    draws = np.array([sampling.straggler_steps(rng, full) for _ in range(6000)])
    assert draws.shape == (6000, 3)
    assert (draws[:, 0] == 1).all()
    for col, f in ((1, 5), (2, 10)):
        assert draws[:, col].min() == 1 and draws[:, col].max() == f
        freq = np.bincount(draws[:, col], minlength=f + 1)[1:] / len(draws)
        np.testing.assert_allclose(freq, 1.0 / f, atol=0.03)
    # a full count of 0 (no data) still gives one step
    assert sampling.straggler_steps(np.random.default_rng(0), [0]).tolist() == [1]
    # deterministic for the rng seed
    assert (sampling.straggler_steps(np.random.default_rng(7), [9, 9, 9]).tolist()
            == sampling.straggler_steps(np.random.default_rng(7), [9, 9, 9]).tolist())


# ================================================================ stragglers in FedAvg
def configure(strategy, grid, rnd, config=None):
    return list(strategy.configure_train(rnd, record({"w": np.zeros(2)}),
                                         config if config is not None else ConfigRecord(), grid))


@pytest.mark.parametrize("fraction_train, sampled, stragglers",
                         [(1.0, 10, 5), (0.7, 7, 3), (0.3, 3, 1)])
def test_drop_policy_sends_nothing_to_stragglers(fraction_train, sampled, stragglers):
    grid = InProcessGrid(make_app(), 10, {})
    s = FedAvg(query_client_info=True, fraction_train=fraction_train, straggler_fraction=0.5,
               straggler_policy="drop", seed=3)
    for rnd in (1, 2, 3):
        messages = configure(s, grid, rnd)
        sent = {m.metadata.dst_node_id for m in messages}
        assert len(messages) == sampled - stragglers
        plan = s.plans[rnd]
        assert len(plan.straggler_work) == stragglers
        assert sent.isdisjoint(plan.straggler_work)
        assert sent == set(plan.tasks)
        diag = s.round_log(rnd)
        assert diag[C.LOG_CLIENTS_SAMPLED] == sampled
        assert diag[C.LOG_CLIENTS_STRAGGLERS] == stragglers
        assert diag[C.LOG_CLIENTS_DROPPED] == stragglers
        # the drop policy leaves the config alone
        assert all(C.LOCAL_STEPS not in m.content[C.CONFIG] for m in messages)


def test_drop_policy_failed_count_excludes_dropped():
    grid = InProcessGrid(make_app(), 10, {})
    s = FedAvg(query_client_info=True, straggler_fraction=0.5, straggler_policy="drop", seed=3)
    result = s.start(grid, record({"w": np.zeros(2)}), num_rounds=1)
    assert result.arrays is not None
    assert s.round_log(1)[C.LOG_CLIENTS_RECEIVED] == 5
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 0


def straggler_partitions(node_ids, seed, policy="drop", rounds=5, fraction_train=0.6):
    grid = InProcessGrid(make_app(), len(node_ids), {}, node_ids=node_ids)
    s = FedAvg(query_client_info=True, fraction_train=fraction_train, straggler_fraction=0.5,
               straggler_policy=policy, seed=seed)
    out = []
    for rnd in range(1, rounds + 1):
        configure(s, grid, rnd, ConfigRecord({C.LOCAL_STEPS: 50}))
        out.append(tuple(sorted((node_partition(grid, n), w) for n, w in s.plans[rnd].straggler_work.items())))
    return out


@pytest.mark.parametrize("policy", ["drop", "partial"])
def test_stragglers_independent_of_node_ids(policy):
    a = straggler_partitions(NODES_A, seed=7, policy=policy)
    assert a == straggler_partitions(NODES_B, seed=7, policy=policy)
    assert a == straggler_partitions(NODES_C, seed=7, policy=policy)
    assert len(set(a)) > 1  # different across rounds
    assert a != straggler_partitions(NODES_A, seed=8, policy=policy)
    assert all(len(r) == 3 for r in a)  # floor(0.5 * 6)


def test_no_stragglers_by_default():
    grid = InProcessGrid(make_app(), 4, {})
    s = FedAvg(query_client_info=True)
    messages = configure(s, grid, 1, ConfigRecord({C.LOCAL_STEPS: 5}))
    assert len(messages) == 4 and s.plans[1].straggler_work == {}
    assert s.round_log(1)[C.LOG_CLIENTS_STRAGGLERS] == 0
    assert s.round_log(1)[C.LOG_CLIENTS_DROPPED] == 0


SIZES = "10,20,30,40,50,60,70,80,90,100"


@pytest.mark.parametrize("cls", [FedAvg, FedProx, FedNova])
def test_partial_policy_epochs_config(cls):
    # E = 2, B = 8: full tau_i = floor(2 n_i / 8) = 2, 5, 7, 10, 12, 15, 17, 20, 22, 25
    full = {pid: (2 * 10 * (pid + 1)) // 8 for pid in range(10)}
    assert [full[p] for p in range(10)] == [2, 5, 7, 10, 12, 15, 17, 20, 22, 25]
    grid = InProcessGrid(make_app(), 10, {"sizes": SIZES})
    s = cls(straggler_fraction=0.5, straggler_policy="partial", seed=11)
    config = ConfigRecord({C.LR: 0.1, C.LOCAL_EPOCHS: 2, C.BATCH_SIZE: 8, C.LOCAL_STEPS: 0})
    seen = []
    for rnd in range(1, 9):
        messages = configure(s, grid, rnd, config)
        assert len(messages) == 10
        assert s.round_log(rnd)[C.LOG_CLIENTS_STRAGGLERS] == 5
        assert s.round_log(rnd)[C.LOG_CLIENTS_DROPPED] == 0
        for m in messages:
            node = m.metadata.dst_node_id
            sent = m.content[C.CONFIG]
            assert sent[C.LR] == pytest.approx(0.1) and sent[C.SERVER_ROUND] == rnd
            work = s.plans[rnd].straggler_work
            if node in work:
                pid = node_partition(grid, node)
                assert 1 <= sent[C.LOCAL_STEPS] == work[node] <= full[pid]
                assert sent is not config
                seen.append((sent[C.LOCAL_STEPS], full[pid]))
            else:
                assert sent[C.LOCAL_STEPS] == 0
        # the shared record never carries a straggler's steps
        assert config[C.LOCAL_STEPS] == 0
    assert any(k < f for k, f in seen)  # partial work happens
    assert any(k == 1 for k, _ in seen)


def test_partial_policy_local_steps_config_and_clients_receive_it():
    received = []
    grid = InProcessGrid(make_app(received), 10, {"sizes": SIZES})
    s = FedAvg(query_client_info=True, straggler_fraction=0.9, straggler_policy="partial", seed=2)
    config = ConfigRecord({C.LOCAL_STEPS: 6, C.LOCAL_EPOCHS: 100, C.BATCH_SIZE: 1})
    result = s.start(grid, record({"w": np.zeros(2)}), num_rounds=3, train_config=config)
    assert result.arrays is not None
    assert config[C.LOCAL_STEPS] == 6
    assert len(received) == 30
    by_round = [received[i:i + 10] for i in (0, 10, 20)]
    for rnd, got in enumerate(by_round, 1):
        steps_taken = sorted(c[C.LOCAL_STEPS] for _, c in got)
        assert all(c[C.SERVER_ROUND] == rnd for _, c in got)
        assert sum(1 for k in steps_taken if k <= 6) == 10 and all(k >= 1 for k in steps_taken)
        assert s.round_log(rnd)[C.LOG_CLIENTS_STRAGGLERS] == 9
        assert sorted(s.round_log(rnd)["local-steps"]) == steps_taken
    # the last round's stragglers got exactly the steps the strategy assigned
    last = {pid: c[C.LOCAL_STEPS] for pid, c in by_round[-1]}
    for node, work in s.plans[3].straggler_work.items():
        assert last[node_partition(grid, node)] == work
    stragglers = {node_partition(grid, n) for n in s.plans[3].straggler_work}
    non_stragglers = [pid for pid in last if pid not in stragglers]
    assert len(non_stragglers) == 1 and last[non_stragglers[0]] == 6


def test_full_local_steps_unknown_size_falls_back_to_epochs():
    s = FedAvg(query_client_info=True)
    assert s.work.full_local_steps(123, ConfigRecord({C.LOCAL_EPOCHS: 3, C.BATCH_SIZE: 8})) == 3
    assert s.work.full_local_steps(123, ConfigRecord({C.LOCAL_STEPS: 4, C.LOCAL_EPOCHS: 3})) == 4


@pytest.mark.parametrize("policy", ["sometimes", ""])
def test_unknown_straggler_policy_raises(policy):
    with pytest.raises(ValueError, match="straggler_policy"):
        FedAvg(straggler_policy=policy)
    with pytest.raises(ValueError, match="straggler_fraction"):
        FedAvg(straggler_fraction=1.5)


# ================================================================ FedProx
def test_fedprox_sends_mu_in_every_train_config():
    received = []
    grid = InProcessGrid(make_app(received), 6, {})
    s = FedProx(query_client_info=True, proximal_mu=0.05, fraction_train=0.5,
                straggler_fraction=0.5, seed=4)
    assert s.participation.straggler_policy == "partial"
    s.start(grid, record({"w": np.zeros(2)}), num_rounds=2,
            train_config=ConfigRecord({C.LR: 0.1, C.LOCAL_STEPS: 4}))
    assert len(received) == 6  # 3 per round, stragglers included
    assert all(c[C.PROXIMAL_MU] == pytest.approx(0.05) for _, c in received)
    assert any(c[C.LOCAL_STEPS] < 4 for _, c in received)  # a straggler's copy carries mu too


def test_fedprox_rejects_negative_mu():
    with pytest.raises(ValueError, match="proximal_mu"):
        FedProx(proximal_mu=-0.1)
    assert FedAvg().participation.straggler_policy == "drop"
    assert FedProx().participation.straggler_policy == "partial"
    assert FedNova().participation.straggler_policy == "partial"


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_fedprox_mu0_bit_identical_to_fedavg(weighting):
    def run(strategy):
        grid = InProcessGrid(make_app(), 6, {"sizes": "10,20,35,5,60,15"})
        init = record({"w": np.array([0.3, -1.7]), "b": np.arange(3, dtype=np.float32)})
        return strategy.start(grid, init, num_rounds=2,
                              train_config=ConfigRecord({C.LOCAL_EPOCHS: 2, C.BATCH_SIZE: 4}))

    kwargs = dict(weighting=weighting, fraction_train=0.5, seed=9, straggler_fraction=0.5,
                  query_client_info=True,
                  straggler_policy="partial")
    avg = run(FedAvg(**kwargs))
    prox = run(FedProx(proximal_mu=0.0, **kwargs))
    for key in ("w", "b"):
        a, b = numpy_of(avg.arrays)[key], numpy_of(prox.arrays)[key]
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_fedprox_runs_with_every_weighting(weighting):
    received = []
    grid = InProcessGrid(make_app(received), 5, {})
    s = FedProx(query_client_info=True, proximal_mu=0.1, weighting=weighting, fraction_train=0.6,
                seed=1, straggler_fraction=0.4)
    result = s.start(grid, record({"w": np.zeros(2)}), num_rounds=1,
                     train_config=ConfigRecord({C.LOCAL_STEPS: 3}))
    w = result_w(result.arrays)
    assert np.isfinite(w).all() and (w > 0).all()
    assert received and all(c[C.PROXIMAL_MU] == pytest.approx(0.1) for _, c in received)
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 0


def test_fedprox_aggregate_on_same_replies_equals_fedavg():
    def prepared(cls, **kw):
        return prepared_round(cls(weighting="examples", **kw), {"w": np.zeros(2)},
                              {1: {}, 2: {}})

    replies = [reply(1, [1.0, 2.0], 10, **steps(1)), reply(2, [3.0, 6.0], 30, **steps(4))]
    a, _ = prepared(FedAvg).aggregate_train(1, replies)
    b, _ = prepared(FedProx, proximal_mu=0.0).aggregate_train(1, replies)
    c, _ = prepared(FedProx, proximal_mu=1.0).aggregate_train(1, replies)
    assert result_w(a).tobytes() == result_w(b).tobytes() == result_w(c).tobytes()
    np.testing.assert_allclose(result_w(a), [2.5, 5.0])


# ================================================================ FedNova strategy
def test_fednova_aggregate_hand_computed_equal_weights():
    s = nova([0.0, 0.0], [1, 2])
    arrays, metrics = s.aggregate_train(1, [reply(1, [1.0, 2.0], 10, **steps(1)),
                                            reply(2, [3.0, 6.0], 10, **steps(4))])
    np.testing.assert_allclose(result_w(arrays), [2.1875, 4.375], atol=1e-14)
    diag = s.round_log(1)
    assert diag[C.LOG_TAU_EFF] == pytest.approx(2.5)
    assert diag[C.LOG_A_NORMS] == [1.0, 4.0]
    assert diag["local-steps"] == [1, 4]
    assert diag[C.LOG_CLIENTS_RECEIVED] == 2 and diag[C.LOG_CLIENTS_FAILED] == 0
    assert metrics[C.NUM_EXAMPLES] == pytest.approx(20.0)


def test_fednova_aggregate_hand_computed_weights_one_to_three():
    s = nova([0.0, 0.0], [1, 2])
    arrays, _ = s.aggregate_train(3, [reply(1, [1.0, 2.0], 10, **steps(1)),
                                      reply(2, [3.0, 6.0], 30, **steps(4))])
    np.testing.assert_allclose(result_w(arrays), [2.640625, 5.28125], atol=1e-14)
    assert s.round_log(3)[C.LOG_TAU_EFF] == pytest.approx(3.25)


def test_fednova_equal_steps_equals_fedavg_strategy():
    replies = [reply(1, [1.0, 2.0], 10, **steps(3)), reply(2, [3.0, 6.0], 30, **steps(3))]
    s = nova([0.0, 0.0], [1, 2])
    arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0], atol=1e-14)


def test_fednova_momentum_sent_uses_momentum_norm():
    grid = InProcessGrid(make_app(), 2, {})
    s = FedNova(query_client_info=True, steps_reported=True)  # the replies carry local-steps
    messages = configure(s, grid, 1, ConfigRecord({C.LR: 0.1, C.MOMENTUM: 0.5}))
    assert all(s.plans[1].sent(m.metadata.dst_node_id)[C.MOMENTUM] == 0.5 for m in messages)
    by_pid = {node_partition(grid, m.metadata.dst_node_id): m for m in messages}
    # tau 3, rho 0.5: a = 4.25 (1.75 + 1.5 + 1); tau 1: a = 1
    # d1 = -4.25 / 4.25 = -1, d2 = -2 / 1 = -2; tau_eff = (4.25 + 1) / 2 = 2.625; w = 2.625 * 1.5
    replies = [reply(by_pid[0], [4.25], 10, **steps(3)), reply(by_pid[1], [2.0], 10, **steps(1))]
    s.plans[1].arrays = record({"w": np.zeros(1)})
    arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [3.9375], atol=1e-14)
    assert s.round_log(1)[C.LOG_A_NORMS] == [4.25, 1.0]
    assert s.round_log(1)[C.LOG_TAU_EFF] == pytest.approx(2.625)


def test_fednova_proximal_sent_uses_proximal_norm():
    s = nova([0.0], [1, 2],
             sent={1: {C.LR: 0.1, C.PROXIMAL_MU: 1.0}, 2: {C.LR: 0.1, C.PROXIMAL_MU: 1.0}})
    # tau 3, alpha 0.1: a = 2.71; tau 1: a = 1
    s.aggregate_train(1, [reply(1, [2.71], 10, **steps(3)), reply(2, [1.0], 10, **steps(1))])
    assert s.round_log(1)[C.LOG_A_NORMS] == [2.71, 1.0]
    assert s.round_log(1)[C.LOG_TAU_EFF] == pytest.approx(1.855)


def test_fednova_reported_a_norm_used_directly():
    s = nova([0.0, 0.0], [1, 2], sent={1: {C.MOMENTUM: 0.9}})
    # client 1 reports a-norm 4 although it took 1 step (with momentum): its a is 4, not 1 or 1.0
    arrays, _ = s.aggregate_train(1, [reply(1, [3.0, 6.0], 10, **steps(1), **{C.A_NORM: 4.0}),
                                      reply(2, [1.0, 2.0], 10, **steps(1))])
    np.testing.assert_allclose(result_w(arrays), [2.1875, 4.375], atol=1e-14)
    assert s.round_log(1)[C.LOG_A_NORMS] == [4.0, 1.0]


def test_fednova_stock_replies_derive_tau_and_warn_once(caplog):
    # FedNova(local_epochs=2, batch_size=8), a stock DataLoader loop (drop_last=False):
    # n = 10 -> tau = 2 ceil(10 / 8) = 4, n = 30 -> 2 ceil(30 / 8) = 8
    # d1 = -[4, 4] / 4 = [-1, -1]; d2 = -[8, 16] / 8 = [-1, -2]; p = (0.25, 0.75)
    # tau_eff = 0.25 * 4 + 0.75 * 8 = 7; w = 7 * [1, 1.75] = [7, 12.25]
    s = nova([0.0, 0.0], [1, 2], local_epochs=2, batch_size=8)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for rnd in (1, 2, 3):
            s.plan.arrays = record({"w": np.zeros(2)})
            arrays, _ = s.aggregate_train(rnd,
                                          [reply(1, [4.0, 4.0], 10), reply(2, [8.0, 16.0], 30)])
            np.testing.assert_allclose(result_w(arrays), [7.0, 12.25], atol=1e-14)
            assert s.round_log(rnd)[C.LOG_A_NORMS] == [4.0, 8.0]
            assert "local-steps" not in s.round_log(rnd)
    warnings = [r for r in caplog.records
                if r.levelno == logging.WARNING and "FedNova" in r.getMessage()]
    assert len(warnings) == 1
    assert C.LOCAL_STEPS_TAKEN in warnings[0].getMessage()
    assert "strategies.client.report_local_steps" in warnings[0].getMessage()


def test_fednova_stock_replies_drop_last_floor():
    # drop_last=True: n = 10 -> 2 floor(10 / 8) = 2, n = 30 -> 2 floor(30 / 8) = 6
    # tau_eff = 0.25 * 2 + 0.75 * 6 = 5; w = 5 * [1, 1.75] = [5, 8.75]
    s = nova([0.0, 0.0], [1, 2], local_epochs=2, batch_size=8, drop_last=True)
    arrays, _ = s.aggregate_train(1, [reply(1, [2.0, 2.0], 10), reply(2, [6.0, 12.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [5.0, 8.75], atol=1e-14)
    assert s.round_log(1)[C.LOG_A_NORMS] == [2.0, 6.0]


@pytest.mark.parametrize("sent, kwargs", [
    ({C.LOCAL_EPOCHS: 2}, {}),  # no B anywhere
    ({C.BATCH_SIZE: 8}, {}),  # no E anywhere
    ({}, {"local_epochs": 1}),
])
def test_fednova_stock_reply_without_batch_size_is_an_error_naming_the_fix(sent, kwargs):
    s = nova([0.0], [1, 2], sent={1: sent, 2: sent}, **kwargs)
    with pytest.raises(ValueError) as info:
        s.aggregate_train(1, [reply(1, [1.0], 10), reply(2, [1.0], 10)])
    message = str(info.value)
    for part in ("batch_size", "local_epochs", "strategies.client.report_local_steps",
                 C.BATCH_SIZE, C.LOCAL_EPOCHS):
        assert part in message


def test_fednova_reported_steps_need_no_batch_size():
    s = nova([0.0], [1, 2])
    s.aggregate_train(1, [reply(1, [1.0], 10, **steps(2)), reply(2, [1.0], 10, **steps(3))])
    assert s.round_log(1)[C.LOG_A_NORMS] == [2.0, 3.0]


def test_fednova_stock_reply_uses_sent_config_when_not_given():
    # no local_epochs/batch_size on FedNova: E and B from the config sent to that node;
    # node 2 was a straggler sent local-steps 3
    s = nova([0.0], [1, 2], sent={1: {C.LOCAL_EPOCHS: 3, C.BATCH_SIZE: 0}, 2: {C.LOCAL_STEPS: 3}})
    s.aggregate_train(1, [reply(1, [1.0], 10), reply(2, [1.0], 10)])
    assert s.round_log(1)[C.LOG_A_NORMS] == [3.0, 3.0]


def test_fednova_nan_reply_rejected_others_aggregated(caplog):
    s = nova([0.0, 0.0], [1, 2, 3])
    replies = [reply(1, [1.0, 2.0], 10, **steps(1)), reply(3, [np.nan, 1.0], 10, **steps(2)),
               reply(2, [3.0, 6.0], 10, **steps(4))]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [2.1875, 4.375], atol=1e-14)
    assert s.round_log(1)[C.LOG_TAU_EFF] == pytest.approx(2.5)
    assert s.round_log(1)[C.LOG_CLIENTS_RECEIVED] == 2
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and "node 3" in rejected[0].getMessage()


def test_fednova_a_norms_diagnostic_excludes_rejected_reply():
    s = nova([0.0, 0.0], [1, 2, 3])
    replies = [reply(1, [1.0, 2.0], 10, **steps(1)), reply(3, [np.nan, 1.0], 10, **steps(2)),
               reply(2, [3.0, 6.0], 10, **steps(4))]
    s.aggregate_train(1, replies)
    assert s.round_log(1)[C.LOG_A_NORMS] == [1.0, 4.0]  # aligned with 'local-steps' [1, 4]


@pytest.mark.parametrize("bad", [{C.LOCAL_STEPS_TAKEN: 0}, {C.LOCAL_STEPS_TAKEN: -2},
                                 {C.A_NORM: 0.0}, {C.A_NORM: -1.0}, {C.A_NORM: float("nan")}],
                         ids=["steps-0", "steps-neg", "a-norm-0", "a-norm-neg", "a-norm-nan"])
def test_fednova_bad_tau_or_a_norm_reply_rejected(bad, caplog):
    s = nova([0.0, 0.0], [1, 2, 3])
    replies = [reply(1, [1.0, 2.0], 10, **steps(1)), reply(2, [3.0, 6.0], 10, **steps(4)),
               reply(3, [9.0, 9.0], 10, **bad)]
    with caplog.at_level(logging.WARNING, logger="flwr"), np.errstate(all="ignore"):
        arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [2.1875, 4.375], atol=1e-14)
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1


def test_fednova_server_momentum_across_rounds():
    # one client per round, tau 1: the plain FedNova step is the client's model
    # r1: w 0 -> client 2: v = -2, w = 2;  r2: client 3: v = 0.5 * -2 - 1 = -2, w = 4;
    # r3: client 4 (no move): v = -1, w = 5
    s = nova([0.0], [1], server_momentum=0.5)
    w = np.zeros(1)
    for rnd, client, expected in ((1, 2.0, 2.0), (2, 3.0, 4.0), (3, 4.0, 5.0)):
        s.plan.arrays = record({"w": w})
        arrays, _ = s.aggregate_train(rnd, [reply(1, [client], 10, **steps(1))])
        w = result_w(arrays)
        np.testing.assert_allclose(w, [expected], atol=1e-14)
    np.testing.assert_allclose(s.algorithm.momentum_buffer["w"], [-1.0], atol=1e-14)


def test_fednova_full_run_with_fake_client_app():
    # The fake client moves w by DELTA (pid + 1) tau_i; FedNova divides by tau_i, so a round moves
    # w by tau_eff * DELTA * sum_i p_i (pid_i + 1) whatever the stragglers' tau_i are.
    grid = InProcessGrid(make_app(), 4, {"sizes": "10,20,30,40"})
    s = FedNova(query_client_info=True, straggler_fraction=0.5, seed=5)
    w = np.array([1.0, -1.0])
    config = ConfigRecord({C.LOCAL_EPOCHS: 2, C.BATCH_SIZE: 4})
    for rnd in (1, 2):
        replies = grid.send_and_receive(s.configure_train(rnd, record({"w": w}), config, grid))
        arrays, _ = s.aggregate_train(rnd, replies)
        taus = s.round_log(rnd)["local-steps"]
        assert s.round_log(rnd)[C.LOG_CLIENTS_STRAGGLERS] == 2
        p = np.array([10, 20, 30, 40]) / 100
        tau_eff = float(np.dot(p, taus))  # replies come back in partition order
        assert s.round_log(rnd)[C.LOG_TAU_EFF] == pytest.approx(tau_eff)
        expected = w + tau_eff * DELTA * float(np.dot(p, [1, 2, 3, 4]))
        np.testing.assert_allclose(result_w(arrays), expected, rtol=1e-12)
        w = result_w(arrays)
    assert C.LOCAL_STEPS not in config  # stragglers' steps went to copies


def test_fednova_constructor_checks():
    with pytest.raises(ValueError, match="weighting"):
        FedNova(weighting="uniform")
    for bad in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="server_momentum"):
            FedNova(server_momentum=bad)
    assert FedNova(weighting="examples", server_momentum=0.9).algorithm.server_momentum == 0.9


# ================================================================ registry
def build(**user):
    return build_strategy(RunConfig.from_user_config(user))


def test_registry_fedprox():
    s, config = build(**{"strategy": "fedprox", "proximal-mu": 0.3, "straggler-fraction": 0.5,
                         "weighting": "uniform", "server-lr": 0.5, "seed": 4})
    assert type(s) is FedProx
    assert s.algorithm.proximal_mu == pytest.approx(0.3)
    assert s.participation.straggler_policy == "partial" and s.participation.straggler_fraction == 0.5
    assert s.weighting == "uniform" and s.server_lr == 0.5 and s.participation.seed == 4
    assert config[C.LR] == pytest.approx(0.1)


def test_registry_fednova():
    s, config = build(**{"strategy": "fednova", "server-momentum": 0.4, "local-epochs": 3,
                         "batch-size": 16})
    assert type(s) is FedNova
    assert s.algorithm.server_momentum == pytest.approx(0.4)
    # E and B of a client that reports no local-steps: the ones each message is sent
    assert s.algorithm.local_epochs is None and s.algorithm.batch_size is None
    assert s.participation.straggler_policy == "partial"
    assert config[C.LOCAL_EPOCHS] == 3 and config[C.BATCH_SIZE] == 16
    s, config = build(**{"strategy": "fednova", "full-batch": True})
    assert config[C.BATCH_SIZE] == 0


@pytest.mark.parametrize("strategy, expected", [("fedavg", "drop"), ("fedsgd", "drop"),
                                                ("fedprox", "partial"), ("fednova", "partial")])
def test_registry_straggler_policy_auto(strategy, expected):
    s, _ = build(strategy=strategy)
    assert s.participation.straggler_policy == expected
    for explicit in ("drop", "partial"):
        s, _ = build(**{"strategy": strategy, "straggler-policy": explicit})
        assert s.participation.straggler_policy == explicit


def test_fednova_server_lr_applied_or_rejected():
    try:
        s = nova([0.0, 0.0], [1, 2], server_lr=0.5)
    except ValueError as err:  # rejecting it with a clear error is fine too
        assert "server_lr" in str(err)
        return
    arrays, _ = s.aggregate_train(1, [reply(1, [1.0, 2.0], 10, **steps(1)),
                                      reply(2, [3.0, 6.0], 10, **steps(4))])
    np.testing.assert_allclose(result_w(arrays), [1.09375, 2.1875],
                               atol=1e-14)  # half of [2.1875, 4.375]


def test_fednova_with_flowers_call_and_a_stock_client_stops_before_any_training():
    """Flower's quickstart: FedNova(fraction_train=...), train config {lr} only: tau_i of a
    stock client cannot be derived, so round 1 sends nothing and says the one change (#58:
    it trained round 1, then stopped on 'replies carry no local-steps')."""
    grid = InProcessGrid(make_app(), 2, {})
    with pytest.raises(ValueError, match=r"Before any training, give one: FedNova\(\.\.\., "
                                         r"local_epochs=E, batch_size=B\).*steps_reported=True"):
        configure(FedNova(1.0, 0.0), grid, 1, ConfigRecord({C.LR: 0.01}))
    assert not [call for call in grid.calls if call[1] == "train"]
    for ok in (FedNova(1.0, 0.0, local_epochs=1, batch_size=32),
               FedNova(1.0, 0.0, steps_reported=True)):
        assert configure(ok, grid, 1, ConfigRecord({C.LR: 0.01}))
    assert configure(FedNova(1.0, 0.0), grid, 1, ConfigRecord({C.LR: 0.01, C.LOCAL_STEPS: 5}))
