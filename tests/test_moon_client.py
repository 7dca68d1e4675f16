"""MOON's client helper (strategies.client.moon): Eq. (3) on tiny tensors by hand, MoonClient
in a plain torch loop (first round = plain training, the previous model from Context.state,
the reply), a user's own representation, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from strategies import contract as C
from strategies.client import (ClientStateLost, MissingRepresentation, MoonClient,
                               contrastive_loss, has_representation, is_moon_message, load_meta)
from strategies.client.moon import STATE_KEY
from strategies.engine.client_states import state_digest
from tests.messages import numpy_of, record

IDENTITY = [[1.0, 0.0], [0.0, 1.0]]
ROTATION = [[0.0, -1.0], [1.0, 0.0]]  # R e1 = e2: cosine 0 with e1


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class TinyRep(nn.Module):
    """z = W x (the representation), logits = V z; forward(x) = the logits."""

    def __init__(self, w=IDENTITY, v=((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))) -> None:
        super().__init__()
        self.rep = nn.Linear(2, 2, bias=False)
        self.out = nn.Linear(2, 3, bias=False)
        with torch.no_grad():
            self.rep.weight.copy_(torch.tensor(w))
            self.out.weight.copy_(torch.tensor(v))

    def forward_with_representation(self, x):
        z = self.rep(x)
        return self.out(z), z

    def forward(self, x):
        return self.forward_with_representation(x)[0]


def arrays_of(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def train_message(global_model, mu=2.0, tau=0.5, server_round=1, state_round=0,
                  attached=None) -> Message:
    content = RecordDict({
        C.ARRAYS: record(arrays_of(global_model)),
        C.CONFIG: ConfigRecord({C.SERVER_ROUND: server_round, C.STATE_ROUND: state_round,
                                C.MOON_MU: mu, C.MOON_TEMPERATURE: tau, C.LR: 0.1}),
    })
    if attached is not None:
        content[C.CLIENT_STATE] = record(arrays_of(attached))
    return Message(content=content, dst_node_id=3, message_type=MessageType.TRAIN)


def test_contrastive_loss_by_hand():
    # tau = 0.5. Sample 1: sim(z, z_glob) = 1, sim(z, z_prev) = 0: logits (2, 0),
    # l = -log(e^2 / (e^2 + e^0)) = log(1 + e^-2).
    # Sample 2: z = (1, 1), z_glob = (2, 0): sim = 1/sqrt(2); z_prev = (-1, -1): sim = -1:
    # logits (sqrt(2), -2), l = log(1 + e^(-2 - sqrt(2))).
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[3.0, 0.0], [2.0, 0.0]])
    z_prev = torch.tensor([[0.0, 5.0], [-1.0, -1.0]])
    expected = (math.log1p(math.exp(-2)) + math.log1p(math.exp(-2 - math.sqrt(2)))) / 2
    loss = contrastive_loss(z, z_glob, z_prev, temperature=0.5)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_contrastive_loss_gradient_only_through_z():
    z = torch.tensor([[1.0, 0.5]], requires_grad=True)
    z_glob, z_prev = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    contrastive_loss(z, z_glob, z_prev, 0.5).backward()
    # the loss falls when z turns towards z_glob and away from z_prev
    assert z.grad[0, 0] < 0 < z.grad[0, 1]


def test_first_round_is_plain_training_then_the_previous_model_is_used():
    state, x, y = RecordDict(), torch.tensor([[1.0, 0.0]]), torch.tensor([2])
    global_model = TinyRep()
    model, plain = TinyRep(), TinyRep()
    moon = MoonClient(train_message(global_model), state, model)
    assert is_moon_message(train_message(global_model)) and moon.previous_model is None
    logits, contrastive = moon.forward(model, x)
    assert contrastive.item() == 0.0 and torch.equal(logits, model(x))
    # no previous model: the step is bit-identical to a plain l_sup step
    (F.cross_entropy(logits, y) + contrastive).backward()
    F.cross_entropy(plain(x), y).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(),
                                                            plain.parameters()))
    with torch.no_grad():
        model.rep.weight.copy_(torch.tensor(ROTATION))  # "after local training": R
    reply = moon.finish(model, {C.NUM_EXAMPLES: 4})
    metrics = reply[C.METRICS]
    assert metrics[C.MOON_CONTRASTIVE_LOSS] == 0.0 and metrics[C.STATE_ROUND_USED] == 0
    assert metrics[C.STATE_DIGEST] == state_digest({})
    assert load_meta(state, STATE_KEY) == {"round": 1}
    kept = {k: a.numpy() for k, a in state.array_records[STATE_KEY].items()}
    assert kept.keys() == numpy_of(reply[C.ARRAYS]).keys()
    assert all(np.array_equal(kept[k], v) for k, v in numpy_of(reply[C.ARRAYS]).items())

    # round 2: local = global = I, previous = R. x = e1: z = z_glob = e1, z_prev = e2:
    # l_con = log(1 + e^-2) (tau 0.5), and the helper returns mu l_con with mu = 2
    second = MoonClient(train_message(global_model, server_round=2, state_round=1), state,
                        TinyRep())
    assert second.state_round == 1
    local = TinyRep()
    logits, contrastive = second.forward(local, x)
    assert contrastive.item() == pytest.approx(2 * math.log1p(math.exp(-2)), rel=1e-6)
    contrastive.backward()
    assert local.rep.weight.grad is not None
    assert all(p.grad is None and not p.requires_grad
               for m in (second.global_model, second.previous_model) for p in m.parameters())
    reply = second.finish(local, {C.NUM_EXAMPLES: 4})
    assert reply[C.METRICS][C.MOON_CONTRASTIVE_LOSS] == pytest.approx(math.log1p(math.exp(-2)))
    assert reply[C.METRICS][C.STATE_DIGEST] == state_digest(kept)


def test_attached_copy_wins_and_a_lost_state_raises():
    previous = TinyRep(w=ROTATION)
    moon = MoonClient(train_message(TinyRep(), server_round=5, state_round=4, attached=previous),
                      RecordDict(), TinyRep())
    assert moon.state_round == 4
    assert torch.equal(moon.previous_model.rep.weight, previous.rep.weight)
    with pytest.raises(ClientStateLost, match="round 7"):
        MoonClient(train_message(TinyRep(), server_round=8, state_round=7), RecordDict(),
                   TinyRep())


def test_a_users_own_representation_function():
    """A model without forward_with_representation: MoonClient(..., representation=fn)."""
    net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 3, bias=False))

    def representation(model, x):
        z = model[0](x)
        return model[1](z), z

    assert not has_representation(net)
    msg = Message(content=RecordDict({
        C.ARRAYS: record(arrays_of(net)),
        C.CONFIG: ConfigRecord({C.SERVER_ROUND: 2, C.STATE_ROUND: 0, C.MOON_MU: 1.0,
                                C.MOON_TEMPERATURE: 0.5})}),
        dst_node_id=3, message_type=MessageType.TRAIN)
    msg.content[C.CLIENT_STATE] = record(arrays_of(net))
    msg.content[C.CONFIG][C.STATE_ROUND] = 1
    moon = MoonClient(msg, RecordDict(), net, representation=representation)
    _, contrastive = moon.forward(net, torch.ones(4, 2))
    # z = z_glob = z_prev: both similarities 1, l_con = log 2
    assert contrastive.item() == pytest.approx(math.log(2), rel=1e-6)


def test_errors_name_the_fix():
    plain_net = nn.Linear(2, 3)
    with pytest.raises(MissingRepresentation, match="forward_with_representation.*cnn-small-moon"):
        MoonClient(train_message(TinyRep()), RecordDict(), plain_net)
    moon = MoonClient(train_message(TinyRep()), RecordDict(), TinyRep())
    with pytest.raises(ValueError, match="MoonClient.forward"):
        moon.finish(TinyRep(), {C.NUM_EXAMPLES: 1})
    plain = Message(content=RecordDict({C.ARRAYS: record(arrays_of(TinyRep())),
                                        C.CONFIG: ConfigRecord({C.LR: 0.1})}),
                    dst_node_id=3, message_type=MessageType.TRAIN)
    assert not is_moon_message(plain)
    with pytest.raises(ValueError, match="is_moon_message"):
        MoonClient(plain, RecordDict(), TinyRep())
