"""Tests for strategies.engine.sampling: m = max(floor(C K), 1), seeded sampling, stragglers, and
the local work a client runs for E epochs (hand-computed numbers)."""

import numpy as np
import pytest

from strategies import contract as C
from strategies.engine import sampling


# ---------------------------------------------------------------- num_to_sample
@pytest.mark.parametrize(
    "fraction, num_clients, expected",
    [
        (0.0, 100, 1),  # C = 0 means exactly one client per round
        (0.0, 1, 1),
        (0.1, 100, 10),
        (0.29, 100, 29),  # 0.29 * 100 = 28.999999999999996 in floating point
        (1.0, 7, 7),
        (0.5, 3, 1),  # floor(1.5)
        (0.35, 10, 3),
        (0.01, 10, 1),  # floor(0.1) = 0 -> at least one
    ],
)
def test_num_to_sample(fraction, num_clients, expected):
    assert sampling.num_to_sample(fraction, num_clients) == expected


def test_num_to_sample_never_exceeds_population():
    assert sampling.num_to_sample(1.0, 1) == 1
    assert sampling.num_to_sample(1.0, 100) == 100


def test_num_to_sample_rejects_empty_population():
    with pytest.raises(ValueError):
        sampling.num_to_sample(0.5, 0)


def test_sample_without_replacement_distinct_sorted_and_seeded():
    a = sampling.sample_without_replacement(np.random.default_rng([3, 1]), 10, 4)
    b = sampling.sample_without_replacement(np.random.default_rng([3, 1]), 10, 4)
    assert a.tolist() == b.tolist()
    assert len(set(a.tolist())) == 4
    assert a.tolist() == sorted(a.tolist())
    assert all(0 <= i < 10 for i in a)


def test_sample_with_replacement_counts_sum_to_k():
    p = [0.1, 0.2, 0.3, 0.4]
    for seed in range(20):
        counts = sampling.sample_with_replacement(np.random.default_rng(seed), p, 5)
        assert counts.shape == (4,)
        assert counts.sum() == 5
        assert np.all(counts >= 0)


def test_sample_with_replacement_frequencies_match_p():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    total = np.zeros(4)
    draws_per_call, calls = 10, 2000
    for seed in range(calls):
        total += sampling.sample_with_replacement(np.random.default_rng(seed), p, draws_per_call)
    freq = total / (draws_per_call * calls)
    np.testing.assert_allclose(freq, p, atol=0.015)


def test_sample_with_replacement_accepts_unnormalised_sizes():
    # sizes instead of probabilities: a client of size 0 is never drawn
    counts = sampling.sample_with_replacement(np.random.default_rng(0), [0, 5, 5], 50)
    assert counts[0] == 0 and counts.sum() == 50


# ---------------------------------------------------------------- one round's sample
def test_sample_round_is_seeded_and_keyed_by_position():
    a = sampling.sample_round(3, 1, 10, 0.4)
    assert a == sampling.sample_round(3, 1, 10, 0.4)
    assert len(a) == 4 and set(a.values()) == {1}
    expected = np.sort(np.random.default_rng([3, 1]).choice(10, size=4, replace=False))
    assert list(a) == expected.tolist()
    assert sampling.sample_round(3, 2, 10, 0.4) != a or sampling.sample_round(4, 1, 10, 0.4) != a


def test_sample_round_with_replacement_counts_draws():
    draws = sampling.sample_round(0, 1, 4, 1.0, probabilities=[0.1, 0.2, 0.3, 0.4])
    assert sum(draws.values()) == 4 and all(c > 0 for c in draws.values())
    counts = np.random.default_rng([0, 1]).choice(4, size=4, replace=True, p=[0.1, 0.2, 0.3, 0.4])
    assert draws == {int(k): int(c) for k, c in enumerate(np.bincount(counts, minlength=4)) if c}


def test_round_stragglers_hand_checked():
    assert sampling.round_stragglers(0, 1, 10, 0.0, lambda pos: [5] * len(pos)) == {}
    work = sampling.round_stragglers(7, 2, 10, 0.3, lambda pos: [5] * len(pos))
    assert len(work) == 3 and all(1 <= w <= 5 for w in work.values())
    rng = np.random.default_rng([7, 2, 1])
    mask = sampling.choose_stragglers(rng, 10, 0.3)
    chosen = [i for i in range(10) if mask[i]]
    assert work == dict(zip(chosen, sampling.straggler_steps(rng, [5] * 3).tolist()))


# ---------------------------------------------------------------- local work for E epochs
@pytest.mark.parametrize("n, b, e, drop_last, expected", [
    (100, 32, 1, False, 4),  # ceil(100 / 32) = 4 batches, the last one of 4 examples
    (100, 32, 1, True, 3),  # floor(100 / 32)
    (100, 32, 2, False, 8),
    (100, 25, 3, False, 12),  # 100 / 25 = 4 exactly: both rules agree
    (100, 25, 3, True, 12),
    (10, 32, 2, False, 2),  # B > n: one (short) batch per epoch
    (10, 32, 2, True, 0),  # drop_last drops it: the loop takes no step
    (100, 0, 3, False, 3),  # B = 0: full batch, one step per epoch
    (100, 32, 0.5, False, 2),  # floor(0.5 * 4)
    (100, 32, 0.3, False, 1),  # floor(1.2)
    (100, 1, 0.57, False, 57),  # exact decimal: a float floor gives 56
    (100, 32, 2.0, False, 8),  # an integral float is an integer number of epochs
    (0, 32, 1, False, 0),
    (100, 32, 0, False, 0),
])
def test_dataloader_steps_by_hand(n, b, e, drop_last, expected):
    assert sampling.dataloader_steps(n, b, e, drop_last=drop_last) == expected


@pytest.mark.parametrize("n, b, e, expected", [
    (100, 32, 1, 3), (100, 32, 2, 6), (10, 32, 2, 2), (100, 0, 3, 3), (100, 1, 0.57, 57),
])
def test_steps_for_epochs_is_floor_e_n_over_b(n, b, e, expected):
    assert C.steps_for_epochs(n, b, e) == expected
