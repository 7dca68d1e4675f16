"""FedDyn's client helper (strategies.client.feddyn.FedDynClient) in a plain torch loop:
hand-computed regularised steps and linear terms, the linear term in Context.state, the
reply, the errors, and a federation of quadratics that reaches the global optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from strategies import contract as C
from strategies.algorithms import feddyn_math as fm
from strategies.client import ClientStateLost, FedDynClient, is_feddyn_message, load_meta
from strategies.client.feddyn import STATE_KEY
from strategies.engine.client_states import state_digest
from tests.messages import numpy_of, record


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class Quadratic(torch.nn.Module):
    """L(w) = 0.5 sum_j h_j (w_j - a_j)^2, so grad L = h (w - a)."""

    def __init__(self, w, h=2.0, a=0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w, dtype=torch.float32))
        self.h = torch.as_tensor(h, dtype=torch.float32)
        self.a = torch.as_tensor(a, dtype=torch.float32)

    def loss(self) -> torch.Tensor:
        return 0.5 * (self.h * (self.w - self.a) ** 2).sum()


def train_message(theta, alpha=0.5, server_round=1, state_round=0, attached=None) -> Message:
    content = RecordDict({
        C.ARRAYS: record({"w": np.asarray(theta, np.float32)}),
        C.CONFIG: ConfigRecord({C.SERVER_ROUND: server_round, C.STATE_ROUND: state_round,
                                C.FEDDYN_ALPHA: alpha, C.LR: 0.1}),
    })
    if attached is not None:
        content[C.CLIENT_STATE] = record({"w": np.asarray(attached, np.float32)})
    return Message(content=content, dst_node_id=3, message_type=MessageType.TRAIN)


def run_steps(model, feddyn, steps, lr=0.1, momentum=0.0):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss().backward()
        feddyn.regularise(model)
        optimizer.step()


def test_two_steps_and_the_linear_term_by_hand():
    # theta^{t-1} = 1, g = 0, alpha = 0.5, L = w^2 (h = 2), lr = 0.1:
    # step 1: grad 2 + 0.5 (1 - 1) - 0 = 2 -> w = 0.8
    # step 2: grad 1.6 + 0.5 (0.8 - 1) - 0 = 1.5 -> w = 0.65
    # linear term: 0 - 0.5 (0.65 - 1) = 0.175
    state = RecordDict()
    msg = train_message([1.0])
    model = Quadratic([1.0])
    feddyn = FedDynClient(msg, state)
    assert is_feddyn_message(msg) and feddyn.alpha == 0.5 and feddyn.state_round == 0
    run_steps(model, feddyn, 2)
    assert model.w.item() == pytest.approx(0.65, abs=1e-6)
    reply = feddyn.finish(model, {C.NUM_EXAMPLES: 10})
    assert numpy_of(reply[C.ARRAYS])["w"] == pytest.approx([0.65], abs=1e-6)
    metrics = reply[C.METRICS]
    assert metrics[C.NUM_EXAMPLES] == 10 and metrics[C.STATE_ROUND_USED] == 0
    assert metrics[C.STATE_DIGEST] == state_digest({"w": np.zeros(1, np.float32)})
    kept = state.array_records[STATE_KEY]["w"].numpy()
    assert kept == pytest.approx([0.175], abs=1e-6) and load_meta(state, STATE_KEY) == {"round": 1}


def test_next_round_uses_the_linear_term_and_the_server_copy_is_bit_identical():
    state = RecordDict()
    first = FedDynClient(train_message([1.0]), state)
    model = Quadratic([1.0])
    run_steps(model, first, 2)
    first.finish(model, {C.NUM_EXAMPLES: 10})
    g = state.array_records[STATE_KEY]["w"].numpy().copy()
    # round 2 from theta^{t-1} = 0.65 with g = 0.175:
    # grad 1.3 + 0.5 (0.65 - 0.65) - 0.175 = 1.125 -> w = 0.5375;
    # g <- 0.175 - 0.5 (0.5375 - 0.65) = 0.23125
    msg = train_message([0.65], server_round=2, state_round=1)
    second = FedDynClient(msg, state)
    assert second.state_round == 1 and np.array_equal(second.linear_term["w"], g)
    model = Quadratic([0.65])
    run_steps(model, second, 1)
    assert model.w.item() == pytest.approx(0.5375, abs=1e-6)
    reply = second.finish(model, {C.NUM_EXAMPLES: 10})
    assert reply[C.METRICS][C.STATE_DIGEST] == state_digest({"w": g})
    kept = state.array_records[STATE_KEY]["w"].numpy()
    assert kept == pytest.approx([0.23125], abs=1e-6)
    # the server derives its copy from theta_k^t (the reply) and theta^{t-1} it sent
    server = fm.linear_term_update({"w": g}, 0.5, numpy_of(reply[C.ARRAYS]),
                                   numpy_of(msg.content[C.ARRAYS]))
    assert kept.tobytes() == server["w"].tobytes()


def test_the_gradient_added_is_that_of_the_dynamic_regulariser():
    """regularise adds d/dtheta [-<g, theta> + (alpha / 2) ||theta - theta^{t-1}||^2]."""
    rng = np.random.default_rng(0)
    theta_prev, g, theta = (rng.normal(size=5).astype(np.float32) for _ in range(3))
    state = RecordDict()
    feddyn = FedDynClient(train_message(theta_prev, alpha=0.3, server_round=2, state_round=1,
                                        attached=g), state)
    model = Quadratic(theta.tolist())
    model.w.grad = torch.zeros(5)
    feddyn.regularise(model)
    w = torch.tensor(theta, requires_grad=True)
    penalty = -(torch.tensor(g) * w).sum() + 0.3 / 2 * ((w - torch.tensor(theta_prev)) ** 2).sum()
    penalty.backward()
    torch.testing.assert_close(model.w.grad, w.grad)


def test_attached_copy_wins_and_a_lost_state_raises():
    feddyn = FedDynClient(train_message([1.0], server_round=5, state_round=4, attached=[3.0]),
                          RecordDict())
    assert feddyn.linear_term["w"][0] == 3.0 and feddyn.state_round == 4
    with pytest.raises(ClientStateLost, match="round 7"):
        FedDynClient(train_message([1.0], server_round=8, state_round=7), RecordDict())


def test_errors_name_the_fix():
    feddyn = FedDynClient(train_message([1.0]), RecordDict())
    with pytest.raises(ValueError, match="regularise"):
        feddyn.finish(Quadratic([1.0]), {C.NUM_EXAMPLES: 1})
    plain = Message(content=RecordDict({C.ARRAYS: record({"w": np.zeros(1, np.float32)}),
                                        C.CONFIG: ConfigRecord({C.LR: 0.1})}),
                    dst_node_id=3, message_type=MessageType.TRAIN)
    assert not is_feddyn_message(plain)
    with pytest.raises(ValueError, match="is_feddyn_message"):
        FedDynClient(plain, RecordDict())


def test_a_model_with_floating_buffers_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    arrays = {k: v.numpy() for k, v in model.state_dict().items()}
    msg = Message(content=RecordDict({C.ARRAYS: record(arrays), C.CONFIG: ConfigRecord(
        {C.FEDDYN_ALPHA: 0.1, C.SERVER_ROUND: 1})}), dst_node_id=3,
        message_type=MessageType.TRAIN)
    feddyn = FedDynClient(msg, RecordDict())
    with pytest.raises(ValueError, match="1.running_mean, 1.running_var.*GroupNorm"):
        feddyn.regularise(model)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_federation_of_quadratics_reaches_the_global_optimum(momentum):
    """Four clients with different quadratics, all every round, 20 local steps (near
    Algorithm 1's exact local minimisation; the server side is strategies.algorithms.feddyn_math):
    FedDyn's theta^t approaches argmin sum_k L_k, where FedAvg stays at a biased point.
    (Measured: max error 2e-3 without momentum, 6e-4 with 0.9; the bias is 0.63.)"""
    rng = np.random.default_rng(0)
    h = rng.uniform(0.5, 2.0, size=(4, 3)).astype(np.float32)
    a = (3 * rng.normal(size=(4, 3))).astype(np.float32)
    optimum = (h * a).sum(0) / h.sum(0)
    alpha, states = 0.5, [RecordDict() for _ in range(4)]
    theta, h_server = {"w": np.zeros(3, np.float32)}, fm.zero_state({"w": np.zeros(3, np.float32)})
    for server_round in range(1, 21):
        total, models = None, []
        for i in range(4):
            msg = train_message(theta["w"], alpha, server_round, server_round - 1)
            model = Quadratic(theta["w"].tolist(), h[i], a[i])
            feddyn = FedDynClient(msg, states[i])
            run_steps(model, feddyn, 20, lr=0.1, momentum=momentum)
            local = numpy_of(feddyn.finish(model, {C.NUM_EXAMPLES: 1})[C.ARRAYS])
            total = fm.add_drift(total, local, theta, h_server)
            models.append(local["w"])
        h_server = fm.h_step(h_server, total, alpha, 4)
        theta = fm.server_model({"w": np.mean(models, axis=0).astype(np.float32)}, h_server,
                                alpha)
    assert np.abs(theta["w"] - optimum).max() < 5e-3
    # FedAvg with exact local minimisation ends at the mean of the a_i: the bias FedDyn removes
    assert np.abs(a.mean(0) - optimum).max() > 0.1


def test_wrapping_the_users_momentum_optimizer_equals_regularising_by_hand():
    """feddyn.wrap(optimizer, model): the regulariser's gradient before every step of the
    user's own optimiser (momentum 0.5), bit for bit as regularise() before each step; the
    hook is off again after finish."""
    finals = []
    for wrapped in (False, True):
        state = RecordDict()
        model = Quadratic([1.0, 0.5], h=[2.0, 1.0])
        feddyn = FedDynClient(train_message([1.0, 0.5], attached=[0.3, -0.2], state_round=2),
                              state)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        if wrapped:
            assert feddyn.wrap(optimizer, model) is optimizer
        for _ in range(3):
            optimizer.zero_grad()
            model.loss().backward()
            if not wrapped:
                feddyn.regularise(model)
            optimizer.step()
        reply = feddyn.finish(model, {C.NUM_EXAMPLES: 4, "train_loss": 0.25})
        assert reply[C.METRICS]["train_loss"] == 0.25 and feddyn.steps == 3
        finals.append((model.w.detach().clone(), state.array_records["feddyn-linear-term"]["w"]
                       .numpy().copy()))
        optimizer.zero_grad()
        model.loss().backward()
        optimizer.step()
        assert feddyn.steps == 3  # finish took the hook off
    assert torch.equal(finals[0][0], finals[1][0])
    np.testing.assert_array_equal(finals[0][1], finals[1][1])
