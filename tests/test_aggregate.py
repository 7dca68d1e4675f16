"""Tests for strategies.engine.averaging: the pure numpy math of the FedAvg family.

Expected values are computed by hand and written into the tests, not recomputed with the
same formula. ``update`` is :func:`strategies.engine.averaging.streamed_update`, the function the
strategies call at run time.
"""

import math

import numpy as np
import pytest

from strategies.engine import averaging as agg
from strategies.engine import sampling
from strategies import contract as C


def fixed(c) -> agg.Coefficients:
    """Coefficients c_k given directly (shares c_k, scale 1)."""
    return agg.Coefficients(np.asarray(c, dtype=np.float64), agg.FIXED, 1.0, fixed=1.0)


def update(global_arrays, clients, coefficients, server_lr=1.0):
    """w + eta_g sum_k c_k (w_k - w) over all clients, through the streaming path."""
    if not isinstance(coefficients, agg.Coefficients):
        coefficients = fixed(coefficients)
    new, used, _ = agg.streamed_update(global_arrays, enumerate(clients), coefficients, server_lr)
    assert used == list(range(len(clients)))
    return new


# ------------------------------------------------------- examples / uniform
def test_coefficients_by_examples_hand_computed():
    np.testing.assert_allclose(agg.coefficients_by_examples([10, 30]).values(), [0.25, 0.75])
    np.testing.assert_allclose(agg.coefficients_by_examples([1, 1, 2]).values(), [0.25, 0.25, 0.5])


def test_coefficients_uniform_hand_computed():
    np.testing.assert_allclose(agg.coefficients_uniform(4).values(), [0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(agg.coefficients_uniform(1).values(), [1.0])


def test_weighted_equals_naive_when_sizes_equal():
    # Weighted and naive aggregation agree when all n_k are equal.
    np.testing.assert_allclose(agg.coefficients_by_examples([50, 50, 50]).values(),
                               agg.coefficients_uniform(3).values())
    rng = np.random.default_rng(0)
    global_arrays = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    clients = [{k: v + rng.normal(size=v.shape) for k,
                v in global_arrays.items()} for _ in range(3)]
    weighted = update(global_arrays, clients, agg.coefficients_by_examples([7, 7, 7]))
    naive = update(global_arrays, clients, agg.coefficients_uniform(3))
    for key in global_arrays:
        np.testing.assert_allclose(weighted[key], naive[key])
    # and both equal the plain mean of the three client models
    for key in global_arrays:
        np.testing.assert_allclose(weighted[key],
                                   (clients[0][key] + clients[1][key] + clients[2][key]) / 3)


def test_streamed_update_two_clients_by_examples():
    global_arrays = {"w": np.array([0.0, 0.0])}
    clients = [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}]
    new = update(global_arrays, clients, agg.coefficients_by_examples([10, 30]))
    # 0.25 * [1, 2] + 0.75 * [3, 6] = [0.25 + 2.25, 0.5 + 4.5]
    np.testing.assert_allclose(new["w"], [2.5, 5.0])


def test_streamed_update_uniform_two_clients():
    global_arrays = {"w": np.array([0.0, 0.0])}
    clients = [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}]
    new = update(global_arrays, clients, agg.coefficients_uniform(2))
    np.testing.assert_allclose(new["w"], [2.0, 4.0])


def test_server_lr_one_equals_model_averaging():
    # Option I with eta_g = 1 equals Option II (sum_k c_k w_k) when sum c = 1.
    rng = np.random.default_rng(42)
    shapes = {"conv.weight": (4, 3, 3, 3), "conv.bias": (4,), "fc.weight": (10, 16), "scalar": ()}
    global_arrays = {k: rng.normal(size=s) for k, s in shapes.items()}
    clients = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(4)]
    coefficients = agg.coefficients_by_examples([12, 5, 40, 3])
    c = coefficients.values()
    new = update(global_arrays, clients, coefficients, server_lr=1.0)
    for key in shapes:
        expected = sum(c_k * cl[key] for c_k, cl in zip(c, clients))
        assert new[key].shape == shapes[key]
        np.testing.assert_allclose(new[key], expected, rtol=1e-12, atol=1e-12)


def test_server_lr_half_gives_halfway_point():
    global_arrays = {"w": np.array([0.0, 0.0]), "b": np.array([4.0])}
    clients = [{"w": np.array([1.0, 2.0]), "b": np.array([8.0])},
               {"w": np.array([3.0, 6.0]), "b": np.array([0.0])}]
    new = update(global_arrays, clients, [0.25, 0.75], server_lr=0.5)
    # full step would reach w=[2.5, 5.0], b=0.25*8+0.75*0=2; half of the way from w_t:
    np.testing.assert_allclose(new["w"], [1.25, 2.5])
    np.testing.assert_allclose(new["b"], [3.0])


def test_server_lr_two_overshoots():
    new = update({"w": np.array([1.0])}, [{"w": np.array([3.0])}], [1.0], server_lr=2.0)
    np.testing.assert_allclose(new["w"], [5.0])


# ---------------------------------------------------------------- pre-erratum
def test_coefficients_pre_erratum_hand_computed():
    np.testing.assert_allclose(agg.coefficients_pre_erratum([10, 30], 100).values(), [0.1, 0.3])


def test_pre_erratum_update_unsampled_mass_keeps_global():
    # sum_{k not in S} (n_k/n) w_t + sum_{k in S} (n_k/n) w_k = 0.6*1 + 0.1*2 + 0.3*5 = 2.3
    global_arrays = {"w": np.array([1.0])}
    clients = [{"w": np.array([2.0])}, {"w": np.array([5.0])}]
    new = update(global_arrays, clients, agg.coefficients_pre_erratum([10, 30], 100))
    np.testing.assert_allclose(new["w"], [2.3])


def test_pre_erratum_equals_erratum_when_all_clients_sampled():
    np.testing.assert_allclose(agg.coefficients_pre_erratum([10, 30], 40).values(), [0.25, 0.75])


def test_pre_erratum_total_smaller_than_sampled_is_an_error():
    with pytest.raises(ValueError, match="total_examples"):
        agg.coefficients_pre_erratum([10, 30], 39)


# ---------------------------------------------------------------- scheme I
def test_coefficients_scheme_i_hand_computed():
    np.testing.assert_allclose(agg.coefficients_scheme_i([2, 0, 1]).values(), [2 / 3, 0.0, 1 / 3])


def test_coefficients_scheme_i_no_draws_is_an_error():
    with pytest.raises(ValueError):
        agg.coefficients_scheme_i([0, 0])


def test_scheme_i_update_is_plain_mean_over_draws():
    # draws: client A twice, client B once -> (3 + 3 + 6) / 3 = 4
    global_arrays = {"w": np.array([0.0])}
    clients = [{"w": np.array([3.0])}, {"w": np.array([6.0])}]
    new = update(global_arrays, clients, agg.coefficients_scheme_i([2, 1]))
    np.testing.assert_allclose(new["w"], [4.0])


# ---------------------------------------------------------------- scheme II
def test_coefficients_scheme_ii_hand_computed():
    # p = (0.2, 0.4), N = 4, K = 2 -> c = p * 2
    np.testing.assert_allclose(agg.coefficients_scheme_ii([0.2, 0.4], 4).values(), [0.4, 0.8])


def test_scheme_ii_unbiased_monte_carlo():
    # Li et al. 2020, Scheme II is unbiased: E[(N/K) sum_{k in S} p_k] = 1 under uniform
    # K-of-N sampling.
    n_clients, k = 10, 3
    sizes = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89], dtype=float)
    p = sizes / sizes.sum()
    sums = []
    for seed in range(4000):
        rng = np.random.default_rng(seed)
        sampled = sampling.sample_without_replacement(rng, n_clients, k)
        sums.append(agg.coefficients_scheme_ii(p[sampled], n_clients).values().sum())
    sums = np.array(sums)
    assert abs(sums.mean() - 1.0) < 0.02
    assert sums.std() > 0.1  # unbalanced: individual rounds are far from 1


def test_scheme_ii_balanced_sums_to_one_every_sample():
    n_clients, k = 10, 3
    p = np.full(n_clients, 1 / n_clients)
    for seed in range(200):
        sampled = sampling.sample_without_replacement(np.random.default_rng(seed), n_clients, k)
        c = agg.coefficients_scheme_ii(p[sampled], n_clients).values()
        assert math.isclose(c.sum(), 1.0, rel_tol=0, abs_tol=1e-12)


def test_scheme_ii_update_hand_computed():
    # p = (0.2, 0.4), N = 4, K = 2: c = (0.4, 0.8); w = 1 + 0.4*(2-1) + 0.8*(3-1) = 3.0
    new = update(
        {"w": np.array([1.0])}, [{"w": np.array([2.0])}, {"w": np.array([3.0])}],
        agg.coefficients_scheme_ii([0.2, 0.4], 4),
    )
    np.testing.assert_allclose(new["w"], [3.0])


# ------------------------------------------------------------------- dtypes
def test_integer_arrays_get_rounded_weighted_mean_dtype_preserved():
    global_arrays = {
        "bn.weight": np.array([1.0, 1.0], dtype=np.float32),
        "bn.num_batches_tracked": np.array([100], dtype=np.int64),
    }
    clients = [
        {"bn.weight": np.array([2.0, 0.0], dtype=np.float32),
         "bn.num_batches_tracked": np.array([110], dtype=np.int64)},
        {"bn.weight": np.array([4.0, 2.0], dtype=np.float32),
         "bn.num_batches_tracked": np.array([130], dtype=np.int64)},
    ]
    new = update(global_arrays, clients, [0.25, 0.75], server_lr=0.5)
    # int: 0.25*110 + 0.75*130 = 125 (a mean of clients' values; server_lr does not apply)
    assert isinstance(new["bn.num_batches_tracked"], np.ndarray)
    assert new["bn.num_batches_tracked"].dtype == np.int64
    assert new["bn.num_batches_tracked"].tolist() == [125]
    # float: 1 + 0.5 * (0.25*[1,-1] + 0.75*[3,1]) = 1 + 0.5*[2.5, 0.5] = [2.25, 1.25]
    assert isinstance(new["bn.weight"], np.ndarray)
    assert new["bn.weight"].dtype == np.float32
    np.testing.assert_allclose(new["bn.weight"], [2.25, 1.25])


def test_zero_dim_integer_value_and_dtype():
    # PyTorch's BatchNorm num_batches_tracked is a 0-d int64 tensor.
    new = update(
        {"nbt": np.array(100, dtype=np.int64)},
        [{"nbt": np.array(110, dtype=np.int64)}, {"nbt": np.array(130, dtype=np.int64)}],
        [0.25, 0.75],
    )
    assert new["nbt"].dtype == np.int64 and new["nbt"].shape == ()
    assert int(new["nbt"]) == 125


@pytest.mark.parametrize("dtype", [np.int64, np.float32], ids=["int64", "float32"])
def test_zero_dim_arrays_stay_ndarrays(dtype):
    new = update(
        {"x": np.array(100, dtype=dtype)},
        [{"x": np.array(110, dtype=dtype)}, {"x": np.array(130, dtype=dtype)}],
        [0.25, 0.75],
    )
    assert isinstance(new["x"], np.ndarray)
    assert new["x"].dtype == dtype and new["x"].shape == ()


def test_integer_arrays_rounded_and_normalised_when_sum_c_not_one():
    # pre-erratum coefficients (0.1, 0.3): the int key still gets a mean, normalised:
    # (0.1*10 + 0.3*13) / 0.4 = 4.9 / 0.4 = 12.25 -> 12
    new = update(
        {"n": np.array([0, 0], dtype=np.int64)},
        [{"n": np.array([10, 3], dtype=np.int64)}, {"n": np.array([13, 4], dtype=np.int64)}],
        [0.1, 0.3],
    )
    assert new["n"].dtype == np.int64
    # second entry: (0.1*3 + 0.3*4) / 0.4 = 1.5 / 0.4 = 3.75 -> 4
    assert new["n"].tolist() == [12, 4]


def test_float32_stays_float32():
    global_arrays = {"w": np.zeros((2, 2), dtype=np.float32)}
    clients = [{"w": np.ones((2, 2), dtype=np.float32)},
               {"w": np.full((2, 2), 3, dtype=np.float32)}]
    new = update(global_arrays, clients, [0.5, 0.5])
    assert new["w"].dtype == np.float32
    np.testing.assert_allclose(new["w"], np.full((2, 2), 2.0))


def test_streamed_update_does_not_modify_inputs():
    global_arrays = {"w": np.array([1.0, 2.0])}
    clients = [{"w": np.array([3.0, 4.0])}]
    update(global_arrays, clients, [1.0])
    assert global_arrays["w"].tolist() == [1.0, 2.0]
    assert clients[0]["w"].tolist() == [3.0, 4.0]


# ---------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "num_examples",
    [[10, 0], [10, -5], [10, float("nan")], [float("inf"), 1], []],
    ids=["zero", "negative", "nan", "inf", "empty"],
)
def test_coefficients_by_examples_rejects_bad_sizes(num_examples):
    with pytest.raises(ValueError, match="num_examples"):
        agg.coefficients_by_examples(num_examples)


@pytest.mark.parametrize("num_examples", [[0, 10], [-1, 10], [float("nan"), 10], []])
def test_coefficients_pre_erratum_rejects_bad_sizes(num_examples):
    with pytest.raises(ValueError):
        agg.coefficients_pre_erratum(num_examples, 100)


def test_coefficients_uniform_rejects_zero():
    with pytest.raises(ValueError):
        agg.coefficients_uniform(0)


def test_streamed_update_without_models_keeps_nothing():
    new, used, sums = agg.streamed_update({"w": np.zeros(1)}, iter(()), agg.coefficients_uniform(2))
    assert new is None and used == [] and sums == {}


def test_weighted_model_sum_update_needs_a_model():
    with pytest.raises(ValueError, match="no client model"):
        agg.WeightedModelSum().update({"w": np.zeros(1)}, 1.0)


# ------------------------------------------------- a reply dropped while streaming
def test_dropped_reply_renormalises_examples():
    # n = (10, 30, 60); reply 1 dropped: c = (10, 60) / 70
    c = agg.coefficients_by_examples([10, 30, 60])
    np.testing.assert_allclose(c.values([0, 2]), [1 / 7, 6 / 7])
    clients = [{"w": np.array([7.0])}, {"w": np.array([100.0])}, {"w": np.array([14.0])}]
    new, used, _ = agg.streamed_update({"w": np.array([0.0])}, [(0, clients[0]), (2, clients[2])],
                                       c)
    assert used == [0, 2]
    np.testing.assert_allclose(new["w"], [1.0 + 12.0])  # 7/7 + 6*14/7


def test_dropped_reply_pre_erratum_keeps_its_mass_on_the_global_model():
    # n = (10, 30), n = 100; reply 1 dropped: c_0 = 0.1 still, w = 1 + 0.1 (2 - 1) = 1.1
    c = agg.coefficients_pre_erratum([10, 30], 100)
    np.testing.assert_allclose(c.values([0]), [0.1])
    new, _, _ = agg.streamed_update({"w": np.array([1.0])}, [(0, {"w": np.array([2.0])})], c)
    np.testing.assert_allclose(new["w"], [1.1])


def test_dropped_reply_scheme_ii_uses_the_replies_received():
    # p = (0.2, 0.4, 0.1), N = 4; reply 2 dropped -> K' = 2: c = p N / 2 = (0.4, 0.8)
    c = agg.coefficients_scheme_ii([0.2, 0.4, 0.1], 4)
    np.testing.assert_allclose(c.values([0, 1]), [0.4, 0.8])
    np.testing.assert_allclose(c.values(), [0.2 * 4 / 3, 0.4 * 4 / 3, 0.1 * 4 / 3])


def test_coefficients_fednova_hand_computed():
    # n = (1, 3), ||a|| = (2, 6): p = (1/4, 3/4), tau_eff = 2/4 + 18/4 = 5,
    # c_i = tau_eff p_i / a_i = (5/8, 5/8)
    c = agg.coefficients_fednova([1, 3], [2, 6])
    np.testing.assert_allclose(c.values(), [5 / 8, 5 / 8])
    # reply 0 dropped: p = (1,), tau_eff = 6, c = 6 * 1 / 6 = 1
    np.testing.assert_allclose(c.values([1]), [1.0])
    with pytest.raises(ValueError, match="a_norms"):
        agg.coefficients_fednova([1, 3], [2, 0])


def test_total_examples_and_data_shares():
    assert agg.total_examples([10, 30, None, 0]) == 10 + 30 + 20 + 20  # unknown -> mean known
    assert agg.total_examples([None]) == 0.0
    np.testing.assert_allclose(agg.data_shares([10, 30]), [0.25, 0.75])
    assert agg.data_shares([10, None]) is None


# ---------------------------------------------------------------- S000 imbalance toy
def test_s000_imbalance_toy_weighted_mean_local_steps():
    # sizes (10, 90), B = 1, E = 1 -> steps u_k = E n_k / B = (10, 90);
    # size-weighted mean = (10*10 + 90*90) / 100 = 82; balanced (50, 50) -> 50.
    sizes = np.array([10, 90])
    batch, epochs = 1, 1
    steps = epochs * sizes / batch
    assert float(agg.coefficients_by_examples(sizes).values() @ steps) == pytest.approx(82.0)
    # naive averaging of the same imbalanced clients: still 50
    assert float(agg.coefficients_uniform(2).values() @ steps) == pytest.approx(50.0)
    balanced = np.array([50, 50])
    balanced_steps = epochs * balanced / batch
    c = agg.coefficients_by_examples(balanced).values()
    assert float(c @ balanced_steps) == pytest.approx(50.0)


def test_update_drift_cosines_and_norm_spread_by_hand():
    from strategies.engine.averaging import UpdateDrift

    zeros = {"fc.weight": np.zeros(2, np.float32), "fc.bias": np.zeros(1, np.float32),
             "out.weight": np.zeros(2, np.float32)}
    drift = UpdateDrift(zeros)
    # fc updates (1,0,0), (0,1,0), (1,1,0): cosines 0, 1/sqrt2, 1/sqrt2 -> mean sqrt2/3
    # out updates (1,1), (2,2), (-1,-1): cosines 1, -1, -1 -> mean -1/3
    drift.add({"fc.weight": np.array([1, 0], np.float32), "fc.bias": np.array([0], np.float32),
               "out.weight": np.array([1, 1], np.float32)})
    drift.add({"fc.weight": np.array([0, 1], np.float32), "fc.bias": np.array([0], np.float32),
               "out.weight": np.array([2, 2], np.float32)})
    drift.add({"fc.weight": np.array([1, 1], np.float32), "fc.bias": np.array([0], np.float32),
               "out.weight": np.array([-1, -1], np.float32)})
    out = drift.summary().log_items()
    assert out[C.LOG_DRIFT_COSINE]["fc"] == pytest.approx(np.sqrt(2) / 3, abs=1e-6)
    assert out[C.LOG_DRIFT_COSINE]["out"] == pytest.approx(-1 / 3, abs=1e-6)
    norms = np.array([np.sqrt(3), 3.0, 2.0])  # whole-model update norms
    assert out[C.LOG_UPDATE_NORM_MEAN] == pytest.approx(norms.mean())
    assert out[C.LOG_UPDATE_NORM_CV] == pytest.approx(norms.std() / norms.mean())


def test_update_drift_identical_updates_have_cosine_one():
    from strategies.engine.averaging import UpdateDrift

    rng = np.random.default_rng(0)
    g = {"a.weight": rng.standard_normal((3, 4)).astype(np.float32)}
    d = rng.standard_normal((3, 4)).astype(np.float32)
    drift = UpdateDrift(g)
    for scale in (1.0, 2.0, 0.5):
        drift.add({"a.weight": g["a.weight"] + scale * d})
    assert drift.summary().cosine["a"] == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------- streaming: blocks, views, NaN / Inf
def test_add_scaled_blocks_give_the_one_line_numbers():
    rng = np.random.default_rng(1)
    value = rng.normal(size=(2, agg.BLOCK + 7)).astype(np.float32)
    acc = rng.normal(size=value.shape).astype(np.float32)
    expected = acc + value * 0.3
    agg.add_scaled(acc, value, 0.3)
    np.testing.assert_array_equal(acc, expected)


def test_streamed_update_reads_read_only_views():
    # the replies' arrays are read-only views of the message bytes (records.to_numpy)
    w = np.arange(agg.BLOCK + 3, dtype=np.float32)
    clients = [{"w": w + 1.0}, {"w": w + 3.0}]
    for c in clients:
        c["w"].flags.writeable = False
    new = update({"w": w}, clients, agg.coefficients_uniform(2))
    np.testing.assert_array_equal(new["w"], w + 2.0)


def test_non_finite_model_is_left_out_and_named():
    # the sum has NaN -> each model is checked: reply 1 is dropped, c renormalised over 0 and 2
    clients = [{"w": np.array([7.0]), "b": np.array([1.0])},
               {"w": np.array([1.0]), "b": np.array([np.inf])},
               {"w": np.array([14.0]), "b": np.array([1.0])}]
    rejected = []
    new, used, _ = agg.streamed_update(
        {"w": np.array([0.0]), "b": np.array([0.0])}, enumerate(clients),
        agg.coefficients_by_examples([10, 30, 60]),
        on_reject=lambda k, key: rejected.append((k, key)))
    assert used == [0, 2] and rejected == [(1, "b")]
    np.testing.assert_allclose(new["w"], [13.0])  # (10 * 7 + 60 * 14) / 70


def test_all_finite_finds_nan_inf_and_not_an_overflowing_sum():
    assert agg.all_finite({"a": np.ones(3), "n": np.arange(3)}) is None
    assert agg.all_finite({"a": np.ones(3), "b": np.array([1.0, np.nan])}) == "b"
    assert agg.all_finite({"a": np.array([-np.inf, np.inf])}) == "a"
    big = np.full(4, np.finfo(np.float32).max, dtype=np.float32)  # finite, the sum overflows
    assert agg.all_finite({"big": big}) is None
