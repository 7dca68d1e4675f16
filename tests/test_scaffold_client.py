"""SCAFFOLD's client helper (strategies.client.scaffold.ScaffoldClient) in a plain torch loop:
hand-computed steps, option II, c_i in Context.state, the reply, the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from strategies import contract as C
from strategies.algorithms import scaffold_math as sm
from strategies.client import ClientStateLost, ScaffoldClient, is_scaffold_message, load_meta
from strategies.client.scaffold import STATE_KEY
from strategies.engine.client_states import state_digest
from tests.messages import numpy_of, record


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class Quadratic(torch.nn.Module):
    """f(w) = 0.5 sum_j h_j (w_j - a_j)^2, so grad f = h (w - a)."""

    def __init__(self, w, h=2.0, a=0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w, dtype=torch.float32))
        self.h = torch.as_tensor(h, dtype=torch.float32)
        self.a = torch.as_tensor(a, dtype=torch.float32)

    def loss(self) -> torch.Tensor:
        return 0.5 * (self.h * (self.w - self.a) ** 2).sum()


def train_message(x, c, server_round=1, state_round=0, lr=0.1, attached=None) -> Message:
    content = RecordDict({
        C.ARRAYS: record({"w": np.asarray(x, np.float32)}),
        C.SCAFFOLD_C: record({"w": np.asarray(c, np.float32)}),
        C.CONFIG: ConfigRecord({C.SERVER_ROUND: server_round, C.STATE_ROUND: state_round,
                                **({C.LR: lr} if lr is not None else {})}),
    })
    if attached is not None:
        content[C.CLIENT_STATE] = record({"w": np.asarray(attached, np.float32)})
    return Message(content=content, dst_node_id=3, message_type=MessageType.TRAIN)


def run_steps(model, scaffold, steps, momentum=0.0):
    optimizer = torch.optim.SGD(model.parameters(), lr=scaffold.lr, momentum=momentum)
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss().backward()
        optimizer.step()
        scaffold.correct(model)


def test_two_steps_and_option_ii_by_hand():
    # w = 1, h = 2, eta = 0.1, c = 0.5, c_i = 0:
    # step 1: w = 1 - 0.1 * 2 = 0.8, corrected 0.8 - 0.1 * 0.5 = 0.75
    # step 2: w = 0.75 - 0.1 * 1.5 = 0.6, corrected 0.55
    # option II: c_i+ = 0 - 0.5 + (1 - 0.55) / (2 * 0.1) = 1.75 = mean of the gradients 2, 1.5
    state = RecordDict()
    msg = train_message([1.0], [0.5])
    model = Quadratic([1.0])
    scaffold = ScaffoldClient(msg, state)
    assert is_scaffold_message(msg) and scaffold.lr == 0.1 and scaffold.state_round == 0
    run_steps(model, scaffold, 2)
    assert model.w.item() == pytest.approx(0.55, abs=1e-6)
    reply = scaffold.finish(model, {C.NUM_EXAMPLES: 10})
    assert numpy_of(reply[C.ARRAYS])["w"] == pytest.approx([0.55], abs=1e-6)
    assert numpy_of(reply[C.SCAFFOLD_DELTA_C])["w"] == pytest.approx([1.75], abs=1e-5)
    metrics = reply[C.METRICS]
    assert metrics[C.LOCAL_STEPS_TAKEN] == 2 and metrics[C.NUM_EXAMPLES] == 10
    assert metrics[C.STATE_ROUND_USED] == 0
    assert metrics[C.STATE_DIGEST] == state_digest({"w": np.zeros(1, np.float32)})
    kept = state.array_records[STATE_KEY]["w"].numpy()
    assert kept == pytest.approx([1.75], abs=1e-5) and load_meta(state, STATE_KEY) == {"round": 1}


def test_next_round_continues_from_context_state():
    state = RecordDict()
    first = ScaffoldClient(train_message([1.0], [0.5]), state)
    model = Quadratic([1.0])
    run_steps(model, first, 2)
    first.finish(model, {C.NUM_EXAMPLES: 10})
    c_i = state.array_records[STATE_KEY]["w"].numpy().copy()
    second = ScaffoldClient(train_message([0.6], [0.2], server_round=2, state_round=1), state)
    assert second.state_round == 1 and np.array_equal(second.client_control["w"], c_i)
    model = Quadratic([0.6])
    run_steps(model, second, 1)
    # one step: 0.6 - 0.1 * 1.2 - 0.1 * (0.2 - 1.75) = 0.635
    assert model.w.item() == pytest.approx(0.635, abs=1e-6)
    reply = second.finish(model, {C.NUM_EXAMPLES: 10})
    assert reply[C.METRICS][C.STATE_DIGEST] == state_digest({"w": c_i})
    # c_i is what the server derives: c_i + delta c_i
    delta = numpy_of(reply[C.SCAFFOLD_DELTA_C])
    server_copy = sm.apply_delta({"w": c_i}, delta)["w"]
    assert state.array_records[STATE_KEY]["w"].numpy().tobytes() == server_copy.tobytes()


def test_attached_copy_wins_and_a_lost_state_raises():
    state = RecordDict()
    scaffold = ScaffoldClient(train_message([1.0], [0.0], server_round=5, state_round=4,
                                            attached=[3.0]), state)
    assert scaffold.client_control["w"][0] == 3.0 and scaffold.state_round == 4
    with pytest.raises(ClientStateLost, match="round 7"):
        ScaffoldClient(train_message([1.0], [0.0], server_round=8, state_round=7), RecordDict())


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="lr=..."):
        ScaffoldClient(train_message([1.0], [0.0], lr=None), RecordDict())
    assert ScaffoldClient(train_message([1.0], [0.0], lr=None), RecordDict(), lr=0.3).lr == 0.3
    scaffold = ScaffoldClient(train_message([1.0], [0.0]), RecordDict())
    with pytest.raises(ValueError, match="correct"):
        scaffold.finish(Quadratic([1.0]), {C.NUM_EXAMPLES: 1})
    plain = Message(content=RecordDict({C.ARRAYS: record({"w": np.zeros(1, np.float32)}),
                                        C.CONFIG: ConfigRecord({C.LR: 0.1})}),
                    dst_node_id=3, message_type=MessageType.TRAIN)
    assert not is_scaffold_message(plain)
    with pytest.raises(ValueError, match="is_scaffold_message"):
        ScaffoldClient(plain, RecordDict())


@pytest.mark.parametrize("momentum, lr, tolerance", [(0.0, 0.05, 1e-3), (0.9, 0.01, 0.3)])
def test_federation_of_quadratics_converges_with_momentum(momentum, lr, tolerance):
    """Four clients with different quadratics, all every round (the server side is
    strategies.algorithms.scaffold_math): SCAFFOLD approaches the global optimum, with and without
    local momentum, because the correction stays outside the momentum buffer (inside it,
    the control variates diverge: the helper module's docstring)."""
    rng = np.random.default_rng(0)
    h = rng.uniform(0.5, 2.0, size=(4, 3)).astype(np.float32)
    a = (3 * rng.normal(size=(4, 3))).astype(np.float32)
    optimum = (h * a).sum(0) / h.sum(0)
    states = [RecordDict() for _ in range(4)]
    x, c = np.zeros(3, np.float32), np.zeros(3, np.float32)
    start = np.abs(x - optimum).max()
    for server_round in range(1, 16):
        ys, total = [], None
        for i in range(4):
            msg = train_message(x, c, server_round, server_round - 1, lr=lr)
            model = Quadratic(x.copy(), h[i], a[i])
            scaffold = ScaffoldClient(msg, states[i])
            run_steps(model, scaffold, 20, momentum)
            reply = scaffold.finish(model, {C.NUM_EXAMPLES: 1})
            ys.append(numpy_of(reply[C.ARRAYS])["w"])
            total = sm.add_delta(total, numpy_of(reply[C.SCAFFOLD_DELTA_C]))
        x = np.mean(ys, axis=0).astype(np.float32)
        c = sm.control_step({"w": c}, total, 4, 4)["w"]
    # (plain SGD: 0.9 -> 3e-5 in 15 rounds; momentum 0.9, reset every round: 0.9 -> 0.18)
    assert np.abs(x - optimum).max() < tolerance * max(start, 1.0)
    assert np.isfinite(c).all() and np.abs(c).max() < 1.0


def test_wrapping_the_users_momentum_optimizer_equals_correcting_by_hand():
    """scaffold.wrap(optimizer, model): the correction after every step of the user's own
    optimiser (momentum 0.9, weight decay), bit for bit as correct() after each step; the
    hook is off again after finish."""
    results = []
    for wrapped in (False, True):
        model = Quadratic([1.0, -2.0], h=[2.0, 0.5])
        scaffold = ScaffoldClient(train_message([1.0, -2.0], [0.5, -0.1]), RecordDict())
        optimizer = torch.optim.SGD(model.parameters(), lr=scaffold.lr, momentum=0.9,
                                    weight_decay=1e-2)
        if wrapped:
            assert scaffold.wrap(optimizer, model) is optimizer
        for _ in range(4):
            optimizer.zero_grad()
            model.loss().backward()
            optimizer.step()
            if not wrapped:
                scaffold.correct(model)
        reply = scaffold.finish(model, {C.NUM_EXAMPLES: 10, "train_loss": 0.5})
        assert reply[C.METRICS]["train_loss"] == 0.5 and reply[C.METRICS][C.LOCAL_STEPS_TAKEN] == 4
        results.append((model.w.detach().clone(), numpy_of(reply[C.SCAFFOLD_DELTA_C])["w"]))
        before = model.w.detach().clone()
        optimizer.zero_grad()
        model.loss().backward()
        optimizer.step()  # after finish: no correction, no step counted
        assert scaffold.steps == 4 and not torch.equal(model.w.detach(), before)
    assert torch.equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_wrap_refuses_an_optimizer_at_another_rate_than_eta_l():
    model = Quadratic([1.0])
    scaffold = ScaffoldClient(train_message([1.0], [0.5], lr=0.1), RecordDict())
    with pytest.raises(ValueError, match=r"lr \[0.01\] is not eta_l = 0.1"):
        scaffold.wrap(torch.optim.SGD(model.parameters(), lr=0.01), model)
    explicit = ScaffoldClient(train_message([1.0], [0.5], lr=0.1), RecordDict(), lr=0.01)
    explicit.wrap(torch.optim.Adam(model.parameters(), lr=0.01), model)  # eta_l given: fine
