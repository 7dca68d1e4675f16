"""FedDyn's server and linear-term arithmetic (strategies.algorithms.feddyn_math) against hand-computed
numbers (Acar et al., ICLR 2021, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.algorithms import feddyn_math as fm

F32 = np.float32


def arrays(**values) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=F32) for k, v in values.items()}


def test_zero_state_covers_floating_arrays_only():
    model = {"w": np.ones((2, 3), F32), "b": np.ones(3, np.float64),
             "bn.num_batches_tracked": np.array(7, np.int64)}
    h = fm.zero_state(model)
    assert set(h) == {"w", "b"} and set(fm.floating_arrays(model)) == {"w", "b"}
    assert h["w"].dtype == F32 and h["w"].shape == (2, 3) and not h["w"].any()
    assert h["b"].dtype == np.float64


def test_linear_term_update_by_hand():
    # g = [1, -1], alpha = 0.1, theta_k = [2, 0], theta^{t-1} = [1, 1]:
    # g - alpha (theta_k - theta) = [1, -1] - 0.1 [1, -1] = [0.9, -0.9]
    new = fm.linear_term_update(arrays(w=[1, -1]), 0.1, arrays(w=[2, 0]), arrays(w=[1, 1]))
    np.testing.assert_allclose(new["w"], [0.9, -0.9], rtol=1e-6)
    assert new["w"].dtype == F32


def test_linear_term_update_keeps_keys_the_client_did_not_send():
    new = fm.linear_term_update(arrays(w=[1.0], extra=[3.0]), 0.5, arrays(w=[0.0]),
                                arrays(w=[1.0]))
    np.testing.assert_allclose(new["w"], [1.5])
    assert new["extra"][0] == 3.0


def test_linear_term_update_is_the_same_float_operation_on_both_sides():
    rng = np.random.default_rng(0)
    g = {"w": rng.normal(size=1000).astype(F32)}
    local, glob = ({"w": rng.normal(size=1000).astype(F32)} for _ in range(2))
    client = fm.linear_term_update(g, 0.01, local, glob)
    server = fm.linear_term_update({"w": g["w"].copy()}, 0.01, {"w": local["w"].copy()},
                                   {"w": glob["w"].copy()})
    assert client["w"].tobytes() == server["w"].tobytes()


def test_h_step_and_server_model_by_hand():
    # theta^{t-1} = [1, 1]; P_t = two of m = 4 clients with theta_k = [2, 0] and [3, 1];
    # drift sum = [1, -1] + [2, 0] = [3, -1]; alpha = 0.5:
    # h = [0, 0] - 0.5 / 4 [3, -1] = [-0.375, 0.125]
    # theta^t = mean theta_k - h / alpha = [2.5, 0.5] - [-0.75, 0.25] = [3.25, 0.25]
    previous = arrays(w=[1, 1])
    locals_ = [arrays(w=[2, 0]), arrays(w=[3, 1])]
    total = None
    for local in locals_:
        total = fm.add_drift(total, local, previous, previous)
    assert total["w"].dtype == np.float64
    np.testing.assert_allclose(total["w"], [3, -1])
    h = fm.h_step(arrays(w=[0, 0]), total, alpha=0.5, num_clients=4)
    np.testing.assert_allclose(h["w"], [-0.375, 0.125])
    assert h["w"].dtype == F32
    average = {"w": np.mean([m["w"] for m in locals_], axis=0),
               "step": np.array(4, np.int64)}
    theta = fm.server_model(average, h, alpha=0.5)
    np.testing.assert_allclose(theta["w"], [3.25, 0.25])
    assert theta["step"] == 4 and theta["w"].dtype == F32  # integer arrays: the average


def test_h_is_the_mean_of_all_linear_terms_under_partial_participation():
    """The reading implemented (sum of the drifts, 1/m over all m clients) keeps
    h^t = (1/m) sum_k grad L_k(theta_k^t) over ALL clients, however many take part."""
    rng = np.random.default_rng(1)
    m, alpha = 5, 0.3
    linear = [{"w": np.zeros(3)} for _ in range(m)]
    h = {"w": np.zeros(3)}
    for _ in range(6):
        theta = {"w": rng.normal(size=3)}
        total = None
        for k in sorted(rng.choice(m, size=rng.integers(1, m + 1), replace=False)):
            local = {"w": rng.normal(size=3)}
            linear[k] = fm.linear_term_update(linear[k], alpha, local, theta)
            total = fm.add_drift(total, local, theta, h)
        h = fm.h_step(h, total, alpha, m)
        np.testing.assert_allclose(h["w"], np.mean([g["w"] for g in linear], axis=0),
                                   atol=1e-12)


def test_the_literal_parenthesisation_would_move_h_without_any_drift():
    # every client returns theta^{t-1} unchanged: the implemented h stays 0, whereas
    # (sum theta_k) - theta^{t-1} with |P_t| = 3 would be 2 theta^{t-1} != 0
    theta = arrays(w=[1.0, 2.0])
    total = None
    for _ in range(3):
        total = fm.add_drift(total, theta, theta, theta)
    h = fm.h_step(arrays(w=[0, 0]), total, 0.1, 3)
    assert not h["w"].any()


@pytest.mark.parametrize("alpha, clients", [(0.0, 3), (-1.0, 3), (0.1, 0)])
def test_h_step_needs_positive_alpha_and_clients(alpha, clients):
    with pytest.raises(ValueError, match="alpha > 0"):
        fm.h_step(arrays(w=[0]), {"w": np.zeros(1)}, alpha, clients)


def test_alpha_must_be_positive():
    with pytest.raises(ValueError, match="alpha > 0"):
        fm.linear_term_update(arrays(w=[0]), 0.0, arrays(w=[0]), arrays(w=[0]))
    with pytest.raises(ValueError, match="alpha > 0"):
        fm.server_model(arrays(w=[0]), arrays(w=[0]), -1.0)


def test_norm():
    assert fm.norm(arrays(a=[3.0], b=[4.0])) == pytest.approx(5.0)
