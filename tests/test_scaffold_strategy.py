"""The SCAFFOLD strategy (strategies.algorithms.scaffold.Scaffold) with hand-written ClientApps on the
in-process Grid: the server update by hand (Alg. 1 lines 16-17), partial participation, the
bytes of the control variates, the contract error of a stock client, state_dict."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from strategies import ClientContractError, Scaffold
from strategies import contract as C
from strategies.algorithms import scaffold_math as sm
from strategies.client.info import client_info_reply
from strategies.client.state import resolve_state, save_state
from strategies.engine.client_states import state_digest
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record

SIZES = [10, 30, 60]


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def hand_app(fail=frozenset(), wrong_digest=frozenset(), seen: list | None = None) -> ClientApp:
    """Client k (partition id) returns y = x + (k + 1) and delta c_i = k + 1, keeping c_i with
    the generic client-state helpers; it fails in the (round, partition) pairs of ``fail``
    and reports a wrong state digest in those of ``wrong_digest``."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        if seen is not None:
            seen.append(msg)
        if (server_round, pid) in fail:
            return Message(Error(code=0, reason="down"), reply_to=msg)
        control = numpy_of(msg.content[C.SCAFFOLD_C])
        c_i, used = resolve_state(context.state, "c", msg.content, sm.zero_control(control))
        delta = {k: np.full_like(v, pid + 1) for k, v in control.items()}
        save_state(context.state, "c", sm.apply_delta(c_i, delta), server_round)
        digest = 12345 if (server_round, pid) in wrong_digest else state_digest(c_i)
        arrays = {k: v + (pid + 1) for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.NUM_EXAMPLES: SIZES[pid], C.STATE_ROUND_USED: used,
                                C.STATE_DIGEST: digest})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics,
                                   C.SCAFFOLD_DELTA_C: record(delta)}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return client_info_reply(msg, partition_id=pid, num_examples=SIZES[pid])

    return app


def start(strategy: Scaffold, app: ClientApp, rounds: int = 1):
    grid = InProcessGrid(app, len(SIZES), {})
    initial = record({"w": np.zeros(2, np.float32), "step": np.array(0, np.int64)})
    result = strategy.start(grid, initial, num_rounds=rounds,
                            train_config=ConfigRecord({C.LR: 0.1}))
    return grid, result


def test_one_round_by_hand():
    # uniform: x <- 0 + eta_g mean(1, 2, 3) = 0.5 * 2 = 1; c <- 0 + 3/3 mean(1, 2, 3) = 2
    strategy = Scaffold(server_lr=0.5, query_client_info=True)
    _, result = start(strategy, hand_app())
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [1.0, 1.0])
    np.testing.assert_allclose(strategy.algorithm.control["w"], [2.0, 2.0])
    assert set(strategy.algorithm.control) == {"w"}  # no control variate for the integer buffer
    for pid in range(3):
        np.testing.assert_array_equal(strategy.client_states.mirror.state_of(str(pid))["w"], [pid + 1] * 2)
        assert strategy.client_states.mirror.state_round(str(pid)) == 1
    diag = strategy.round_log(1)
    assert diag[C.LOG_CLIENT_STATE_ROUNDS] == [0, 0, 0] and diag[C.LOG_CLIENT_STATE_ATTACHED] == 0
    assert diag[C.LOG_SCAFFOLD_C_NORM] == pytest.approx(np.sqrt(8.0))


def test_examples_weighting_and_partial_participation_by_hand():
    # round 1, partition 2 fails: |S| = 2 of N = 3.
    # x <- 0 + (10 * 1 + 30 * 2) / 40 = 1.75 (examples); c <- 0 + 2/3 * mean(1, 2) = 1
    strategy = Scaffold(weighting="examples", query_client_info=True)
    grid, result = start(strategy, hand_app(fail={(1, 2)}))
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [1.75, 1.75])
    np.testing.assert_allclose(strategy.algorithm.control["w"], [1.0, 1.0])
    assert strategy.client_states.mirror.state_round("2") == 0 and strategy.round_log(1)[
        C.LOG_CLIENTS_FAILED] == 1
    # c is the mean of the server's copies of all N c_i: (1 + 2 + 0) / 3
    copies = [strategy.client_states.mirror.state_of(str(p)) for p in range(3)]
    assert np.mean([c["w"] if c else np.zeros(2) for c in copies], axis=0) == pytest.approx(1.0)


def test_control_variates_count_in_the_bytes():
    strategy, seen = Scaffold(query_client_info=True), []
    start(strategy, hand_app(fail={(2, 1)}, seen=seen), rounds=3)
    model = record({"w": np.zeros(2, np.float32), "step": np.array(0, np.int64)}).count_bytes()
    control = record({"w": np.zeros(2, np.float32)}).count_bytes()
    first, third = strategy.round_log(1), strategy.round_log(3)
    assert first[C.LOG_BYTES_DOWN] == 3 * (model + control)
    assert first[C.LOG_BYTES_UP] == 3 * (model + control)
    # partition 1's round-2 reply failed: its round-3 message carries the server's c_i
    assert third[C.LOG_CLIENT_STATE_ATTACHED] == 1
    assert third[C.LOG_BYTES_DOWN] == 3 * (model + control) + control
    sent = [msg for msg in seen if int(msg.content[C.CONFIG][C.SERVER_ROUND]) == 3]
    attached = [m for m in sent if C.CLIENT_STATE in m.content]
    assert len(attached) == 1 and attached[0].content[C.CONFIG][C.STATE_ROUND] == 1
    assert third[C.LOG_CLIENT_STATE_ROUNDS] == [2, 1, 2]


def test_a_stock_client_stops_with_one_error_naming_the_helper():
    stock = ClientApp()

    @stock.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = {k: v + 1 for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.STOCK_TRAIN_LOSS: 0.5, C.NUM_EXAMPLES: 10})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)

    with pytest.raises(ClientContractError) as info:
        start(Scaffold(), stock, rounds=2)
    message = str(info.value)
    assert "strategies.client.ScaffoldClient" in message and "round 1" in message
    assert "'scaffold-delta-c'" in message


def test_a_reply_that_started_from_another_c_i_is_rejected(caplog):
    strategy = Scaffold(query_client_info=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strategy, hand_app(wrong_digest={(2, 0)}), rounds=3)
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1 and "state of round 1 differs from the server's copy" in lines[0]
    assert strategy.round_log(2)[C.LOG_CLIENTS_FAILED] == 1
    # its next message carries the copy; the client installs it and is accepted again
    assert strategy.round_log(3)[C.LOG_CLIENT_STATE_ATTACHED] == 1
    assert strategy.round_log(3)[C.LOG_CLIENTS_FAILED] == 0
    assert strategy.round_log(3)[C.LOG_CLIENT_STATE_ROUNDS] == [1, 2, 2]


def test_state_dict_round_trip():
    strategy = Scaffold(query_client_info=True)
    start(strategy, hand_app(), rounds=2)
    state = strategy.state_dict()
    fresh = Scaffold(query_client_info=True)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.algorithm.control["w"], strategy.algorithm.control["w"])
    assert fresh.client_states.mirror.state_round("1") == 2
    assert fresh.client_states.mirror.digest_of("1") == strategy.client_states.mirror.digest_of("1")
    state["algorithm"]["control"]["w"][0] = 99.0  # copies, not views
    assert strategy.algorithm.control["w"][0] != 99.0
    with pytest.raises(ValueError, match="engine state version"):
        fresh.load_state_dict({**state, "engine-state-version": 0})


@pytest.mark.parametrize("weighting", ["pre-erratum", "scheme-i", "scheme-ii"])
def test_other_weightings_are_refused(weighting):
    with pytest.raises(ValueError, match="'uniform'"):
        Scaffold(weighting=weighting, query_client_info=True)


def test_summary_names_the_algorithm(caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        Scaffold(server_lr=0.7).summary()
    said = [r.getMessage() for r in caplog.records]
    assert any("SCAFFOLD" in line for line in said)
    assert any("Weighting: uniform | server lr: 0.7" in line for line in said)
