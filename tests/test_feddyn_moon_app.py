"""FedDyn and MOON through the whole app in one process (ServerApp + ClientApp on the fault
Grid): their client state (FedDyn's linear term, MOON's previous local model) carried across
rounds in Context.state, exact recovery when a reply is lost after the client updated its
state or when a node loses its Context.state, the copies resent after a resume, and MOON
with mu = 0 equal to FedAvg on the same model. (A killed-and-resumed run equal to an
uninterrupted one: tests/test_reliability_resume.py.)"""

from __future__ import annotations

import logging

import pytest
from flwr.app import Error, Message

from fedapp.client_app import app as client_app
from strategies import contract as C
from strategies.client.feddyn import STATE_KEY as FEDDYN_KEY
from strategies.client.moon import STATE_KEY as MOON_KEY
from tests.reliability_common import run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("one_torch_thread", "processes")

RUN = {"num-server-rounds": 3, "partition": "dirichlet", "momentum": 0.5, "weight-decay": 1e-4}
STATE_KEYS = {"feddyn": FEDDYN_KEY, "moon": MOON_KEY}
STRATEGY_KEYS = {"feddyn": {"feddyn-alpha": 0.1}, "moon": {"moon-mu": 5.0}}


def wrapped(before=None, after=None):
    """The real ClientApp with a hook before it runs (may raise) and after (may replace the
    reply), for the rounds and partitions the hooks choose."""
    def app(msg: Message, context):
        server_round = int(msg.content[C.CONFIG].get(C.SERVER_ROUND, 0))
        pid = int(context.node_config["partition-id"])
        if before is not None:
            before(server_round, pid, context)
        reply = client_app(msg, context)
        return reply if after is None else after(server_round, pid, msg, reply)
    return app


def run_strategy(strategy, out, **overrides):
    return run(strategy, out, 3, **{**RUN, **STRATEGY_KEYS[strategy], **overrides})


@pytest.mark.parametrize("strategy", ["feddyn", "moon"])
def test_client_state_is_carried_across_rounds_in_context_state(strategy, tmp_path):
    grid, _, rounds, _ = run_strategy(strategy, tmp_path)
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0] * 3, [1] * 3, [2] * 3]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 and r[C.LOG_CLIENTS_FAILED] == 0
               for r in rounds[1:])
    for context in grid.contexts.values():
        assert context.state.config_records[STATE_KEYS[strategy] + "-meta"]["round"] == 3
    assert rounds[1][C.LOG_BYTES_DOWN] == rounds[1][C.LOG_BYTES_UP]  # models only, both ways
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]  # it learns
    if strategy == "feddyn":
        assert all(r[C.LOG_FEDDYN_H_NORM] > 0 for r in rounds[1:])
    else:  # no previous model in round 1: l_con = 0; then the contrastive term is active
        losses = [r[C.LOG_MOON_CONTRASTIVE_LOSS] for r in rounds[1:]]
        assert losses[0] == 0.0 and all(loss > 0 for loss in losses[1:])


@pytest.mark.parametrize("strategy", ["feddyn", "moon"])
def test_a_reply_lost_after_the_client_updated_its_state_recovers_exactly(strategy, tmp_path):
    """Partition 1's round-2 reply is lost after its ClientApp kept the new state (run
    'lost'), or its ClientApp fails before touching it (run 'failed'): the server cannot
    tell, so both runs must end bit-identical; round 3 resends the server's copy."""
    def lose(server_round, pid, msg, reply):
        if (server_round, pid) == (2, 1):
            return Message(Error(code=0, reason="reply lost"), reply_to=msg)
        return reply

    def crash(server_round, pid, context):
        if (server_round, pid) == (2, 1):
            raise RuntimeError("crashed before training")

    _, _, lost, lost_model = run_strategy(strategy, tmp_path / "lost",
                                          grid_kwargs={"client_app": wrapped(after=lose)})
    _, _, failed, failed_model = run_strategy(strategy, tmp_path / "failed",
                                              grid_kwargs={"client_app": wrapped(before=crash)})
    assert without_timings(lost) == without_timings(failed)
    assert same_model(lost_model, failed_model)
    assert lost[2][C.LOG_CLIENTS_FAILED] == 1 and lost[3][C.LOG_CLIENT_STATE_ATTACHED] == 1
    assert lost[3][C.LOG_CLIENT_STATE_ROUNDS] == [2, 1, 2] and lost[3][C.LOG_CLIENTS_FAILED] == 0


@pytest.mark.parametrize("strategy", ["feddyn", "moon"])
def test_a_node_that_lost_its_state_fails_once_then_recovers_exactly(strategy, tmp_path,
                                                                      caplog):
    """Partition 1's Context.state is wiped before round 2 (a SuperNode restart with the same
    node id): its round-2 reply is an error naming what happened, round 3 carries the
    server's copy. Bit-identical to a run where partition 1 just failed in round 2."""
    def restart(server_round, pid, context):
        if (server_round, pid) == (2, 1):
            for name in list(context.state.keys()):
                del context.state[name]

    def crash(server_round, pid, context):
        if (server_round, pid) == (2, 1):
            raise RuntimeError("crashed before training")

    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, _, restarted, restarted_model = run_strategy(
            strategy, tmp_path / "restart", grid_kwargs={"client_app": wrapped(before=restart)})
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("ClientStateLost" in m and "expects the state of round 1" in m
               and "holds no state" in m for m in messages), messages
    _, _, failed, failed_model = run_strategy(strategy, tmp_path / "failed",
                                              grid_kwargs={"client_app": wrapped(before=crash)})
    assert restarted[2][C.LOG_CLIENTS_FAILED] == 1
    assert restarted[3][C.LOG_CLIENT_STATE_ATTACHED] == 1 and restarted[3][
        C.LOG_CLIENTS_FAILED] == 0
    assert without_timings(restarted) == without_timings(failed)
    assert same_model(restarted_model, failed_model)


@pytest.mark.parametrize("strategy", ["feddyn", "moon"])
def test_the_first_round_after_a_resume_resends_every_copy(strategy, tmp_path):
    _, full_dir, full, _ = run_strategy(strategy, tmp_path / "full",
                                        **{"num-server-rounds": 2, "checkpoint-every": 2})
    _, _, resumed, _ = run_strategy(strategy, tmp_path / "resumed",
                                    **{"resume-from": str(full_dir)})
    assert resumed[3][C.LOG_CLIENT_STATE_ATTACHED] == 3
    assert resumed[3][C.LOG_CLIENT_STATE_ROUNDS] == [2, 2, 2]
    # the copies count in bytes-down: FedDyn's linear term (the model's floating arrays),
    # MOON's previous model (the whole model)
    assert resumed[3][C.LOG_BYTES_DOWN] > full[2][C.LOG_BYTES_DOWN]


def test_moon_with_mu_zero_is_fedavg_on_the_same_model(tmp_path):
    _, _, moon, moon_model = run("moon", tmp_path / "moon", 3,
                                 **{**RUN, "moon-mu": 0.0, "model": "mlp-2nn-moon"})
    _, _, fedavg, fedavg_model = run("fedavg", tmp_path / "fedavg", 3,
                                     **{**RUN, "model": "mlp-2nn-moon"})
    assert same_model(moon_model, fedavg_model)
    shared = (C.LOG_ACCURACY, C.LOG_LOSS, C.LOG_TRAIN_LOSS)
    assert [{k: r.get(k) for k in shared} for r in moon] == [
        {k: r.get(k) for k in shared} for r in fedavg]
