"""SCAFFOLD's control-variate arithmetic (strategies.algorithms.scaffold_math) against hand-computed numbers
(Karimireddy et al. 2020, Algorithm 1, option II)."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.algorithms import scaffold_math as sm

F32 = np.float32


def arrays(**values) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=F32) for k, v in values.items()}


def test_zero_control_covers_floating_arrays_only():
    model = {"w": np.ones((2, 3), F32), "b": np.ones(3, np.float64),
             "bn.num_batches_tracked": np.array(7, np.int64)}
    c = sm.zero_control(model)
    assert set(c) == {"w", "b"}
    assert c["w"].dtype == F32 and c["w"].shape == (2, 3) and not c["w"].any()
    assert c["b"].dtype == np.float64


def test_correction_is_c_minus_c_i():
    out = sm.correction(arrays(w=[0.5, 0.5]), arrays(w=[1.0, -2.0]))
    np.testing.assert_array_equal(out["w"], [-0.5, 2.5])


def test_option_ii_by_hand():
    # c_i = [1, 2], c = [0.5, 0.5], x = [1, 1], y = [0.8, 1.2], K = 2, eta_l = 0.1:
    # (x - y) / (K eta_l) = [0.2, -0.2] / 0.2 = [1, -1]; c_i+ = c_i - c + [1, -1] = [1.5, 0.5]
    new = sm.option_ii(arrays(w=[1, 2]), arrays(w=[0.5, 0.5]), arrays(w=[1, 1]),
                       arrays(w=[0.8, 1.2]), steps=2, lr=0.1)
    np.testing.assert_allclose(new["w"], [1.5, 0.5], rtol=1e-6)
    assert new["w"].dtype == F32
    delta = sm.control_delta(new, arrays(w=[1, 2]))
    np.testing.assert_allclose(delta["w"], [0.5, -1.5], rtol=1e-6)


def test_option_ii_keeps_c_i_of_untrained_arrays():
    c_i = arrays(w=[1.0], running_mean=[3.0])
    new = sm.option_ii(c_i, arrays(w=[0.0], running_mean=[9.0]), arrays(w=[1.0]),
                       arrays(w=[0.5]), steps=5, lr=0.1)
    np.testing.assert_allclose(new["w"], [2.0])  # 1 - 0 + 0.5 / 0.5
    assert new["running_mean"][0] == 3.0  # not a trained parameter: c_i+ = c_i


def test_option_ii_with_plain_sgd_is_the_mean_gradient():
    # K plain SGD steps y <- y - eta (g + c - c_i) on f(y) = 0.5 a y^2 (g = a y):
    # (x - y_K) / (K eta) = mean_k (g_k + c - c_i), so c_i+ = mean_k g_k
    a, eta, steps, c, c_i = 2.0, 0.05, 4, 0.3, -0.2
    y, grads = 1.0, []
    for _ in range(steps):
        grads.append(a * y)
        y -= eta * (a * y + c - c_i)
    new = sm.option_ii(arrays(w=[c_i]), arrays(w=[c]), arrays(w=[1.0]), arrays(w=[y]),
                       steps, eta)
    assert new["w"][0] == pytest.approx(np.mean(grads), rel=1e-6)


@pytest.mark.parametrize("steps, lr", [(0, 0.1), (3, 0.0), (3, -1.0)])
def test_option_ii_needs_steps_and_lr(steps, lr):
    with pytest.raises(ValueError, match="K >= 1"):
        sm.option_ii(arrays(w=[0]), arrays(w=[0]), arrays(w=[0]), arrays(w=[0]), steps, lr)


def test_apply_delta_is_the_same_float_operation_on_both_sides():
    rng = np.random.default_rng(0)
    c_i = {"w": rng.normal(size=1000).astype(F32)}
    new = {"w": (c_i["w"] + rng.normal(size=1000) * 1e-3).astype(F32)}
    delta = sm.control_delta(new, c_i)
    client = sm.apply_delta(c_i, delta)
    server = sm.apply_delta({"w": c_i["w"].copy()}, {"w": delta["w"].copy()})
    assert client["w"].tobytes() == server["w"].tobytes() and client["w"].dtype == F32
    np.testing.assert_allclose(client["w"], new["w"], atol=1e-6)


def test_control_step_by_hand():
    # c = [0.5, 0.5]; deltas [0.5, -1.5] and [1.0, 0.5] from |S| = 2 of N = 4 clients:
    # c + 2/4 * mean = [0.5, 0.5] + 0.5 * [0.75, -0.5] = [0.875, 0.25]
    total = sm.add_delta(None, arrays(w=[0.5, -1.5]))
    total = sm.add_delta(total, arrays(w=[1.0, 0.5]))
    assert total["w"].dtype == np.float64
    c = sm.control_step(arrays(w=[0.5, 0.5]), total, num_accepted=2, num_clients=4)
    np.testing.assert_allclose(c["w"], [0.875, 0.25])
    assert c["w"].dtype == F32


def test_control_stays_the_mean_of_all_client_controls_under_failures():
    rng = np.random.default_rng(1)
    n = 5
    mirror = [np.zeros(3) for _ in range(n)]
    c = {"w": np.zeros(3)}
    for _ in range(6):
        accepted = sorted(rng.choice(n, size=rng.integers(1, n + 1), replace=False))
        total = None
        for i in accepted:
            delta = {"w": rng.normal(size=3)}
            mirror[i] = sm.apply_delta({"w": mirror[i]}, delta)["w"]
            total = sm.add_delta(total, delta)
        c = sm.control_step(c, total, len(accepted), n)
        np.testing.assert_allclose(c["w"], np.mean(mirror, axis=0), atol=1e-12)


@pytest.mark.parametrize("accepted, clients", [(0, 4), (5, 4)])
def test_control_step_needs_a_sane_s(accepted, clients):
    with pytest.raises(ValueError, match="1 <= |S| <= N"):
        sm.control_step(arrays(w=[0]), {"w": np.zeros(1)}, accepted, clients)


def test_norm():
    assert sm.norm(arrays(a=[3.0], b=[4.0])) == pytest.approx(5.0)
