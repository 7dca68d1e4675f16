"""Tests for strategies.FedVeca on real Flower Messages (no torch, no Ray).

* the round timeline of FedVeca's Alg. 1 through the in-process Grid and a
  numpy-only ClientApp whose beta / delta are set per partition;
* eq. (5) aggregation (FedNova's rule) and eq. (8) global gradient, hand-computed;
* rejection of malformed replies, one log line per reply, naming the node;
* partial participation: p_i over the participants, non-participants keep their tau;
* the guards through the strategy, state_dict / load_state_dict, diagnostics, registry.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from fedapp.config import RunConfig
from fedapp.registry import build_strategy
from strategies import FedNova, FedVeca
from strategies import contract as C
from strategies.engine.records import ClientContractError, ClientInfo
from tests.inprocess import InProcessGrid
from tests.messages import instruction, numpy_of, record, prepared_round


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


STEP = 0.01  # the fake client moves every weight by STEP * (pid + 1) per local step
SIZES = [10, 20, 30, 40]
# A_i = eta beta_i^2 delta_i; with delta = 1 the ratios r_i = beta_i^2 / beta_0^2 are
# 1, 1.05, 1.2, 2.0
BETA2 = [1.0, 1.05, 1.2, 2.0]
ADAPTIVE = [20, 10, 4, 2]  # eq. (15) at alpha = 0.95 for those ratios


def fake_app(received: list | None = None, beta2=BETA2) -> ClientApp:
    """Query: partition-id, num-examples. Train: w + STEP (pid + 1) tau, grad = (pid + 1)
    everywhere, beta = sqrt(beta2[pid]), delta = 1 / gnorm2-prev (only the ratios of A matter)."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({C.PARTITION_ID: pid, C.NUM_EXAMPLES: SIZES[pid]})
        return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content[C.CONFIG]
        if received is not None:
            received.append((pid, dict(config)))
        tau = int(config[C.LOCAL_STEPS])
        w = numpy_of(msg.content[C.ARRAYS])
        arrays = {k: v + STEP * (pid + 1) * tau for k, v in w.items()}
        grad = {k: np.full_like(v, float(pid + 1)) for k, v in w.items()}
        metrics = {C.NUM_EXAMPLES: SIZES[pid], C.LOCAL_STEPS_TAKEN: tau, C.TRAIN_LOSS: 1.0}
        if config[C.FEDVECA_ESTIMATE]:
            metrics[C.BETA] = math.sqrt(beta2[pid])
            metrics[C.DELTA] = 1.0 / float(config[C.GNORM2_PREV])
        content = RecordDict({C.ARRAYS: record(arrays), C.GRAD: record(grad),
                              C.METRICS: MetricRecord(metrics)})
        return Message(content, reply_to=msg)

    return app


def run_rounds(strategy: FedVeca, grid: InProcessGrid, rounds: int, w=None, lr: float = 0.01):
    w = np.array([1.0, -1.0]) if w is None else w
    for rnd in range(1, rounds + 1):
        config = ConfigRecord({C.LR: lr, C.BATCH_SIZE: 8, C.LOCAL_STEPS: 0})
        messages = strategy.configure_train(rnd, record({"w": w}), config, grid)
        replies = grid.send_and_receive(messages)
        arrays, _ = strategy.aggregate_train(rnd, replies)
        if arrays is not None:
            w = numpy_of(arrays)["w"]
    return w


def by_round(received: list, num_nodes: int) -> list[dict[int, dict]]:
    """[{pid: config}] per round, in the order the messages went out."""
    rounds = []
    for i in range(0, len(received), num_nodes):
        rounds.append({pid: cfg for pid, cfg in received[i:i + num_nodes]})
    return rounds


# ================================================================ timeline (Alg. 1)
def test_round_timeline_tau_init_twice_then_adaptive():
    received = []
    grid = InProcessGrid(fake_app(received), 4, {})
    s = FedVeca(query_client_info=True, tau_init=20, alpha=0.95, seed=1)
    run_rounds(s, grid, 4)
    rounds = by_round(received, 4)
    p = np.array(SIZES) / sum(SIZES)
    gnorm2 = 2 * float(np.dot(p, [1, 2, 3, 4])) ** 2  # ||sum_i p_i (pid + 1) 1||^2, 2 coordinates
    # k = 0 (server round 1): tau_init, nothing to normalise delta by, no estimates
    assert {pid: c[C.LOCAL_STEPS] for pid, c in rounds[0].items()} == {0: 20, 1: 20, 2: 20, 3: 20}
    assert all(c[C.FEDVECA_ESTIMATE] is False and c[C.GNORM2_PREV] == 0.0
               for c in rounds[0].values())
    # k = 1: still tau_init; estimates asked for, delta normalised by ||grad F(w_0)||^2
    assert {pid: c[C.LOCAL_STEPS] for pid, c in rounds[1].items()} == {0: 20, 1: 20, 2: 20, 3: 20}
    assert all(c[C.FEDVECA_ESTIMATE] is True for c in rounds[1].values())
    assert all(c[C.GNORM2_PREV] == pytest.approx(gnorm2, rel=1e-12) for c in rounds[1].values())
    # k = 2: the first adaptive tau, from round 1's beta and delta
    assert [rounds[2][pid][C.LOCAL_STEPS] for pid in range(4)] == ADAPTIVE
    assert [rounds[3][pid][C.LOCAL_STEPS] for pid in range(4)] == ADAPTIVE
    assert all(c[C.BETA_MODE] == "same-batch" and c[C.GRAD_SUBSAMPLE] == 0
               for r in rounds for c in r.values())
    assert s.algorithm.taus == {"0": 20, "1": 10, "2": 4, "3": 2}
    # diagnostics: the table and tau_k for the next round after k = 1
    d = s.round_log(2)
    assert d[C.LOG_FEDVECA_TAU_NEXT] == {"0": 20, "1": 10, "2": 4, "3": 2}
    assert d[C.LOG_FEDVECA_TAU_K_NEXT] == pytest.approx(float(np.dot(p, ADAPTIVE)))
    assert d[C.LOG_FEDVECA_R] == pytest.approx({"0": 1.0, "1": 1.05, "2": 1.2, "3": 2.0})
    assert d[C.LOG_FEDVECA_SIGN] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert C.LOG_FEDVECA_R not in s.round_log(1)  # no estimates in round k = 0
    assert s.round_log(3)[C.LOG_FEDVECA_TAU] == {"0": 20, "1": 10, "2": 4, "3": 2}


def test_aggregation_is_eq5_and_global_gradient_eq8():
    grid = InProcessGrid(fake_app(), 4, {})
    s = FedVeca(query_client_info=True, seed=1)
    w0 = np.array([1.0, -1.0])
    p = np.array(SIZES) / sum(SIZES)
    # round 1: all tau = 20; eq. (5): w + tau_k * sum_i p_i STEP (pid + 1)
    w1 = run_rounds(s, grid, 1, w=w0)
    np.testing.assert_allclose(w1, w0 + 20 * STEP * float(np.dot(p, [1, 2, 3, 4])), rtol=1e-12)
    np.testing.assert_allclose(s.algorithm.prev_grad["w"], np.full(2, float(np.dot(p, [1, 2, 3, 4]))),
                               rtol=1e-12)
    assert s.round_log(1)[C.LOG_FEDVECA_TAU_K] == pytest.approx(20.0)
    # with unequal taus eq. (5) normalises: w2 - w1 = tau_k * STEP * sum_i p_i (pid + 1),
    # tau_k = sum p_i tau_i
    s.algorithm.taus = {"0": 20, "1": 10, "2": 4, "3": 2}
    s.algorithm.gnorm2_prev = None  # no estimates this round: taus stay
    w2 = run_rounds_from(s, grid, 2, w1)
    tau_k = float(np.dot(p, [20, 10, 4, 2]))
    np.testing.assert_allclose(w2, w1 + tau_k * STEP * float(np.dot(p, [1, 2, 3, 4])), rtol=1e-12)
    assert s.round_log(2)[C.LOG_FEDVECA_TAU_K] == pytest.approx(tau_k)
    assert s.round_log(2)[C.LOG_TAU_EFF] == pytest.approx(tau_k)


def run_rounds_from(strategy, grid, rnd, w):
    config = ConfigRecord({C.LR: 0.01, C.BATCH_SIZE: 8, C.LOCAL_STEPS: 0})
    replies = grid.send_and_receive(strategy.configure_train(rnd, record({"w": w}), config, grid))
    arrays, _ = strategy.aggregate_train(rnd, replies)
    return numpy_of(arrays)["w"]


def test_alpha_changes_the_table():
    grid = InProcessGrid(fake_app(), 4, {})
    s = FedVeca(query_client_info=True, alpha=0.5, tau_init=5, seed=1)
    run_rounds(s, grid, 2)
    assert s.algorithm.taus == {"0": 2, "1": 2, "2": 2, "3": 2}  # 1 / (1 - 0.5) = 2 for everyone


def test_smoothness_running_max_one_round_delay():
    grid = InProcessGrid(fake_app(), 4, {})
    s = FedVeca(query_client_info=True, seed=1)
    run_rounds(s, grid, 3)
    # the fake clients' gradient does not depend on w: grad F(w_k) is constant, so
    # L_0 = ||g|| / ||w_0||
    # and L_k = 0 for k >= 1; L_0 enters the running max in round k = 1 (one-round delay)
    assert s.round_log(1)[C.LOG_FEDVECA_L] is None
    assert s.round_log(1)[C.LOG_FEDVECA_ETA_TAU_K_L] is None
    g = float(np.dot(np.array(SIZES) / 100, [1, 2, 3, 4]))
    L0 = math.sqrt(2) * g / math.sqrt(2)  # ||g 1|| / ||(1, -1)||
    assert s.round_log(2)[C.LOG_FEDVECA_L] == pytest.approx(L0)
    assert s.round_log(2)[C.LOG_FEDVECA_L_LATEST] == pytest.approx(L0)
    assert s.round_log(3)[C.LOG_FEDVECA_L] == pytest.approx(L0)
    assert s.round_log(3)[C.LOG_FEDVECA_L_LATEST] == pytest.approx(0.0)
    assert s.round_log(2)[C.LOG_FEDVECA_ETA_TAU_K_L] == pytest.approx(0.01 * 20 * L0)


def test_initial_model_zero_skips_l0():
    grid = InProcessGrid(fake_app(), 4, {})
    s = FedVeca(query_client_info=True, seed=1)
    run_rounds(s, grid, 2, w=np.zeros(2))
    assert s.round_log(2)[C.LOG_FEDVECA_L] is None  # ||w_0|| = 0: L_0 skipped


def test_diagnostics_are_json():
    grid = InProcessGrid(fake_app(), 4, {})
    s = FedVeca(query_client_info=True, seed=1)
    run_rounds(s, grid, 3)
    for rnd in (1, 2, 3):
        json.dumps(s.round_log(rnd), allow_nan=False)
    d = s.round_log(2)
    for key in (C.LOG_FEDVECA_TAU, C.LOG_FEDVECA_TAU_K, C.LOG_FEDVECA_L, C.LOG_FEDVECA_ETA_TAU_K_L,
                C.LOG_FEDVECA_BETA, C.LOG_FEDVECA_DELTA, C.LOG_FEDVECA_A, C.LOG_FEDVECA_R,
                C.LOG_FEDVECA_SIGN, C.LOG_FEDVECA_ALPHA_BOUND, C.LOG_FEDVECA_TAU_SENT):
        assert key in d, key
    assert d[C.LOG_FEDVECA_A]["3"] == pytest.approx(0.01 * 2.0 * d[C.LOG_FEDVECA_DELTA]["3"])


# ================================================================ partial participation
def test_partial_participation_renormalises_and_keeps_taus():
    received = []
    grid = InProcessGrid(fake_app(received), 4, {})
    s = FedVeca(query_client_info=True, fraction_train=0.5, seed=3)
    w = np.array([1.0, -1.0])
    history = []
    for rnd in range(1, 7):
        before = dict(s.algorithm.taus)
        n0 = len(received)
        w = run_rounds_from(s, grid, rnd, w)
        participants = sorted(pid for pid, _ in received[n0:])
        assert len(participants) == 2
        for pid, cfg in received[n0:]:  # each participant gets its own last tau (or tau_init)
            assert cfg[C.LOCAL_STEPS] == before.get(str(pid), 20)
        for pid in range(4):
            if pid not in participants:
                assert s.algorithm.taus.get(str(pid)) == before.get(str(pid)), (rnd, pid)
        p = np.array([SIZES[i] for i in participants], dtype=float)
        p /= p.sum()
        taus = [before.get(str(i), 20) for i in participants]
        assert s.round_log(rnd)[C.LOG_FEDVECA_TAU_K] == pytest.approx(float(np.dot(p, taus)))
        history.append(participants)
        # ratios over the participants only: the minimum has r = 1
        if s.round_log(rnd).get(C.LOG_FEDVECA_R):
            assert min(s.round_log(rnd)[C.LOG_FEDVECA_R].values()) == pytest.approx(1.0)
            assert set(s.round_log(rnd)[C.LOG_FEDVECA_R]) == {str(i) for i in participants}
    assert len({tuple(h) for h in history}) > 1  # different clients were sampled


# ================================================================ malformed replies
def prepared(nodes=(1, 2, 3), estimate=True) -> FedVeca:
    s = FedVeca(query_client_info=True)
    s.participation.clients.update(
        {n: ClientInfo(partition_id=i, num_examples=10) for i, n in enumerate(nodes)})
    s.algorithm.gnorm2_prev = 1.0 if estimate else None
    return prepared_round(s, {"w": np.zeros(2)},
                          {n: {C.LR: 0.01, C.LOCAL_STEPS: 20, C.FEDVECA_ESTIMATE: estimate,
                               C.GNORM2_PREV: 1.0 if estimate else 0.0} for n in nodes})


def veca_reply(node, values, tau=2, grad=(1.0, 1.0), beta=1.0, delta=1.0, n=10, drop=(),
               grad_keys=("w",)):
    content = RecordDict({C.ARRAYS: record({"w": np.asarray(values, dtype=np.float64)})})
    if grad is not None:
        content[C.GRAD] = record({k: np.asarray(grad, dtype=np.float64) for k in grad_keys})
    metrics = {C.NUM_EXAMPLES: n, C.LOCAL_STEPS_TAKEN: tau, C.BETA: beta, C.DELTA: delta}
    content[C.METRICS] = MetricRecord({k: v for k, v in metrics.items() if k not in drop})
    return Message(content, reply_to=instruction(node))


BAD = {
    "no-grad": dict(grad=None),
    "grad-nan": dict(grad=(np.nan, 1.0)),
    "grad-inf": dict(grad=(1.0, np.inf)),
    "grad-wrong-key": dict(grad_keys=("v",)),
    "grad-wrong-shape": dict(grad=(1.0, 1.0, 1.0)),
    "no-beta": dict(drop=(C.BETA,)),
    "no-delta": dict(drop=(C.DELTA,)),
    "beta-nan": dict(beta=float("nan")),
    "delta-inf": dict(delta=float("inf")),
    "delta-negative": dict(delta=-1.0),
    "no-steps": dict(drop=(C.LOCAL_STEPS_TAKEN,)),
    "steps-zero": dict(tau=0),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_malformed_reply_rejected_with_one_line_others_aggregated(bad, caplog):
    s = prepared()
    replies = [veca_reply(1, [0.02, 0.04], tau=2), veca_reply(3, [9.0, 9.0], **BAD[bad]),
               veca_reply(2, [0.04, 0.08], tau=4, beta=2.0)]
    with caplog.at_level(logging.WARNING, logger="flwr"), np.errstate(all="ignore"):
        arrays, _ = s.aggregate_train(1, replies)
    # eq. (5) over nodes 1 and 2: d = [0.01, 0.02] both, tau_k = 3 -> [0.03, 0.06]
    np.testing.assert_allclose(numpy_of(arrays)["w"], [0.03, 0.06], atol=1e-14)
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and "node 3" in rejected[0], rejected
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1
    assert set(s.round_log(1)[C.LOG_FEDVECA_TAU]) == {"0", "1"}  # partition ids of nodes 1, 2
    assert "2" not in s.algorithm.taus  # the rejected client keeps its tau


def test_beta_delta_not_required_before_estimation(caplog):
    s = prepared(estimate=False)
    replies = [veca_reply(1, [0.02, 0.04], drop=(C.BETA, C.DELTA)), veca_reply(2, [0.02, 0.04])]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = s.aggregate_train(1, replies)
    assert arrays is not None and not [r for r in caplog.records if "rejected" in r.getMessage()]
    assert s.algorithm.taus == {}


def test_all_replies_bad_keeps_state():
    s = prepared()
    s.algorithm.taus = {"0": 7}
    arrays, _ = s.aggregate_train(1, [veca_reply(1, [1.0, 1.0], grad=(math.nan, 1.0))])
    assert arrays is None and s.algorithm.taus == {"0": 7} and s.algorithm.gnorm2_prev == 1.0


@pytest.mark.parametrize("missing", ["grad", "local-steps"])
def test_every_reply_without_the_contract_stops_the_run_naming_the_helper(missing):
    s = prepared()
    kwargs = {"grad": None} if missing == "grad" else {"drop": (C.LOCAL_STEPS_TAKEN,)}
    replies = [veca_reply(n, [1.0, 1.0], **kwargs) for n in (1, 2)]
    with pytest.raises(ClientContractError) as info:
        s.aggregate_train(1, replies)
    assert isinstance(info.value, RuntimeError)
    assert "strategies.client.fedveca_train" in str(info.value)
    assert missing in str(info.value)


def test_one_reply_without_the_contract_is_rejected_the_others_aggregated():
    s = prepared()
    arrays, _ = s.aggregate_train(1, [veca_reply(1, [1.0, 1.0], grad=None),
                                      veca_reply(2, [3.0, 3.0])])
    assert arrays is not None and s.round_log(1)[C.LOG_CLIENTS_RECEIVED] == 1


# ================================================================ guards through the strategy
def test_zero_beta_gets_tau_max_and_min_over_positive():
    s = prepared()
    replies = [veca_reply(1, [0.0, 0.0], beta=0.0), veca_reply(2, [0.0, 0.0], beta=1.0),
               veca_reply(3, [0.0, 0.0], beta=math.sqrt(1.05))]
    s.aggregate_train(2, replies)
    assert s.algorithm.taus == {"0": 50, "1": 20, "2": 10}
    assert s.round_log(2)[C.LOG_FEDVECA_REASON]["0"] == "zero-a"


def test_overflowing_a_keeps_previous_tau():
    s = prepared()
    s.algorithm.taus = {"0": 9}
    replies = [veca_reply(1, [0.0, 0.0], beta=1e200, delta=1e200),
               veca_reply(2, [0.0, 0.0], beta=1.0)]
    s.aggregate_train(2, replies)
    assert s.algorithm.taus == {"0": 9, "1": 20}
    assert s.round_log(2)[C.LOG_FEDVECA_A]["0"] is None


# ================================================================ state
def test_state_dict_round_trip_continues_identically():
    grid_a = InProcessGrid(fake_app(), 4, {})
    a = FedVeca(query_client_info=True, seed=2)
    w = run_rounds(a, grid_a, 2)
    state = a.state_dict()
    json.dumps({k: v for k, v in state["algorithm"].items() if k not in ("prev-model", "prev-grad")})
    b = FedVeca(query_client_info=True, seed=2)
    b.load_state_dict(state)
    assert b.algorithm.taus == a.algorithm.taus and b.algorithm.gnorm2_prev == a.algorithm.gnorm2_prev
    assert b.algorithm.smoothness_max == a.algorithm.smoothness_max
    received_a, received_b = [], []
    wa = run_rounds_from(a, InProcessGrid(fake_app(received_a), 4, {}), 3, w)
    wb = run_rounds_from(b, InProcessGrid(fake_app(received_b), 4, {}), 3, w)
    np.testing.assert_array_equal(wa, wb)
    assert sorted((p, c[C.LOCAL_STEPS], c[C.GNORM2_PREV]) for p, c in received_a) == \
        sorted((p, c[C.LOCAL_STEPS], c[C.GNORM2_PREV]) for p, c in received_b)
    assert a.round_log(3)[C.LOG_FEDVECA_L] == b.round_log(3)[C.LOG_FEDVECA_L]
    # the saved state is a copy
    saved = a.state_dict()
    saved["algorithm"]["taus"]["0"] = 3
    saved["algorithm"]["prev-grad"]["w"][:] = 0.0
    assert a.algorithm.taus["0"] == 20 and np.all(a.algorithm.prev_grad["w"] != 0.0)


def test_load_state_dict_checks():
    s = FedVeca(query_client_info=True, tau_max=30)
    state = s.state_dict()
    with pytest.raises(ValueError, match="outside"):
        s.load_state_dict({**state, "algorithm": {**state["algorithm"], "taus": {"0": 40}}})
    with pytest.raises(ValueError, match="version"):
        s.load_state_dict({**state, "engine-state-version": 99})


# ================================================================ constructor / registry
def test_fedvecas_update_is_fednovas_and_constructor_checks():
    assert isinstance(FedVeca().algorithm.update, type(FedNova().algorithm.update))
    for kwargs, match in (({"tau_init": 1}, "tau_init"), ({"tau_init": 60}, "tau_init"),
                          ({"tau_max": 1}, "tau_max"),
                          ({"alpha": 0.0}, "alpha"), ({"alpha": float("nan")}, "alpha"),
                          ({"beta_mode": "full"}, "beta mode"),
                          ({"grad_subsample": -1}, "grad_subsample"),
                          ({"straggler_fraction": 0.5}, "straggler_fraction"),
                          ({"server_lr": 0.5}, "server_lr"),
                          ({"server_momentum": 0.9}, "server_momentum")):
        with pytest.raises(ValueError, match=match):
            FedVeca(**kwargs)
    assert FedVeca(beta_mode="same_batch").algorithm.beta_mode == "same-batch"


def test_registry_builds_fedveca():
    cfg = RunConfig.from_user_config({"strategy": "fedveca", "fedveca-tau-init": 10,
                                      "fedveca-tau-max": 30, "fedveca-alpha": 0.9,
                                      "fedveca-beta-mode": "literal", "fedveca-grad-subsample": 500,
                                      "lr": 0.05, "fraction-train": 0.5})
    s, config = build_strategy(cfg)
    assert isinstance(s, FedVeca)
    assert (s.algorithm.tau_init, s.algorithm.tau_max, s.algorithm.alpha, s.algorithm.beta_mode, s.algorithm.grad_subsample,
            s.algorithm.lr) == (10, 30, 0.9, "literal", 500, 0.05)
    assert s.fraction_train == 0.5 and config[C.LR] == 0.05
