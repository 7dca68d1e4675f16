"""SCAFFOLD through the whole app in one process (ServerApp + ClientApp on the fault Grid):
c_i carried across rounds in Context.state, and exact recovery when a reply is lost after
the client updated c_i, or when a node loses its Context.state (a SuperNode restart).
(A resumed run: tests/test_reliability_resume.py.)"""

from __future__ import annotations

import logging

import pytest
from flwr.app import Error, Message

from fedapp.client_app import app as client_app
from strategies import contract as C
from strategies.client.scaffold import STATE_KEY
from tests.reliability_common import run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("one_torch_thread", "processes")

RUN = {"num-server-rounds": 4, "partition": "dirichlet", "momentum": 0.5, "weight-decay": 1e-4}


def wrapped(before=None, after=None):
    """The real ClientApp with a hook before it runs (may raise) and after (may replace the
    reply), for partition 1 in the rounds the hooks choose."""
    def app(msg: Message, context):
        server_round = int(msg.content[C.CONFIG].get(C.SERVER_ROUND, 0))
        pid = int(context.node_config["partition-id"])
        if before is not None:
            before(server_round, pid, context)
        reply = client_app(msg, context)
        return reply if after is None else after(server_round, pid, msg, reply)
    return app


def test_c_i_is_carried_across_rounds_in_context_state(tmp_path):
    grid, _, rounds, _ = run("scaffold", tmp_path, 3, **RUN)
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0] * 3, [1] * 3, [2] * 3,
                                                                   [3] * 3]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 for r in rounds[1:])  # never resent
    assert all(r[C.LOG_SCAFFOLD_C_NORM] > 0 and r[C.LOG_CLIENTS_FAILED] == 0 for r in rounds[1:])
    for context in grid.contexts.values():
        assert context.state.config_records[STATE_KEY + "-meta"]["round"] == 4
    assert rounds[1][C.LOG_BYTES_DOWN] == rounds[1][C.LOG_BYTES_UP]  # x + c down, y + dc up


def test_a_reply_lost_after_the_client_updated_c_i_recovers_exactly(tmp_path, caplog):
    """Partition 1's round-2 reply is lost after its ClientApp kept the new c_i (run 'lost'),
    or its ClientApp fails before touching c_i (run 'failed'): the server cannot tell, so
    both runs must end bit-identical; round 3 resends the server's c_i to partition 1."""
    def lose(server_round, pid, msg, reply):
        if (server_round, pid) == (2, 1):
            return Message(Error(code=0, reason="reply lost"), reply_to=msg)
        return reply

    def crash(server_round, pid, context):
        if (server_round, pid) == (2, 1):
            raise RuntimeError("crashed before training")

    _, _, lost, lost_model = run("scaffold", tmp_path / "lost", 3,
                                 grid_kwargs={"client_app": wrapped(after=lose)}, **RUN)
    _, _, failed, failed_model = run("scaffold", tmp_path / "failed", 3,
                                     grid_kwargs={"client_app": wrapped(before=crash)}, **RUN)
    assert without_timings(lost) == without_timings(failed)
    assert same_model(lost_model, failed_model)
    assert lost[2][C.LOG_CLIENTS_FAILED] == 1 and lost[3][C.LOG_CLIENT_STATE_ATTACHED] == 1
    assert lost[3][C.LOG_CLIENT_STATE_ROUNDS] == [2, 1, 2] and lost[3][C.LOG_CLIENTS_FAILED] == 0


def test_a_node_that_lost_its_state_fails_once_then_recovers_exactly(tmp_path, caplog):
    """Partition 1's Context.state is wiped before round 3 (a SuperNode restart with the same
    node id): its round-3 reply is an error naming what happened, round 4 carries the
    server's c_i. Bit-identical to a run where partition 1 just failed in round 3."""
    def restart(server_round, pid, context):
        if (server_round, pid) == (3, 1):
            for name in list(context.state.keys()):
                del context.state[name]

    def crash(server_round, pid, context):
        if (server_round, pid) == (3, 1):
            raise RuntimeError("crashed before training")

    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, _, restarted, restarted_model = run(
            "scaffold", tmp_path / "restart", 3,
            grid_kwargs={"client_app": wrapped(before=restart)}, **RUN)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("ClientStateLost" in m and "expects the state of round 2" in m
               and "holds no state" in m for m in messages), messages
    _, _, failed, failed_model = run("scaffold", tmp_path / "failed", 3,
                                     grid_kwargs={"client_app": wrapped(before=crash)}, **RUN)
    assert restarted[3][C.LOG_CLIENTS_FAILED] == 1
    assert restarted[4][C.LOG_CLIENT_STATE_ATTACHED] == 1 and restarted[4][
        C.LOG_CLIENTS_FAILED] == 0
    assert without_timings(restarted) == without_timings(failed)
    assert same_model(restarted_model, failed_model)


def test_the_first_round_after_a_resume_resends_every_c_i(tmp_path):
    _, full_dir, _, _ = run("scaffold", tmp_path / "full", 3,
                            **{**RUN, "num-server-rounds": 2, "checkpoint-every": 2})
    _, _, resumed, _ = run("scaffold", tmp_path / "resumed", 3,
                           **{**RUN, "num-server-rounds": 3, "resume-from": str(full_dir)})
    assert resumed[3][C.LOG_CLIENT_STATE_ATTACHED] == 3
    assert resumed[3][C.LOG_CLIENT_STATE_ROUNDS] == [2, 2, 2]



def test_a_stragglers_option_ii_uses_the_steps_it_took(tmp_path):
    """straggler-policy 'partial' (SCAFFOLD's default): half the clients do 1..K steps, and
    the K each reply reports (the steps its option II divided by) is that reduced work."""
    _, _, rounds, _ = run("scaffold", tmp_path, 4, **{**RUN, "num-server-rounds": 2,
                                                      "local-steps": 6,
                                                      "straggler-fraction": 0.5})
    for r in rounds[1:]:
        assert r[C.LOG_CLIENTS_STRAGGLERS] == 2 and r[C.LOG_CLIENTS_RECEIVED] == 4
        steps = sorted(r[C.LOG_LOCAL_STEPS])
        assert steps[2:] == [6, 6] and all(1 <= s <= 6 for s in steps[:2])
