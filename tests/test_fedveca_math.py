"""Tests for strategies.algorithms.fedveca_math (pure numpy, no Flower types).

Hand-computed numbers for FedVeca's eqs. (8), (13), (15), Alg. 1 and the guards of the
tau rule.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from strategies.engine import averaging as agg
from strategies.algorithms import fedveca_math as vm

# ---------------------------------------------------------------- eq. (15) table
TABLE_095 = [(1.00, 20), (1.01, 16), (1.02, 14), (1.05, 10), (1.10, 7), (1.20, 4), (1.30, 3),
             (1.50, 2), (1.90, 2), (1.95, 2), (2.5, 2), (1e6, 2)]


@pytest.mark.parametrize("r,tau", TABLE_095)
def test_tau_table_alpha_095(r, tau):
    assert vm.tau_from_ratio(r, 0.95) == tau


def test_smallest_a_gets_20_not_19():
    # naive float: floor(1 / (1 - 0.95)) = floor(19.999999999999982) = 19
    assert math.floor(1 / (1 - 0.95)) == 19
    assert vm.tau_from_ratio(1.0, 0.95) == 20
    decision = vm.next_taus([0.3, 0.7, 0.31], 0.95)
    assert decision.taus[0] == 20 and decision.ratios[0] == 1.0


@pytest.mark.parametrize("alpha,expected",
                         [(0.5, 2), (0.9, 10), (0.95, 20), (0.98, 50), (0.99, 50), (0.995, 50)])
def test_smallest_a_gets_floor_one_over_one_minus_alpha_capped(alpha, expected):
    assert vm.tau_from_ratio(1.0, alpha, tau_max=50) == expected


def test_cap_and_floor_of_two():
    assert vm.tau_from_ratio(1.0, 0.995, tau_max=50) == 50  # 200 -> cap
    assert vm.tau_from_ratio(1.0, 0.995, tau_max=300) == 200
    assert vm.tau_from_ratio(1.0, 0.5) == 2  # 1 / 0.5 = 2 exactly
    assert vm.tau_from_ratio(3.0, 0.5) == 2  # 3 / 2.5 = 1.2 -> 1 -> 2
    assert vm.tau_from_ratio(1.0, 0.95, tau_max=7) == 7


def test_exact_boundaries_with_rationals():
    # r / (r - alpha) = 2 exactly at r = 2 alpha = 1.9; = 3 at r = 1.425
    assert vm.tau_from_ratio(Fraction(19, 10), 0.95) == 2
    assert vm.tau_from_ratio(Fraction(1425, 1000), 0.95) == 3
    assert vm.tau_from_ratio(Fraction(1425, 1000) + Fraction(1, 10**6), 0.95) == 2
    # floating noise just above the boundary still counts as the integer
    assert vm.tau_from_ratio(1.425 * (1 + 1e-13), 0.95) == 3


def test_only_ratios_of_a_matter():
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 1.6, size=12)
    base[3] = 1.0  # an exact minimum
    reference = vm.next_taus(base.tolist(), 0.95)
    for scale in (1e-30, 1e-8, 0.01, 3.7, 1e12, 1e30):
        scaled = vm.next_taus((base * scale).tolist(), 0.95)
        assert scaled.taus == reference.taus, scale
        assert scaled.signs == reference.signs
        np.testing.assert_allclose(scaled.ratios, reference.ratios, rtol=1e-12)
    assert reference.taus[3] == 20


def test_eta_cancels_through_a():
    betas, deltas = [0.2, 0.25, 0.21], [3.0, 2.0, 2.9]
    taus = {eta: vm.next_taus([vm.non_iid_effect(eta, b, d) for b, d in zip(betas, deltas)],
                              0.95).taus
            for eta in (1e-4, 0.01, 0.5)}
    assert len({tuple(t) for t in taus.values()}) == 1


def test_non_iid_effect():
    assert vm.non_iid_effect(0.01, 3.0, 2.0) == pytest.approx(0.18)
    assert math.isnan(vm.non_iid_effect(0.01, float("nan"), 2.0))
    assert math.isnan(vm.non_iid_effect(0.01, 1.0, float("inf")))
    assert vm.non_iid_effect(0.01, 1e200, 1e200) == math.inf  # overflow -> guarded in next_taus


# ---------------------------------------------------------------- guards
def test_guards_missing_nan_inf_keep_previous():
    d = vm.next_taus([1.0, None, float("nan"), math.inf, 1.05], 0.95)
    assert d.taus == [20, None, None, None, 10]
    assert d.reasons == [vm.RULE, vm.MISSING, vm.NOT_FINITE, vm.NOT_FINITE, vm.RULE]
    assert d.min_a == 1.0  # NaN / Inf left out of min A


def test_guard_zero_a_gets_tau_max_and_min_over_positive():
    d = vm.next_taus([0.0, 2.0, 2.1], 0.95, tau_max=50)
    assert d.taus == [50, 20, 10]  # r = 1.05 -> 10
    assert d.reasons[0] == vm.ZERO_A and d.signs[0] == -1 and d.min_a == 2.0
    all_zero = vm.next_taus([0.0, 0.0], 0.95, tau_max=33)
    assert all_zero.taus == [33, 33] and all_zero.min_a is None


def test_guard_negative_direction_gets_tau_max():
    # alpha >= 1: r_i <= alpha means A_i - alpha min A <= 0 ("negative"), no bound from (14)
    d = vm.next_taus([1.0, 1.1, 1.3], 1.2, tau_max=50)
    assert d.signs == [-1, -1, 1]
    assert d.reasons == [vm.NEGATIVE, vm.NEGATIVE, vm.RULE]
    assert d.taus == [50, 50, 13]  # 1.3 / (1.3 - 1.2) = 13
    # alpha = 1 exactly: the minimum client has A_i - alpha min A = 0
    d = vm.next_taus([2.0, 4.0], 1.0)
    assert d.signs == [0, 1] and d.taus == [50, 2] and d.reasons[0] == vm.NEGATIVE


def test_alpha_below_one_every_positive_client_is_positive():
    rng = np.random.default_rng(3)
    d = vm.next_taus(rng.uniform(0.1, 5.0, size=50).tolist(), 0.95)
    assert all(s == 1 for s in d.signs) and all(2 <= t <= 20 for t in d.taus)


def test_next_taus_rejects_bad_parameters():
    for alpha in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            vm.next_taus([1.0], alpha)
    with pytest.raises(ValueError, match="tau_max"):
        vm.next_taus([1.0], 0.95, tau_max=1)


# ---------------------------------------------------------------- eq. (8), L, tau_k
def test_global_gradient_is_data_weighted_mean():
    g1 = {"a": np.array([1.0, 2.0]), "b": np.array([[1.0]])}
    g2 = {"a": np.array([3.0, -2.0]), "b": np.array([[5.0]])}
    g = vm.global_gradient([g1, g2], [10, 30])  # p = (0.25, 0.75)
    np.testing.assert_allclose(g["a"], [2.5, -1.0], atol=1e-15)
    np.testing.assert_allclose(g["b"], [[4.0]], atol=1e-15)
    with pytest.raises(ValueError):
        vm.global_gradient([], [])


def test_gradient_sum_is_kept_in_the_gradients_dtype():
    # float32 gradients are summed in float32 (the model sum of eq. 5 does the same):
    # 1 + 1e-8 is 1 in float32, so the mean is exactly 0.5
    acc = vm.GradientSum()
    acc.add({"w": np.array([1.0], dtype=np.float32)}, 1)
    acc.add({"w": np.array([1e-8], dtype=np.float32)}, 1)
    mean = acc.mean()["w"]
    assert mean.dtype == np.float32 and mean.tolist() == [0.5]
    # float64 gradients stay float64
    acc = vm.GradientSum()
    acc.add({"w": np.array([1.0])}, 1)
    acc.add({"w": np.array([1e-8])}, 1)
    assert acc.mean()["w"].tolist() == [(1.0 + 1e-8) / 2]


def test_gradient_sum_of_large_arrays_equals_the_one_line_sum():
    # arrays longer than one block go through add_scaled's blocks: the same float32 numbers
    rng = np.random.default_rng(0)
    grads = [{"w": rng.normal(size=(3, agg.BLOCK + 5)).astype(np.float32)} for _ in range(3)]
    sizes = [10.0, 30.0, 7.0]
    acc = vm.GradientSum()
    for g, n in zip(grads, sizes):
        acc.add(g, n)
    expected = grads[0]["w"] * np.float32(10.0)
    for g, n in zip(grads[1:], sizes[1:]):
        expected += g["w"] * np.float32(n)
    expected /= np.float32(47.0)
    np.testing.assert_array_equal(acc.mean()["w"], expected)


def test_gradient_sum_sees_non_finite_gradients():
    acc = vm.GradientSum()
    acc.add({"w": np.ones(3, dtype=np.float32)}, 2)
    assert acc.non_finite_key() is None
    acc.add({"w": np.array([1.0, np.nan, 1.0], dtype=np.float32)}, 1)
    acc.add({"w": np.ones(3, dtype=np.float32)}, 1)  # NaN survives later additions
    assert acc.non_finite_key() == "w"


def test_norms():
    assert vm.squared_norm({"a": np.array([3.0]), "b": np.array([[4.0]])}) == 25.0
    assert vm.difference_norm({"a": np.array([3.0, 0.0])}, {"a": np.array([0.0, 4.0])}) == 5.0
    # longer than one block, float32 in: float64 accumulation over the blocks
    n = 2 * agg.BLOCK + 3
    ones = {"w": np.ones(n, dtype=np.float32)}
    assert vm.squared_norm(ones) == float(n)
    assert vm.difference_norm(ones, {"w": np.full(n, 3.0, dtype=np.float32)}) == \
        pytest.approx(2.0 * math.sqrt(n), rel=1e-15)


def test_smoothness_estimates():
    # quadratic F(w) = 0.5 * 3 * ||w||^2: grad = 3 w, so L = 3 from any two points
    w_a, w_b = {"w": np.array([1.0, 2.0])}, {"w": np.array([-1.0, 0.5])}
    grad = lambda w: {"w": 3.0 * w["w"]}  # noqa: E731
    assert vm.smoothness(grad(w_a), grad(w_b), w_a, w_b) == pytest.approx(3.0)
    assert vm.smoothness(grad(w_a), grad(w_a), w_a, w_a) is None  # same model: 0/0
    assert vm.initial_smoothness(grad(w_a), w_a) == pytest.approx(3.0)  # ||3 w|| / ||w||
    assert vm.initial_smoothness({"w": np.ones(2)}, {"w": np.zeros(2)}) is None  # SVM w_0 = 0


def test_running_max_ignores_missing_and_non_finite():
    L = None
    for estimate, expected in ((None, None), (2.0, 2.0), (float("nan"), 2.0), (1.0, 2.0),
                               (math.inf, 2.0), (5.0, 5.0)):
        L = vm.running_max(L, estimate)
        assert L == expected


def test_aggregated_tau_and_alpha_bound():
    assert vm.aggregated_tau([20, 2], [1, 3]) == pytest.approx(6.5)
    assert vm.alpha_upper_bound(1.0, 4.0) == 0.5
    assert vm.alpha_upper_bound(10.0, 4.0) == 1.0
    assert vm.alpha_upper_bound(None, 4.0) is None


def test_beta_modes():
    assert vm.normalise_beta_mode("same_batch") == "same-batch"
    assert vm.normalise_beta_mode("literal") == "literal"
    with pytest.raises(ValueError, match="beta mode"):
        vm.normalise_beta_mode("full")
