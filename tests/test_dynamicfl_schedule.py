"""Tests for strategies.algorithms.dynamicfl_schedule: sync levels, chunk plans, cost; the plans run on
the reference simulators of tests/oracles/dynamicfl.py.

Six invariants of a chunked round (Le et al., Alg. 1) are the tests named ``test_invariant_*``;
hand-computed rounds are written out in the comments.

kappa-hat convention
--------------------
We count nu_m = |S_m| = ceil(L / I_m), the syncs Algorithm 1 actually performs (l mod I = 0
or l = L), so interval 1 gives nu = L. Hence DynamicSGD costs 1.000 and Dynamic-0.3 'a-g'
at L = 250 costs (3 * 250 + 7 * 1) / 2500 = 0.3028 -> 0.303. The paper's tables print 0.996
and 0.302 because the official code performs only L - 1 = 249 syncs at interval 1 (its last
chunk is two steps long); we follow the paper's Algorithm 1 rather than that quirk, and
``tests.oracles.dynamicfl.num_syncs_reference_code`` reproduces the tables' numbers for comparison.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.engine import averaging as agg
from strategies.algorithms import dynamicfl_schedule as ds
from tests.oracles import dynamicfl as oracle


# ---------------------------------------------------------------- levels and specs
def test_levels_a_to_g():
    assert [ds.level_interval(x) for x in "abcdefg"] == [1, 4, 16, 32, 64, 128, 256]
    assert ds.level_interval(7) == 7 and ds.level_interval("12") == 12
    with pytest.raises(ValueError, match="not known"):
        ds.level_interval("h")
    with pytest.raises(ValueError):
        ds.level_interval(0)


def test_parse_interval_specs():
    assert ds.parse_interval_spec("a-g") == ds.IntervalSpec(1, 256)
    assert ds.parse_interval_spec("B-G") == ds.IntervalSpec(4, 256)
    assert ds.parse_interval_spec("a") == ds.dynamic_sgd()
    assert ds.parse_interval_spec("c*") == ds.x_star("c")
    assert ds.x_star("c") == ds.IntervalSpec(16, None, only_high=True)
    assert ds.parse_interval_spec("4-300") == ds.IntervalSpec(4, 300)
    assert str(ds.parse_interval_spec("a-g")) == "a-g" and str(ds.x_star("b")) == "b*"
    assert ds.parse_interval_spec("d").single and not ds.parse_interval_spec("a-g").single
    with pytest.raises(ValueError, match="must not be longer"):
        ds.parse_interval_spec("g-a")
    with pytest.raises(ValueError):
        ds.parse_interval_spec("a-b-c")


def test_capping_at_l():
    # 'g' = 256 > L = 250: one sync per round, at L
    assert ds.capped(256, 250) == 250
    assert ds.sync_steps(256, 250) == (250,)
    # Fashion-MNIST's L = 300: 'g' syncs at 256 and at 300
    assert ds.sync_steps(256, 300) == (256, 300)


# ---------------------------------------------------------------- syncs and chunks by hand
def test_sync_steps_and_counts_by_hand():
    assert ds.sync_steps(1, 5) == (1, 2, 3, 4, 5)
    assert ds.sync_steps(4, 10) == (4, 8, 10)
    assert ds.sync_steps(5, 10) == (5, 10)
    # 'b' at L = 250 syncs at 4, 8, ..., 248, 250: 63 times
    s = ds.sync_steps(4, 250)
    assert len(s) == 63 and s[:2] == (4, 8) and s[-2:] == (248, 250)
    assert [ds.num_syncs(i, 250) for i in (1, 4, 16, 32, 64, 128, 256)] == [250, 63, 16, 8, 4, 2, 1]
    assert oracle.num_syncs_reference_code(1, 250) == 249  # the official code's quirk
    assert oracle.num_syncs_reference_code(4, 250) == 63


def test_chunks_by_hand():
    assert [(c.start, c.num_steps) for c in ds.chunks_for("m", 4, 10)] == [(0, 4), (4, 4), (8, 2)]
    assert [(c.start, c.num_steps) for c in ds.chunks_for("m", 256, 250)] == [(0, 250)]
    assert [c.end for c in ds.chunks_for("m", 1, 3)] == [1, 2, 3]


def test_events_of_non_multiple_intervals():
    # union of sync points; I = 3 and 4 with L = 10
    plan = ds.SyncSchedule(10, {"h": 3, "l": 4})
    assert [(e.step, e.clients) for e in plan.events] == [
        (3, ("h",)), (4, ("l",)), (6, ("h",)), (8, ("l",)), (9, ("h",)), (10, ("h", "l"))]
    assert plan.next_chunk("h", 3) == ds.Chunk("h", 3, 3)
    assert plan.next_chunk("h", 9) == ds.Chunk("h", 9, 1)
    assert plan.next_chunk("h", 10) is None


def test_steps_per_round_eq4():
    assert ds.steps_per_round([500] * 100, 5, 10) == 250  # CIFAR-10: 50,000 / 100 * 5 / 10
    assert ds.steps_per_round([600] * 100, 5, 10) == 300  # Fashion-MNIST
    assert ds.steps_per_round([6442] * 99 + [6452], 5, 10) == 3221  # FEMNIST 644,210 samples
    assert ds.steps_per_round([1, 2], 1, 10) == 1
    with pytest.raises(ValueError):
        ds.steps_per_round([], 5, 10)



# ---------------------------------------------------------------- test local solvers
def affine_step(coefs):
    """Client m's step: w <- a_m w + b_m on every array (a hand-computable, non-commuting map)."""
    def step(client, params, start, n):
        a, b = coefs[client]
        out = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
        for _ in range(n):
            out = {k: a * v + b for k, v in out.items()}
        return out
    return step


def sgd_momentum_step(targets, seed=0, lr=0.1, rho=0.9):
    """Momentum SGD on 0.5 ||w - target_m||^2 with a deterministic per-(seed, client, step)
    noise stream; the momentum buffer lives in the closure like Context.state would."""
    momentum: dict = {}

    def step(client, params, start, n):
        w = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
        v = momentum.setdefault(client, {k: np.zeros_like(a) for k, a in w.items()})
        for s in range(start, start + n):
            rng = np.random.default_rng([seed, hash(client) % 1000, s])
            for k in w:
                g = w[k] - targets[client][k] + 0.1 * rng.normal(size=w[k].shape)
                v[k] = rho * v[k] + g
                w[k] = w[k] - lr * v[k]
        return w
    return step


def as_float(params):
    return float(params["w"][0])


# ---------------------------------------------------------------- hand-computed round
def test_hand_computed_round():
    # L = 3. High group {1, 2} at interval 1, low {3} at interval 3; |D| = 1, 1, 2; w0 = 0.
    #   c1: w <- w + 1,  c2: w <- w/2 + 2,  c3: w <- w/2 + 8
    # step 1: c1 = 1, c2 = 2, c3 = 8;          U_1 = {1, 2}: avg 1.5 -> c1 = c2 = 1.5
    # step 2: c1 = 2.5, c2 = 2.75, c3 = 12;    U_2 = {1, 2}: avg 2.625
    # step 3: c1 = 3.625, c2 = 3.3125, c3 = 14; U_3 = all: (3.625 + 3.3125 + 2 * 14) / 4 = 8.734375
    step = affine_step({1: (1.0, 1.0), 2: (0.5, 2.0), 3: (0.5, 8.0)})
    trace = oracle.simulate_round({"w": np.zeros(1)}, step, {"high": [1, 2], "low": [3]},
                              {"high": 1, "low": 3}, 3, {1: 1, 2: 1, 3: 2})
    assert [(s, c, as_float(a)) for s, c, a in trace.events] == [
        (1, (1, 2), 1.5), (2, (1, 2), 2.625), (3, (1, 2, 3), 8.734375)]
    assert as_float(trace.global_params) == 8.734375
    # without the high group's syncs (everyone low): c1 = 3, c2 = 3.5, c3 = 14 -> 34.5 / 4
    fedavg = oracle.simulate_round({"w": np.zeros(1)}, step, {"all": [1, 2, 3]}, {"all": 3}, 3,
                                   {1: 1, 2: 1, 3: 2})
    assert as_float(fedavg.global_params) == 8.625


# ---------------------------------------------------------------- six invariants of a chunked round
CLIENTS = list(range(6))
TARGETS = {m: {"w": np.full(3, float(m)), "b": np.array([m * 0.5 - 1.0])} for m in CLIENTS}
SIZES = {m: 10 * (m + 1) for m in CLIENTS}
W0 = {"w": np.zeros(3), "b": np.zeros(1)}


@pytest.mark.parametrize("spec", ["a-g", "b-g", "c-d", "b-c", "d"])
def test_invariant_1_every_client_does_exactly_l_steps(spec):
    plan = ds.assign_intervals(CLIENTS, [0, 2, 5], ds.parse_interval_spec(spec), 50)
    for m, chunks in plan.chunks.items():
        assert sum(c.num_steps for c in chunks) == 50
        assert chunks[0].start == 0 and chunks[-1].end == 50
        assert all(a.end == b.start for a, b in zip(chunks, chunks[1:]))  # contiguous
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    assert trace.steps_done == {m: 50 for m in CLIENTS}


@pytest.mark.parametrize("spec", ["a-g", "b-g", "c-d", "b-c"])
def test_invariant_2_averaged_set_is_exactly_the_syncing_clients(spec):
    L = 50
    parsed = ds.parse_interval_spec(spec)
    plan = ds.assign_intervals(CLIENTS, [0, 2, 5], parsed, L)
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    expected = {}
    for m in CLIENTS:
        interval = ds.capped(parsed.high if m in (0, 2, 5) else parsed.low, L)
        for step in range(1, L + 1):
            if step % interval == 0 or step == L:  # Alg. 1 l. 16
                expected.setdefault(step, set()).add(m)
    assert {s: set(c) for s, c, _ in trace.events} == expected
    assert [s for s, _, _ in trace.events] == sorted(expected)


def test_invariant_3_clients_outside_u_e_receive_nothing():
    L = 40
    plan = ds.assign_intervals(CLIENTS, [1, 3], ds.parse_interval_spec("b-d"), L)
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    for m in CLIENTS:
        syncs = ds.sync_steps(4 if m in (1, 3) else 32, L)
        # a model at the round start, then after each of its own syncs except L
        assert trace.received[m] == [0] + [s for s in syncs if s < L]
    # each chunk is dispatched at its start step and its result averaged at its end step
    for chunk, at in trace.dispatched:
        assert at == chunk.start
        assert any(s == chunk.end and chunk.client in c for s, c, _ in trace.events)


def test_invariant_4a_all_high_at_interval_1_is_dynamic_sgd():
    # DynamicSGD: every client syncs after every step; chunks must equal the literal loop
    L = 12
    plan = ds.assign_intervals(CLIENTS, CLIENTS, ds.dynamic_sgd(), L)
    chunked = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES).global_params
    # explicit FedSGD-style loop: average of everyone after every single step
    step = sgd_momentum_step(TARGETS)
    w = W0
    total = sum(SIZES.values())
    for s in range(L):
        models = [step(m, w, s, 1) for m in CLIENTS]
        w = {k: sum(SIZES[m] / total * models[i][k] for i, m in enumerate(CLIENTS)) for k in W0}
    for k in W0:
        np.testing.assert_allclose(chunked[k], w[k], rtol=1e-12, atol=1e-14)
    assert len(oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES).events) == L


def test_invariant_4b_interval_l_is_fedavg_with_equal_steps():
    L = 25
    plan = ds.assign_intervals(CLIENTS, [0], ds.fedavg_equivalent(L), L)
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    assert [s for s, _, _ in trace.events] == [L]
    step = sgd_momentum_step(TARGETS)
    local = [step(m, W0, 0, L) for m in CLIENTS]
    total = sum(SIZES.values())
    for k in W0:
        expected = sum(SIZES[m] / total * local[i][k] for i, m in enumerate(CLIENTS))
        np.testing.assert_allclose(trace.global_params[k], expected, rtol=1e-12)
    # 'g' at L = 250 is the same schedule as the FedAvg preset
    assert ds.assign_intervals(CLIENTS, [0], ds.parse_interval_spec("g"), 250).intervals == \
        ds.assign_intervals(CLIENTS, [0], ds.fedavg_equivalent(250), 250).intervals


def test_invariant_5_singleton_high_group_is_local_training():
    # Averaging one model with itself changes nothing: z = {m} at interval 1 gives exactly
    # (bit for bit) the round in which m trains alone with everybody else.
    L = 30
    for m in (0, 4):
        groups = {"high": [m], "low": [x for x in CLIENTS if x != m]}
        single = oracle.simulate_round(W0, sgd_momentum_step(TARGETS), groups,
                                       {"high": 1, "low": 256}, L, SIZES)
        alone = oracle.simulate_round(W0, sgd_momentum_step(TARGETS), {"low": CLIENTS},
                                      {"low": 256}, L, SIZES)
        for k in W0:
            assert np.array_equal(single.global_params[k], alone.global_params[k])
        # and the singleton's intermediate 'averages' are its own local model
        step = sgd_momentum_step(TARGETS)
        w = W0
        for s, clients, avg in single.events[:-1]:
            assert clients == (m,)
            w = step(m, w, s - 1, 1)
            for k in W0:
                assert np.array_equal(avg[k], w[k])


def test_invariant_6_kappa_hat_dynamic_03_a_g():
    # 10 active, Dynamic-0.3 -> |z| = 3 at 'a', 7 at 'g', L = 250:
    #   ours (Alg. 1): (3 * 250 + 7 * 1) / 2500 = 757 / 2500 = 0.3028 -> 0.303
    #   official code: (3 * 249 + 7 * 1) / 2500 = 754 / 2500 = 0.3016 -> 0.302 (paper tables)
    active = list(range(10))
    plan = ds.assign_intervals(active, [2, 5, 7], ds.parse_interval_spec("a-g"), 250)
    cost = ds.round_cost(plan, model_bytes=1000)
    assert cost.syncs == 757
    assert cost.kappa_hat == pytest.approx(0.3028, abs=1e-15)
    assert round(cost.kappa_hat, 3) == 0.303
    assert cost.bytes_up == cost.bytes_down == 757_000
    spec = ds.parse_interval_spec("a-g")
    assert oracle.expected_kappa_hat(spec, 10, 3, 250) == pytest.approx(0.3028)
    assert oracle.expected_kappa_hat(spec, 10, 3, 250, reference_code=True) == pytest.approx(0.3016)
    assert round(oracle.expected_kappa_hat(spec, 10, 3, 250, reference_code=True), 3) == 0.302


# ---------------------------------------------------------------- chunks == Algorithm 1
@pytest.mark.parametrize("intervals", [
    {0: 1, 1: 1, 2: 256, 3: 256, 4: 256, 5: 256},  # a-g
    {0: 4, 1: 4, 2: 16, 3: 16, 4: 16, 5: 4},        # b-c
    {0: 3, 1: 4, 2: 7, 3: 1, 4: 10, 5: 37},         # non-multiples, and one > L
])
def test_chunked_round_equals_stepwise_algorithm_1(intervals):
    # Dispatch-at-start / hold-until-end reproduces the literal per-step loop exactly.
    L = 37
    plan = ds.SyncSchedule(L, {m: ds.capped(i, L) for m, i in intervals.items()})
    chunked = oracle.run_plan(W0, sgd_momentum_step(TARGETS, seed=3), plan, SIZES).global_params
    stepwise = oracle.simulate_round_stepwise(W0, sgd_momentum_step(TARGETS, seed=3), intervals, L,
                                              SIZES)
    for k in W0:
        np.testing.assert_allclose(chunked[k], stepwise[k], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- kappa-hat and bytes
@pytest.mark.parametrize("spec, expected", [("a", 1.0), ("b", 0.252), ("c", 0.064), ("d", 0.032),
                                            ("g", 0.004)])
def test_kappa_hat_single_levels_at_l_250(spec, expected):
    # paper tables: 'b' 0.252, 'c' 0.064, 'd' 0.032, FedAvg 0.004; 'a' is 1.000 in ours
    plan = ds.assign_intervals(list(range(10)), [], ds.parse_interval_spec(spec), 250)
    assert ds.round_cost(plan, 1).kappa_hat == pytest.approx(expected, abs=1e-12)


def test_kappa_hat_fedavg_and_bytes():
    plan = ds.assign_intervals(list(range(10)), [0, 1], ds.fedavg_equivalent(250), 250)
    cost = ds.round_cost(plan, model_bytes=246_824)
    assert cost.kappa_hat == pytest.approx(0.004, abs=1e-15)  # 10 / 2500
    assert cost.syncs == 10 and cost.bytes_up == cost.bytes_down == 2_468_240
    assert ds.round_cost(ds.assign_intervals(list(range(10)), [], ds.dynamic_sgd(), 250),
                         1).kappa_hat == 1.0
    assert oracle.expected_kappa_hat(ds.dynamic_sgd(), 10, 10, 250,
                                     reference_code=True) == pytest.approx(0.996)
    # Fashion-MNIST, L = 300: FedAvg 1/300; 'b-g' with 3 high: (3 * 75 + 7 * 2) / 3000
    assert oracle.expected_kappa_hat(ds.fedavg_equivalent(300), 10, 0,
                                     300) == pytest.approx(1 / 300)
    assert oracle.expected_kappa_hat(ds.parse_interval_spec("b-g"), 10, 3,
                                     300) == pytest.approx(239 / 3000)


# ---------------------------------------------------------------- 'x*' ablation
def test_x_star_paper_mode_drops_the_low_group():
    L = 20
    plan = ds.assign_intervals(CLIENTS, [1, 4], ds.x_star("b"), L, x_star_mode="paper")
    assert plan.training == (1, 4) and plan.frozen == () and plan.num_active == 6
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    assert set(trace.steps_done) == {1, 4}
    assert trace.events[-1][1] == (1, 4)
    # cost counts only the high group, over all |M^t| = 6 active: 2 * 5 / (6 * 20)
    assert ds.round_cost(plan, 1).kappa_hat == pytest.approx(10 / 120)
    assert oracle.expected_kappa_hat(ds.x_star("b"), 6, 2, L) == pytest.approx(10 / 120)


def test_x_star_code_mode_mixes_in_untrained_start_models():
    # official code: low clients do not train, but W_g^{t-1} enters the final average
    # with their |D_m|. With w0 = 0 the result is (sum_z |D_m|) / (sum_all |D_m|) times the
    # paper-mode result.
    L = 20
    paper = oracle.run_plan(W0, sgd_momentum_step(TARGETS),
                            ds.assign_intervals(CLIENTS, [1, 4], ds.x_star("b"), L), SIZES)
    plan = ds.assign_intervals(CLIENTS, [1, 4], ds.x_star("b"), L, x_star_mode="code")
    assert plan.frozen == (0, 2, 3, 5)
    code = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    share = (SIZES[1] + SIZES[4]) / sum(SIZES.values())  # (20 + 50) / 210
    for k in W0:
        np.testing.assert_allclose(code.global_params[k], share * paper.global_params[k],
                                   rtol=1e-12)
    assert set(code.steps_done) == {1, 4}
    paper_plan = ds.assign_intervals(CLIENTS, [1, 4], ds.x_star("b"), L)
    assert ds.round_cost(plan, 1).syncs == ds.round_cost(paper_plan, 1).syncs


def test_x_star_with_empty_group_keeps_the_model():
    plan = ds.assign_intervals(CLIENTS, [], ds.x_star("a"), 10)
    trace = oracle.run_plan(W0, sgd_momentum_step(TARGETS), plan, SIZES)
    assert trace.events == [] and trace.global_params is W0


# ---------------------------------------------------------------- misc
def test_weighted_mean_hand_computed_and_dtypes():
    """The one averaging kernel that DynamicFL's sync events use (strategies.engine.averaging)."""
    out = agg.weighted_mean([{"w": np.array([1.0, 2.0]), "n": np.array(3)},
                             {"w": np.array([3.0, 6.0]), "n": np.array(4)}], [1, 3])
    np.testing.assert_allclose(out["w"], [2.5, 5.0])  # (1 + 9) / 4, (2 + 18) / 4
    assert out["n"] == 4 and out["n"].dtype == np.array(3).dtype  # round(3.75)
    f32 = agg.weighted_mean([{"w": np.ones(2, np.float32)}, {"w": np.zeros(2, np.float32)}],
                            [1, 1])
    assert f32["w"].dtype == np.float32 and f32["w"].tolist() == [0.5, 0.5]
    single = {"w": np.array([0.1, 0.7], dtype=np.float32)}
    copy = agg.weighted_mean([single], [5])
    assert np.array_equal(copy["w"], single["w"]) and copy["w"] is not single["w"]
    with pytest.raises(ValueError):
        agg.weighted_mean([single], [0])


def test_assign_intervals_checks():
    with pytest.raises(ValueError, match="not active"):
        ds.assign_intervals([1, 2], [3], ds.parse_interval_spec("a-g"), 10)
    with pytest.raises(ValueError, match="x_star_mode"):
        ds.assign_intervals([1, 2], [1], ds.x_star("a"), 10, x_star_mode="both")
    with pytest.raises(ValueError, match="more than one group"):
        oracle.plan_from_groups({"high": [1], "low": [1]}, {"high": 1, "low": 2}, 10)
    with pytest.raises(ValueError, match="no interval"):
        oracle.plan_from_groups({"high": [1]}, {"low": 2}, 10)
