"""strategies.client.fedveca (FedVeca's client, Alg. 2) and the FedVeca ClientApp end to end.

* a quadratic F_i(w) = c/2 mean_j ||w - x_j||^2, where h_i, beta, delta and the local
  model after tau full-batch steps are known in closed form;
* a brute-force reference that stores the whole trajectory (what the online version
  avoids) on the squared-SVM and a small CNN, for both beta modes, with minibatches;
* the SGD steps are strategies.client.local_sgd's, bit for bit (same loop, seed, batches);
* the caller's own optimiser (momentum): beta from the measured ||w_k - w^lambda||;
* the whole app in one process (ServerApp + ClientApp through the in-process Grid).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from torch import nn

from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from strategies import contract as C
from strategies.client import batch_indices, local_sgd
from strategies.client.fedveca import fedveca_steps, fedveca_train, local_gradient, subsample_seed
from task.models import ClassifierModule, LinearSVM, cnn_fedveca
from tests.inprocess import InProcessGrid


class Quadratic(ClassifierModule):
    """F(w) = c/2 * mean_j ||w - x_j||^2: grad on a batch b = c (w - mean_b x); Hessian c I."""

    def __init__(self, dim: int, c: float, w0: np.ndarray) -> None:
        super().__init__()
        self.c = c
        self.w = nn.Parameter(torch.tensor(w0, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.c * ((self.w - outputs) ** 2).sum(dim=1).mean()


def quadratic_case(n=40, dim=3, c=2.0, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(n, dim)) + 1.0, dtype=torch.float64)
    w0 = rng.normal(size=dim)
    return Quadratic(dim, c, w0), x, torch.zeros(n, dtype=torch.int64), w0


@pytest.mark.parametrize("mode", ["same-batch", "literal"])
def test_quadratic_full_batch_closed_form(mode):
    model, x, y, w0 = quadratic_case()
    c, lr, tau, g2 = 2.0, 0.05, 7, 0.37
    xbar = x.mean(dim=0).numpy()
    result = fedveca_steps(model, x, y, tau=tau, lr=lr, batch_size=0, beta_mode=mode, gnorm2_prev=g2)
    e0 = w0 - xbar
    q = 1 - lr * c
    # h_i = grad F_i(w_k) = c (w_k - xbar); F_i(w_k) = c/2 mean ||w_k - x_j||^2
    np.testing.assert_allclose(result.grad["w"].numpy(), c * e0, rtol=1e-12)
    assert result.loss_at_global == pytest.approx(0.5 * c * float(((w0 - x.numpy()) ** 2).sum(1).mean()), rel=1e-12)
    # w^tau = xbar + q^tau e0 (gradient descent on a quadratic)
    np.testing.assert_allclose(result.arrays["w"].numpy(), xbar + q**tau * e0, rtol=1e-12)
    # beta = c: full batch, so the literal and the same-batch estimators coincide
    assert result.beta == pytest.approx(c, rel=1e-10)
    # sum_{s<=lam} g^s = c e0 (1 - q^(lam+1)) / (1 - q); delta = max_lam ||.||^2 / ((lam + 1) g2)
    expected = max(float(np.sum((c * e0 * (1 - q ** (lam + 1)) / (1 - q)) ** 2)) / ((lam + 1) * g2)
                   for lam in range(1, tau))
    assert result.delta == pytest.approx(expected, rel=1e-12)
    assert result.local_steps == tau and result.num_examples == 40


def test_quadratic_minibatch_same_batch_beta_is_the_curvature():
    model, x, y, _ = quadratic_case(n=100)
    result = fedveca_steps(model, x, y, tau=10, lr=0.05, batch_size=7, beta_mode="same-batch", gnorm2_prev=1.0)
    assert result.beta == pytest.approx(2.0, rel=1e-10)  # the Hessian is c I whatever the batch
    model, x, y, _ = quadratic_case(n=100)
    literal = fedveca_steps(model, x, y, tau=10, lr=0.05, batch_size=7, beta_mode="literal", gnorm2_prev=1.0)
    assert literal.beta > 2.0  # minibatch noise enters the literal estimator (FedVeca Alg. 2 line 15)


def test_delta_scales_inversely_with_gnorm2_prev():
    out = []
    for g2 in (0.5, 2.0):
        model, x, y, _ = quadratic_case()
        out.append(fedveca_steps(model, x, y, tau=5, lr=0.05, batch_size=8, gnorm2_prev=g2, seed=3))
    assert out[0].delta == pytest.approx(4 * out[1].delta, rel=1e-12)
    assert out[0].beta == pytest.approx(out[1].beta, rel=1e-12)


def test_no_estimate_without_gnorm2_or_with_one_step():
    model, x, y, _ = quadratic_case()
    r = fedveca_steps(model, x, y, tau=5, lr=0.05, batch_size=8, gnorm2_prev=0.0)
    assert r.beta is None and r.delta is None and r.grad
    model, x, y, _ = quadratic_case()
    r = fedveca_steps(model, x, y, tau=1, lr=0.05, batch_size=8, gnorm2_prev=1.0)
    assert r.beta is None and r.delta is None
    model, x, y, _ = quadratic_case()
    r = fedveca_steps(model, x, y, tau=5, lr=0.05, batch_size=8, gnorm2_prev=1.0, estimate=False)
    assert r.beta is None


def test_bad_arguments():
    model, x, y, _ = quadratic_case()
    with pytest.raises(ValueError, match="beta_mode"):
        fedveca_steps(model, x, y, tau=2, lr=0.1, batch_size=4, beta_mode="exact")
    with pytest.raises(ValueError, match="tau"):
        fedveca_steps(model, x, y, tau=0, lr=0.1, batch_size=4)


# ---------------------------------------------------------------- brute-force reference
def reference(model_fn, x, y, tau, lr, batch_size, mode, g2, seed, momentum=0.0):
    """Alg. 2 with the whole trajectory stored; beta's denominator from the stored models.
    ``momentum`` > 0: the steps are heavy-ball SGD (v <- rho v + g, w <- w - lr v)."""
    model = model_fn()
    params = list(model.parameters())
    w0 = [p.detach().clone() for p in params]

    def grad_at(ws, xb, yb):
        with torch.no_grad():
            for p, w in zip(params, ws):
                p.copy_(w)
        model.zero_grad()
        model.loss(model(xb), yb).backward()
        return [p.grad.detach().clone() for p in params]

    h = grad_at(w0, x, y)
    batches = batch_indices(len(y), batch_size, torch.Generator().manual_seed(seed))
    trajectory, grads, velocity = [w0], [], None
    for _ in range(tau):
        idx = next(batches)
        g = grad_at(trajectory[-1], x[idx], y[idx])
        grads.append((g, idx))
        velocity = g if velocity is None else [momentum * v + gi for v, gi in zip(velocity, g)]
        trajectory.append([w - lr * v for w, v in zip(trajectory[-1], velocity)])
    betas, deltas = [], []
    for lam in range(1, tau):
        g, idx = grads[lam]
        dist = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(w0, trajectory[lam])))
        ref = h if mode == "literal" else grad_at(w0, x[idx], y[idx])
        betas.append(math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(ref, g))) / dist)
        total = [sum(gs[0][j] for gs in grads[:lam + 1]) for j in range(len(params))]
        deltas.append(sum(float((t ** 2).sum()) for t in total) / ((lam + 1) * g2))
    return max(betas), max(deltas), trajectory[-1], h


@pytest.mark.parametrize("mode", ["same-batch", "literal"])
@pytest.mark.parametrize("which", ["svm", "cnn"])
def test_online_estimates_equal_trajectory_reference(mode, which):
    torch.manual_seed(0)
    if which == "svm":
        x = torch.rand(64, 1, 6, 6, dtype=torch.float64)
        y = torch.randint(0, 10, (64,))
        def model_fn():
            m = LinearSVM((1, 6, 6)).double()
            with torch.no_grad():
                m.weight.copy_(torch.linspace(-0.3, 0.3, 36, dtype=torch.float64))
            return m
    else:
        x = torch.rand(32, 1, 8, 8, dtype=torch.float64)
        y = torch.randint(0, 10, (32,))
        state = cnn_fedveca((1, 8, 8), 10).double().state_dict()
        def model_fn():
            m = cnn_fedveca((1, 8, 8), 10).double()
            m.load_state_dict(state)
            return m
    tau, lr, bs, g2, seed = 6, 0.05, 8, 0.7, 11
    beta, delta, w_tau, h = reference(model_fn, x, y, tau, lr, bs, mode, g2, seed)
    model = model_fn()
    result = fedveca_steps(model, x, y, tau=tau, lr=lr, batch_size=bs, beta_mode=mode, gnorm2_prev=g2, seed=seed,
                           chunk_size=10)
    assert result.beta == pytest.approx(beta, rel=1e-8)
    assert result.delta == pytest.approx(delta, rel=1e-8)
    for (name, _), w in zip(model.named_parameters(), w_tau):
        torch.testing.assert_close(result.arrays[name], w, rtol=1e-10, atol=1e-12)
    for (name, _), hi in zip(model.named_parameters(), h):
        torch.testing.assert_close(result.grad[name], hi, rtol=1e-10, atol=1e-12)


def test_steps_are_local_sgds_bit_for_bit():
    """The gradient capture only reads the gradients: the steps are local_sgd's, bit for bit."""
    torch.manual_seed(1)
    x, y = torch.rand(50, 1, 8, 8), torch.randint(0, 10, (50,))
    state = cnn_fedveca((1, 8, 8), 10).state_dict()
    a, b = cnn_fedveca((1, 8, 8), 10), cnn_fedveca((1, 8, 8), 10)
    a.load_state_dict(state), b.load_state_dict(state)
    r = fedveca_steps(a, x, y, tau=5, lr=0.1, batch_size=16, seed=4, gnorm2_prev=1.0)
    base = local_sgd(b, x, y, lr=0.1, batch_size=16, steps=5, seed=4)
    assert r.beta is not None
    for k, v in b.state_dict().items():
        assert torch.equal(r.arrays[k], v), k
    assert r.train_loss == base.train_loss


@pytest.mark.parametrize("mode", ["same-batch", "literal"])
def test_a_callers_momentum_optimizer_runs_and_beta_measures_the_distance(mode):
    """With the caller's SGD momentum 0.9 the steps are heavy-ball steps and beta's
    denominator is the measured ||w_k - w^lambda|| (the trajectory reference's)."""
    torch.manual_seed(0)
    x = torch.rand(32, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 10, (32,))
    state = cnn_fedveca((1, 8, 8), 10).double().state_dict()

    def model_fn():
        m = cnn_fedveca((1, 8, 8), 10).double()
        m.load_state_dict(state)
        return m

    tau, lr, bs, g2, seed = 6, 0.05, 8, 0.7, 11
    beta, delta, w_tau, _ = reference(model_fn, x, y, tau, lr, bs, mode, g2, seed, momentum=0.9)
    model = model_fn()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    result = fedveca_steps(model, x, y, tau=tau, batch_size=bs, beta_mode=mode, gnorm2_prev=g2,
                           seed=seed, optimizer=optimizer)
    assert result.beta == pytest.approx(beta, rel=1e-8)
    assert result.delta == pytest.approx(delta, rel=1e-8)
    for (name, _), w in zip(model.named_parameters(), w_tau):
        torch.testing.assert_close(result.arrays[name], w, rtol=1e-10, atol=1e-12)
    _, _, plain_w, _ = reference(model_fn, x, y, tau, lr, bs, mode, g2, seed)
    first = next(name for name, _ in model.named_parameters())
    assert not torch.allclose(result.arrays[first], plain_w[0])  # momentum: not plain SGD


def test_grad_keys_floating_state_only_and_zero_for_buffers():
    class WithNorm(ClassifierModule):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(self.fc(x))

    torch.manual_seed(0)
    model = WithNorm()
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    r = fedveca_steps(model, x, y, tau=3, lr=0.1, batch_size=5, gnorm2_prev=1.0)
    floating = {k for k, v in model.state_dict().items() if torch.is_floating_point(v)}
    assert set(r.grad) == floating and "bn.num_batches_tracked" not in r.grad
    assert torch.count_nonzero(r.grad["bn.running_mean"]) == 0
    assert torch.count_nonzero(r.grad["fc.weight"]) > 0


def test_grad_subsample():
    model, x, y, w0 = quadratic_case(n=100)
    r = fedveca_steps(model, x, y, tau=2, lr=0.05, batch_size=8, grad_subsample=30, seed=5)
    pick = torch.randperm(100, generator=torch.Generator().manual_seed(subsample_seed(5)))[:30]
    np.testing.assert_allclose(r.grad["w"].numpy(), 2.0 * (w0 - x[pick].mean(0).numpy()), rtol=1e-12)
    model2, *_ = quadratic_case(n=100)
    full = fedveca_steps(model2, x, y, tau=2, lr=0.05, batch_size=8, grad_subsample=100, seed=5)
    np.testing.assert_allclose(full.grad["w"].numpy(), 2.0 * (w0 - x.mean(0).numpy()), rtol=1e-12)


def test_local_gradient_chunks_add_up():
    torch.manual_seed(2)
    m = LinearSVM((1, 5, 5))
    with torch.no_grad():
        m.weight.normal_()
    x, y = torch.rand(23, 1, 5, 5), torch.randint(0, 10, (23,))
    g1, l1 = local_gradient(m, x, y, chunk_size=4)
    g2, l2 = local_gradient(m, x, y, chunk_size=100)
    torch.testing.assert_close(g1[0], g2[0], rtol=1e-5, atol=1e-6)
    assert l1 == pytest.approx(l2, rel=1e-5)


# ---------------------------------------------------------------- the app, in one process
@pytest.mark.usefixtures("processes")
def test_fedveca_end_to_end_in_process(tmp_path):
    rc = {"strategy": "fedveca", "num-server-rounds": 4, "model": "svm", "partition": "fedveca-case3",
          "lr": 0.01, "batch-size": 100, "fedveca-tau-init": 4, "fedveca-grad-subsample": 2000,
          "min-available-nodes": 5, "output-dir": str(tmp_path), "drift-diagnostics": False}
    grid = InProcessGrid(client_app, 5, rc)
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=dict(rc))
    server_app(grid, context)
    (run_dir,) = list(tmp_path.iterdir())
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
    for r in rounds[1:]:
        assert r[C.LOG_CLIENTS_RECEIVED] == 5 and r[C.LOG_CLIENTS_FAILED] == 0
    # rounds k = 0, 1 (server rounds 1, 2) run tau_init; round 3 the taus computed in round 2
    assert rounds[1][C.LOG_FEDVECA_TAU] == {str(i): 4 for i in range(5)}
    assert rounds[2][C.LOG_FEDVECA_TAU] == {str(i): 4 for i in range(5)}
    assert rounds[3][C.LOG_FEDVECA_TAU] == rounds[2][C.LOG_FEDVECA_TAU_NEXT]
    assert rounds[4][C.LOG_FEDVECA_TAU] == rounds[3][C.LOG_FEDVECA_TAU_NEXT]
    tau_next, ratio = rounds[2][C.LOG_FEDVECA_TAU_NEXT], rounds[2][C.LOG_FEDVECA_R]
    assert min(tau_next.values()) >= 2 and max(tau_next.values()) <= 20
    assert list(ratio.values()).count(1.0) >= 1  # the client with the smallest A
    assert [k for k, t in tau_next.items() if ratio[k] == 1.0] \
        and all(tau_next[k] == 20 for k, r in ratio.items() if r == 1.0)
    assert all(b > 0 for b in rounds[2][C.LOG_FEDVECA_BETA].values())
    assert all(d > 0 for d in rounds[2][C.LOG_FEDVECA_DELTA].values())
    # SVM w_0 = 0: L_0 is skipped, L_1 enters in round k = 2
    assert rounds[1][C.LOG_FEDVECA_L] is None
    assert rounds[3][C.LOG_FEDVECA_L] > 0 and rounds[3][C.LOG_FEDVECA_ETA_TAU_K_L] > 0
    assert rounds[4]["loss"] < rounds[0]["loss"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run-config"]["fedveca-tau-init"] == 4
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("train") == 20


# ---------------------------------------------------------------- the message-level helper
from strategies.client import client_seed  # noqa: E402


def test_fedveca_train_reply_equals_fedveca_steps_and_reads_a_dataloader():
    """fedveca_train(model, loader, config) = fedveca_steps on the loader's tensors, in the
    dataset's order, with the config's tau / lr / B and the default seed."""
    from flwr.app import ConfigRecord
    from torch.utils.data import DataLoader, TensorDataset

    from strategies import contract as C
    from strategies.client import client_seed

    torch.manual_seed(0)
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    make = lambda: nn.Sequential(nn.Linear(5, 3))  # noqa: E731
    torch.manual_seed(1)
    a = make()
    torch.manual_seed(1)
    b = make()
    config = ConfigRecord({C.LOCAL_STEPS: 4, C.LR: 0.1, C.BATCH_SIZE: 7, C.GNORM2_PREV: 2.0,
                           C.FEDVECA_ESTIMATE: True, C.SERVER_ROUND: 3, C.SEED: 5})
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    reply = fedveca_train(a, loader, config, partition_id=2)
    ref = fedveca_steps(b, x, y, tau=4, lr=0.1, batch_size=7, gnorm2_prev=2.0, estimate=True,
                        seed=client_seed(5, 3, 2))
    metrics = reply[C.METRICS]
    assert metrics[C.BETA] == ref.beta and metrics[C.DELTA] == ref.delta
    assert metrics[C.LOCAL_STEPS_TAKEN] == 4 and metrics[C.NUM_EXAMPLES] == 30
    assert metrics[C.PARTITION_ID] == 2
    for key, value in reply[C.ARRAYS].to_torch_state_dict().items():
        assert torch.equal(value, ref.arrays[key])
    for key, value in reply[C.GRAD].to_torch_state_dict().items():
        assert torch.equal(value, ref.grad[key])
    with pytest.raises(ValueError, match="local-steps"):
        fedveca_train(a, (x, y), ConfigRecord({C.LR: 0.1}))


def test_fedveca_train_runs_the_callers_optimizer_and_keeps_its_metrics(caplog):
    from flwr.app import ConfigRecord

    torch.manual_seed(0)
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    torch.manual_seed(1)
    a = nn.Sequential(nn.Linear(5, 3))
    torch.manual_seed(1)
    b = nn.Sequential(nn.Linear(5, 3))
    config = ConfigRecord({C.LOCAL_STEPS: 4, C.LR: 0.1, C.BATCH_SIZE: 7, C.SERVER_ROUND: 3})
    mine = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    with caplog.at_level("WARNING", logger="strategies.client.fedveca"):
        reply = fedveca_train(a, (x, y), config, partition_id=2, optimizer=mine,
                              metrics={"train_loss": 1.5, C.NUM_EXAMPLES: -1})
    assert not caplog.records  # built with the config's lr: nothing to say
    reference = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    base = local_sgd(b, x, y, batch_size=7, steps=4, seed=client_seed(0, 3, 2),
                     optimizer=reference)
    for key, value in reply[C.ARRAYS].to_torch_state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    metrics = reply[C.METRICS]
    assert metrics["train_loss"] == 1.5  # the caller's own metric, kept
    assert metrics[C.NUM_EXAMPLES] == 30 and metrics[C.TRAIN_LOSS] == base.train_loss
    with caplog.at_level("WARNING", logger="strategies.client.fedveca"):
        fedveca_train(a, (x, y), config, optimizer=torch.optim.Adam(a.parameters(), lr=1e-3))
    assert "lr [0.001] is not the eta = 0.1" in caplog.text


# ---------------------------------------------------------------- a template-style ClientApp
def template_app():
    """Flower's PyTorch template ClientApp with FedVeca's branch (no query handler)."""
    from flwr.app import ArrayRecord, Message, MetricRecord
    from flwr.clientapp import ClientApp
    from torch.utils.data import DataLoader, Dataset

    from strategies.client import is_fedveca_round

    class Net(nn.Module):  # no .loss: cross-entropy is the default
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x)

    class Part(Dataset):
        def __init__(self, pid):
            g = torch.Generator().manual_seed(pid)
            self.x, self.y = torch.randn(40, 6, generator=g) + pid, torch.randint(0, 3, (40,), generator=g)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"img": self.x[i], "label": self.y[i]}

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context):
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        partition_id = context.node_config["partition-id"]
        trainloader = DataLoader(Part(partition_id), batch_size=8, shuffle=True)
        config = msg.content["config"]
        if is_fedveca_round(config):
            return Message(fedveca_train(model, trainloader, config, partition_id=partition_id),
                           reply_to=msg)
        metrics = MetricRecord({"num-examples": 40})
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                       reply_to=msg)

    return app, Net


def test_template_client_app_with_the_helper():
    from flwr.app import ArrayRecord, ConfigRecord

    from strategies import FedVeca

    app, Net = template_app()
    grid = InProcessGrid(app, 3, {})
    strategy = FedVeca(min_available_nodes=3, tau_init=5)
    torch.manual_seed(0)
    result = strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=3,
                            train_config=ConfigRecord({"lr": 0.05, "batch-size": 8}))
    assert result.arrays is not None
    d = {r: strategy.round_log(r) for r in (1, 2, 3)}
    keys = {f"node-{n}" for n in grid.node_ids}  # no query handler: keyed by node id
    assert set(d[1][C.LOG_FEDVECA_TAU]) == keys and set(d[1][C.LOG_FEDVECA_TAU].values()) == {5}
    assert d[3][C.LOG_FEDVECA_TAU] == d[2][C.LOG_FEDVECA_TAU_NEXT]
    assert set(d[2][C.LOG_FEDVECA_REASON].values()) == {"rule"}
    assert d[3][C.LOG_CLIENTS_FAILED] == 0
