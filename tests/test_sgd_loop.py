"""The one local-SGD loop (strategies/client/sgd_loop.py): step counts, batches, seeds,
determinism, FedProx's term, momentum and weight decay by hand, the caller's own optimiser,
and the optimiser hooks the helpers install."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from strategies import contract as C
from strategies.client import LocalResult, ProximalTerm, batch_indices, client_seed, local_sgd
from strategies.client.sgd_loop import sgd_steps
from task.evaluate import evaluate
from task.models import build_model

from tests.tiny_torch import SHAPE, Quadratic, all_equal, params, tiny_data, tiny_model


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b)))


def record_batches(model: nn.Module) -> list[int]:
    """Sizes of the batches the model's forward sees (one forward per SGD step)."""
    sizes: list[int] = []
    model.register_forward_hook(lambda _m, inputs, _out: sizes.append(len(inputs[0])))
    return sizes


def quad_run(steps: int, **kwargs) -> tuple[float, LocalResult]:
    model = Quadratic(0.0)
    x, y = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64)
    result = local_sgd(model, x, y, lr=0.1, batch_size=0, steps=steps, **kwargs)
    return float(model.w.detach()), result


# ----------------------------------------------------------------- step counts
@pytest.mark.parametrize(
    "n, batch_size, epochs, expected_sizes",
    [
        (10, 3, 1, [3, 3, 3]),
        (10, 3, 2, [3] * 6),  # floor(2 * 10 / 3) = 6, not 2 * floor(10 / 3)
        (12, 4, 3, [4, 4, 4] * 3),
        (10, 10, 2, [10, 10]),
        (10, 25, 2, [10, 10]),  # B > n: the whole partition per step
        (10, 1, 1, [1] * 10),
        (7, 0, 1, [7]),  # B = 0: full batch
        (7, 0, 4, [7] * 4),
    ],
)
def test_local_sgd_epochs_take_floor_e_n_over_b_steps(n, batch_size, epochs, expected_sizes):
    x, y = tiny_data(n)
    model = tiny_model()
    sizes = record_batches(model)
    result = local_sgd(model, x, y, lr=0.01, batch_size=batch_size, epochs=epochs, seed=3)
    expected_steps = epochs if batch_size <= 0 or batch_size >= n else (epochs * n) // batch_size
    assert result.local_steps == expected_steps == len(expected_sizes)
    assert sizes == expected_sizes
    assert result.num_examples == n
    assert math.isfinite(result.train_loss)


@pytest.mark.parametrize("steps, batch_size, expected_sizes", [
    (5, 3, [3, 3, 3, 3, 3]),  # runs on into the next epoch
    (2, 3, [3, 3]),  # stops mid-epoch
    (3, 0, [10, 10, 10]),
    (1, 4, [4]),
])
def test_local_sgd_steps_override_epochs(steps, batch_size, expected_sizes):
    x, y = tiny_data(10)
    model = tiny_model()
    sizes = record_batches(model)
    result = local_sgd(model, x, y, lr=0.01, batch_size=batch_size, epochs=7, steps=steps, seed=1)
    assert result.local_steps == steps
    assert sizes == expected_sizes
    assert result.num_examples == 10


@pytest.mark.parametrize("n, b, e, expected", [(10, 3, 1, 3), (9, 3, 1, 3), (10, 0, 1, 1), (10, 10, 1, 1),
                                               (10, 20, 3, 3), (1, 1, 1, 1), (60000, 32, 1, 1875),
                                               (60001, 32, 1, 1875), (10, 3, 2, 6), (600, 10, 20, 1200),
                                               (600, 50, 1, 12), (2, 3, 1, 1), (0, 3, 1, 0), (10, 3, 0, 0)])
def test_steps_for_epochs_is_floor_e_n_over_b(n, b, e, expected):
    assert C.steps_for_epochs(n, b, e) == expected


def test_train_loss_is_mean_minibatch_loss():
    # Quadratic losses at w = 0 and w = 0.3: 4.5 and 0.5 * 2.7^2 = 3.645.
    _, result = quad_run(2)
    assert result.train_loss == pytest.approx((4.5 + 3.645) / 2, rel=1e-6)


# ----------------------------------------------------------------- determinism
def test_same_seed_is_bit_identical():
    x, y = tiny_data(30)
    base = tiny_model()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    ra = local_sgd(a, x, y, lr=0.05, batch_size=4, epochs=2, momentum=0.9, weight_decay=1e-3, seed=11)
    rb = local_sgd(b, x, y, lr=0.05, batch_size=4, epochs=2, momentum=0.9, weight_decay=1e-3, seed=11)
    assert all_equal(params(a), params(b))
    assert ra == rb


def test_different_seed_gives_different_weights():
    x, y = tiny_data(30)
    base = tiny_model()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    local_sgd(a, x, y, lr=0.05, batch_size=4, epochs=1, seed=11)
    local_sgd(b, x, y, lr=0.05, batch_size=4, epochs=1, seed=12)
    assert not all_equal(params(a), params(b))


def test_seed_does_not_touch_global_rng():
    x, y = tiny_data(30)
    model = tiny_model()
    state = torch.get_rng_state()
    local_sgd(model, x, y, lr=0.05, batch_size=4, epochs=1, seed=11)
    assert torch.equal(torch.get_rng_state(), state)


# ----------------------------------------------------------------- FedProx
def test_fedprox_mu_zero_equals_plain_sgd_exactly():
    x, y = tiny_data(25)
    base = tiny_model()
    plain, prox0 = copy.deepcopy(base), copy.deepcopy(base)
    r1 = local_sgd(plain, x, y, lr=0.1, batch_size=5, epochs=2, momentum=0.5, seed=4)
    r2 = local_sgd(prox0, x, y, lr=0.1, batch_size=5, epochs=2, momentum=0.5, seed=4, proximal_mu=0.0)
    for p, q in zip(plain.parameters(), prox0.parameters()):
        assert torch.equal(p, q)
    assert r1 == r2


def test_fedprox_mu_positive_stays_closer_to_start():
    x, y = tiny_data(40)
    base = tiny_model()
    start = params(base)
    free, prox = copy.deepcopy(base), copy.deepcopy(base)
    local_sgd(free, x, y, lr=0.1, batch_size=8, epochs=5, seed=2, proximal_mu=0.0)
    local_sgd(prox, x, y, lr=0.1, batch_size=8, epochs=5, seed=2, proximal_mu=1.0)
    d_free, d_prox = distance(params(free), start), distance(params(prox), start)
    assert 0 < d_prox < d_free
    assert not all_equal(params(free), params(prox))


def test_fedprox_quadratic_by_hand():
    # grad = (w - 3) + mu * (w - w0), lr 0.1, mu 1, w0 = 0:
    # step 1: grad = -3 -> w = 0.3; step 2: grad = -2.7 + 0.3 = -2.4 -> w = 0.54.
    w1, r1 = quad_run(1, proximal_mu=1.0)
    assert w1 == pytest.approx(0.3, abs=1e-12)
    w2, r2 = quad_run(2, proximal_mu=1.0)
    assert w2 == pytest.approx(0.54, abs=1e-12)
    assert r2.local_steps == 2
    # The reported loss is the data loss F_k(w), without the proximal term.
    assert r2.train_loss == pytest.approx((4.5 + 3.645) / 2, rel=1e-6)
    # Without the proximal term: 0.3, then 0.3 + 0.1 * 2.7 = 0.57.
    assert quad_run(2)[0] == pytest.approx(0.57, abs=1e-12)


# ----------------------------------------------------------------- momentum, weight decay
def test_momentum_matches_torch_sgd_by_hand():
    lr, beta = 0.1, 0.9
    w0 = 0.0
    g1 = w0 - 3.0
    v1 = g1
    w1 = w0 - lr * v1  # 0.3
    g2 = w1 - 3.0
    v2 = beta * v1 + g2
    w2 = w1 - lr * v2  # 0.3 + 0.1 * 5.4 = 0.84
    assert w2 == pytest.approx(0.84)
    got, _ = quad_run(2, momentum=beta)
    assert got == pytest.approx(w2, abs=1e-12)
    assert got != pytest.approx(quad_run(2)[0], abs=1e-6)


def test_momentum_with_proximal_term_by_hand():
    # g1 = -3 (prox 0), v1 = -3, w1 = 0.3; g2 = -2.7 + 0.3 = -2.4, v2 = -2.7 - 2.4 = -5.1, w2 = 0.81.
    got, _ = quad_run(2, momentum=0.9, proximal_mu=1.0)
    assert got == pytest.approx(0.81, abs=1e-12)


def test_weight_decay_by_hand():
    # g = (w - 3) + wd * w, wd = 0.5: g1 = -3 -> w1 = 0.3; g2 = -2.7 + 0.15 = -2.55 -> w2 = 0.555.
    got, _ = quad_run(2, weight_decay=0.5)
    assert got == pytest.approx(0.555, abs=1e-12)


# ----------------------------------------------------------------- edge cases
def test_empty_partition():
    model = tiny_model()
    before = params(model)
    x, y = torch.zeros(0, *SHAPE), torch.zeros(0, dtype=torch.int64)
    result = local_sgd(model, x, y, lr=0.1, batch_size=4, epochs=3, seed=0)
    assert result.num_examples == 0
    assert result.local_steps == 0
    assert all_equal(before, params(model))
    result = local_sgd(model, x, y, lr=0.1, batch_size=0, steps=5, proximal_mu=0.1, seed=0)
    assert (result.num_examples, result.local_steps) == (0, 0)


def test_local_sgd_changes_model_and_lowers_loss():
    x, y = tiny_data(32)
    model = tiny_model()
    before = evaluate(model, x, y).loss
    local_sgd(model, x, y, lr=0.1, batch_size=8, epochs=10, seed=0)
    assert evaluate(model, x, y).loss < before


def test_cnn_small_on_28x28():
    torch.manual_seed(0)
    model = build_model("cnn-small", (1, 28, 28), 10)
    x, y = torch.randn(6, 1, 28, 28), torch.randint(0, 10, (6,))
    sizes = record_batches(model)
    result = local_sgd(model, x, y, lr=0.01, batch_size=4, epochs=1, seed=0)
    assert result.local_steps == 1 and sizes == [4]  # floor(1 * 6 / 4) = 1
    assert math.isfinite(result.train_loss)


# ----------------------------------------------------------------- seeds and batches
def test_client_seed_deterministic_and_distinct():
    assert client_seed(0, 1, 0) == client_seed(0, 1, 0)
    seeds = {client_seed(0, r, p) for r in range(1, 21) for p in range(20)}
    assert len(seeds) == 400
    assert client_seed(0, 1, 0) != client_seed(1, 1, 0)
    assert client_seed(0, 1, 2) != client_seed(0, 2, 1)  # not symmetric in round/partition
    for s in list(seeds)[:50] + [client_seed(2**40, 10**6, 10**5)]:
        assert isinstance(s, int) and 0 <= s < 2**63
    torch.Generator().manual_seed(client_seed(7, 3, 9))  # usable as a torch seed


@pytest.mark.parametrize("n, b", [(10, 3), (12, 4), (10, 1), (5, 5), (5, 9), (7, 0)])
def test_batch_indices_are_cut_from_one_permutation_per_epoch(n, b):
    stream = batch_indices(n, b, torch.Generator().manual_seed(0))
    size = n if b <= 0 or b >= n else b
    batches = []
    while sum(len(batch) for batch in batches) < 4 * n:
        batches.append(next(stream))
    assert all(len(batch) == size and batch.dtype == torch.int64 for batch in batches)
    flat = torch.cat(batches)[: 4 * n]
    epochs = [flat[i * n : (i + 1) * n] for i in range(4)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(n))
    if n >= 5:
        assert any(not torch.equal(epochs[0], e) for e in epochs[1:])  # reshuffled every epoch


def test_batch_indices_depend_only_on_generator_seed():
    a = batch_indices(20, 6, torch.Generator().manual_seed(5))
    b = batch_indices(20, 6, torch.Generator().manual_seed(5))
    c = batch_indices(20, 6, torch.Generator().manual_seed(6))
    la = [next(a) for _ in range(8)]
    lb = [next(b) for _ in range(8)]
    lc = [next(c) for _ in range(8)]
    assert all(torch.equal(p, q) for p, q in zip(la, lb))
    assert not all(torch.equal(p, q) for p, q in zip(la, lc))




# ----------------------------------------------------------------- the caller's own optimiser
def test_a_callers_own_optimizer_runs_as_built_on_the_same_batches():
    """local_sgd(optimizer=Adam) is the hand loop with that Adam on batch_indices' batches."""
    x, y = tiny_data(30)
    base = tiny_model()
    mine, hand = copy.deepcopy(base), copy.deepcopy(base)
    adam = torch.optim.Adam(mine.parameters(), lr=0.01, weight_decay=1e-3)
    result = local_sgd(mine, x, y, batch_size=7, epochs=2, seed=5, optimizer=adam)
    reference = torch.optim.Adam(hand.parameters(), lr=0.01, weight_decay=1e-3)
    stream = batch_indices(30, 7, torch.Generator().manual_seed(5))
    losses = []
    for _ in range((2 * 30) // 7):
        idx = next(stream)
        reference.zero_grad()
        loss = hand.loss(hand(x[idx]), y[idx])
        loss.backward()
        reference.step()
        losses.append(float(loss.detach()))
    assert all_equal(params(mine), params(hand))
    assert result.local_steps == 8 and result.train_loss == pytest.approx(sum(losses) / 8,
                                                                          rel=1e-12)
    assert adam.state_dict()["state"][0]["step"] == 8  # the caller's optimiser took the steps


def test_optimizer_or_lr_not_both_not_neither():
    x, y = tiny_data(10)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer's own settings"):
        local_sgd(model, x, y, batch_size=4, optimizer=opt, lr=0.1)
    with pytest.raises(ValueError, match="optimizer's own settings"):
        local_sgd(model, x, y, batch_size=4, optimizer=opt, momentum=0.9)
    with pytest.raises(ValueError, match="needs an optimizer or an lr"):
        local_sgd(model, x, y, batch_size=4)


def test_proximal_term_wraps_a_users_momentum_loop_by_hand():
    # the user's loop and optimiser (momentum 0.9), the term installed on it:
    # g1 = -3 (prox 0), v1 = -3, w1 = 0.3; g2 = -2.7 + 0.3 = -2.4, v2 = -2.7 - 2.4 = -5.1, w2 = 0.81
    model = Quadratic(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    term = ProximalTerm(model, 1.0)
    assert term.wrap(optimizer) is optimizer
    for _ in range(2):
        optimizer.zero_grad()
        model.loss(None, None).backward()
        optimizer.step()
    assert float(model.w.detach()) == pytest.approx(0.81, abs=1e-12)
    term.unwrap()  # off again: the next step is plain momentum SGD
    optimizer.zero_grad()
    model.loss(None, None).backward()  # g3 = 0.81 - 3 = -2.19; v3 = 0.9 * -5.1 - 2.19 = -6.78
    optimizer.step()
    assert float(model.w.detach()) == pytest.approx(0.81 + 0.678, abs=1e-12)


def test_local_sgd_takes_its_proximal_term_off_the_callers_optimizer():
    model = Quadratic(0.0)
    x, y = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local_sgd(model, x, y, batch_size=0, steps=2, optimizer=optimizer, proximal_mu=1.0)
    assert float(model.w.detach()) == pytest.approx(0.54, abs=1e-12)  # as quad_run's by hand
    local_sgd(model, x, y, batch_size=0, steps=1, optimizer=optimizer)  # g = -2.46, no term
    assert float(model.w.detach()) == pytest.approx(0.54 + 0.246, abs=1e-12)


def test_a_helper_wraps_one_optimizer_once_and_only_an_optimizer():
    model = Quadratic(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    term = ProximalTerm(model, 1.0)
    term.wrap(optimizer)
    with pytest.raises(ValueError, match="already wraps an optimizer"):
        term.wrap(optimizer)
    term.unwrap()
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        term.wrap(object())
    with pytest.raises(ValueError, match="proximal-mu must be >= 0"):
        ProximalTerm(model, -0.1)


# ----------------------------------------------------------------- the loop's own hooks
def test_forward_hook_extra_is_differentiated_but_not_reported():
    # extra = 0.5 w^2: gradient (w - 3) + w; w1 = 0.3, w2 = 0.3 + 0.1 * 2.4 = 0.54;
    # the reported loss is the model's own: (4.5 + 3.645) / 2
    model = Quadratic(0.0)
    x, y = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64)

    def forward(m, xb):
        return m(xb), 0.5 * (m.w ** 2).sum()

    result = local_sgd(model, x, y, lr=0.1, batch_size=0, steps=2, forward=forward)
    assert float(model.w.detach()) == pytest.approx(0.54, abs=1e-12)
    assert result.train_loss == pytest.approx((4.5 + 3.645) / 2, rel=1e-12)


def test_on_gradients_sees_each_batch_and_its_gradient_before_the_step():
    model = Quadratic(0.0)
    x, y = torch.arange(10.0).reshape(10, 1), torch.zeros(10, dtype=torch.int64)
    seen = []

    def look(m, xb, yb):
        seen.append((len(xb), len(yb), float(m.w.grad), float(m.w.detach())))

    local_sgd(model, x, y, lr=0.1, batch_size=4, steps=3, on_gradients=look)
    # w: 0 -> 0.3 -> 0.57; the gradient (w - 3) at the weights before each step
    assert seen == [(4, 4, -3.0, 0.0), (4, 4, pytest.approx(-2.7), pytest.approx(0.3)),
                    (4, 4, pytest.approx(-2.43), pytest.approx(0.57))]


def test_sgd_steps_runs_one_step_per_batch_given():
    model = Quadratic(0.0)
    batches = [(torch.zeros(2, 1), torch.zeros(2, dtype=torch.int64))] * 3
    steps, loss = sgd_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batches)
    assert steps == 3 and float(model.w.detach()) == pytest.approx(3 - 3 * 0.9 ** 3, abs=1e-12)
    assert loss == pytest.approx((4.5 + 0.5 * 2.7 ** 2 + 0.5 * 2.43 ** 2) / 3, rel=1e-12)
    assert math.isnan(sgd_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), [])[1])
