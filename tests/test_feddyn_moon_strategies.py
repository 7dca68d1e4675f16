"""The FedDyn and MOON strategies (strategies.algorithms.feddyn.FedDyn, strategies.algorithms.moon.Moon) with
hand-written ClientApps on the in-process Grid: the server update by hand, partial
participation, the client-state copies and their bytes, the contract error of a stock
client, a reply that started from another state, state_dict."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from strategies import ClientContractError, FedDyn, Moon
from strategies import contract as C
from strategies.algorithms import feddyn_math as fm
from strategies.client.info import client_info_reply
from strategies.client.state import resolve_state, save_state
from strategies.engine.client_states import state_digest
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record

SIZES = [10, 30, 60]


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def hand_app(kind: str, fail=frozenset(), wrong_digest=frozenset(),
             seen: list | None = None) -> ClientApp:
    """Client k (partition id) returns theta + (k + 1) and keeps its state with the generic
    client-state helpers (FedDyn: the linear term; MOON: the returned model); it fails in the
    (round, partition) pairs of ``fail`` and reports a wrong state digest in those of
    ``wrong_digest``. MOON replies report l_con = k."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content[C.CONFIG]
        server_round = int(config[C.SERVER_ROUND])
        if seen is not None:
            seen.append(msg)
        if (server_round, pid) in fail:
            return Message(Error(code=0, reason="down"), reply_to=msg)
        theta = numpy_of(msg.content[C.ARRAYS])
        local = {k: v + (pid + 1) for k, v in theta.items()}
        initial = fm.zero_state(theta) if kind == "feddyn" else {}
        state, used = resolve_state(context.state, "s", msg.content, initial)
        new = (fm.linear_term_update(state, float(config[C.FEDDYN_ALPHA]), local, theta)
               if kind == "feddyn" else local)
        save_state(context.state, "s", new, server_round)
        digest = 12345 if (server_round, pid) in wrong_digest else state_digest(state)
        metrics = {C.NUM_EXAMPLES: SIZES[pid], C.STATE_ROUND_USED: used, C.STATE_DIGEST: digest}
        if kind == "moon":
            metrics[C.MOON_CONTRASTIVE_LOSS] = float(pid)
        return Message(RecordDict({C.ARRAYS: record(local), C.METRICS: MetricRecord(metrics)}),
                       reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return client_info_reply(msg, partition_id=pid, num_examples=SIZES[pid])

    return app


def initial():
    return record({"w": np.zeros(2, np.float32), "step": np.array(0, np.int64)})


def start(strategy, app: ClientApp, rounds: int = 1):
    grid = InProcessGrid(app, len(SIZES), {})
    result = strategy.start(grid, initial(), num_rounds=rounds,
                            train_config=ConfigRecord({C.LR: 0.1}))
    return grid, result


# ------------------------------------------------------------------ FedDyn
def test_feddyn_one_round_by_hand():
    # theta^0 = 0, theta_k = k + 1, alpha = 0.5, m = 3: drift sum 6, h = -0.5 / 3 * 6 = -1;
    # theta^1 = mean(1, 2, 3) - h / alpha = 2 + 2 = 4; linear terms -0.5 (k + 1) (mean -1 = h)
    strategy = FedDyn(alpha=0.5, query_client_info=True)
    _, result = start(strategy, hand_app("feddyn"))
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [4.0, 4.0])
    assert numpy_of(result.arrays)["step"] == 2  # integer buffer: the plain average
    np.testing.assert_allclose(strategy.algorithm.h["w"], [-1.0, -1.0])
    assert set(strategy.algorithm.h) == {"w"}
    for pid in range(3):
        np.testing.assert_allclose(strategy.client_states.mirror.state_of(str(pid))["w"], [-0.5 * (pid + 1)] * 2)
        assert strategy.client_states.mirror.state_round(str(pid)) == 1
    diag = strategy.round_log(1)
    assert diag[C.LOG_CLIENT_STATE_ROUNDS] == [0, 0, 0] and diag[C.LOG_CLIENT_STATE_ATTACHED] == 0
    assert diag[C.LOG_FEDDYN_H_NORM] == pytest.approx(np.sqrt(2.0))


def test_feddyn_examples_weighting_and_partial_participation_by_hand():
    # round 1, partition 2 fails: drift sum 1 + 2 = 3 over m = 3: h = -0.5 / 3 * 3 = -0.5;
    # examples: (10 * 1 + 30 * 2) / 40 = 1.75; theta^1 = 1.75 + 0.5 / 0.5 = 2.75
    strategy = FedDyn(alpha=0.5, weighting="examples", query_client_info=True)
    _, result = start(strategy, hand_app("feddyn", fail={(1, 2)}))
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [2.75, 2.75])
    np.testing.assert_allclose(strategy.algorithm.h["w"], [-0.5, -0.5])
    assert strategy.client_states.mirror.state_round("2") == 0
    # h stays the mean over all m clients of the linear terms (partition 2's is still 0)
    copies = [strategy.client_states.mirror.state_of(str(p)) for p in range(3)]
    mean = np.mean([c["w"] if c else np.zeros(2) for c in copies], axis=0)
    np.testing.assert_allclose(mean, strategy.algorithm.h["w"])


def test_feddyn_sends_alpha_and_resends_the_copy_after_a_failed_reply():
    strategy, seen = FedDyn(alpha=0.25, query_client_info=True), []
    start(strategy, hand_app("feddyn", fail={(2, 1)}, seen=seen), rounds=3)
    assert all(m.content[C.CONFIG][C.FEDDYN_ALPHA] == 0.25 for m in seen)
    model = initial().count_bytes()
    linear = record({"w": np.zeros(2, np.float32)}).count_bytes()
    assert strategy.round_log(1)[C.LOG_BYTES_DOWN] == 3 * model
    third = strategy.round_log(3)
    assert third[C.LOG_CLIENT_STATE_ATTACHED] == 1 and third[C.LOG_BYTES_DOWN] == 3 * model + linear
    assert third[C.LOG_CLIENT_STATE_ROUNDS] == [2, 1, 2] and third[C.LOG_CLIENTS_FAILED] == 0


def test_feddyn_state_dict_round_trip():
    strategy = FedDyn(query_client_info=True)
    start(strategy, hand_app("feddyn"), rounds=2)
    state = strategy.state_dict()
    fresh = FedDyn(query_client_info=True)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.algorithm.h["w"], strategy.algorithm.h["w"])
    assert fresh.client_states.mirror.state_round("1") == 2
    assert fresh.client_states.mirror.digest_of("1") == strategy.client_states.mirror.digest_of("1")
    state["algorithm"]["h"]["w"][0] = 99.0  # copies, not views
    assert strategy.algorithm.h["w"][0] != 99.0
    with pytest.raises(ValueError, match="state of 'Moon'"):
        fresh.load_state_dict({**state, "class": "Moon"})


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0.0}, "alpha must be > 0"),
    ({"weighting": "scheme-ii", "query_client_info": True}, "'uniform'"),
    ({"server_lr": 0.5}, "server_lr must be 1.0"),
])
def test_feddyn_refuses_what_algorithm_1_does_not_define(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedDyn(**kwargs)


# ------------------------------------------------------------------ MOON
def test_moon_one_round_by_hand():
    # FedAvg's examples weighting: (10 * 1 + 30 * 2 + 60 * 3) / 100 = 2.5; each client's copy
    # is the model it returned; l_con logged as the examples-weighted mean of 0, 1, 2 = 1.5
    strategy, seen = Moon(mu=5.0, temperature=0.2, query_client_info=True), []
    _, result = start(strategy, hand_app("moon", seen=seen))
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [2.5, 2.5])
    for pid in range(3):
        copy = strategy.client_states.mirror.state_of(str(pid))
        np.testing.assert_array_equal(copy["w"], [pid + 1] * 2)
        assert copy["step"] == pid + 1
    assert strategy.round_log(1)[C.LOG_MOON_CONTRASTIVE_LOSS] == pytest.approx(1.5)
    config = seen[0].content[C.CONFIG]
    assert config[C.MOON_MU] == 5.0 and config[C.MOON_TEMPERATURE] == 0.2
    assert config[C.STATE_ROUND] == 0


def test_moon_resends_the_previous_model_after_a_failed_reply():
    strategy, seen = Moon(query_client_info=True), []
    start(strategy, hand_app("moon", fail={(2, 1)}, seen=seen), rounds=3)
    model = initial().count_bytes()
    third = strategy.round_log(3)
    assert third[C.LOG_CLIENT_STATE_ATTACHED] == 1 and third[C.LOG_BYTES_DOWN] == 4 * model
    attached = [m for m in seen if C.CLIENT_STATE in m.content]
    assert len(attached) == 1 and attached[0].content[C.CONFIG][C.STATE_ROUND] == 1
    # partition 1's model of round 1: theta^0 + 2 = 2 (its round-2 model was never accepted)
    np.testing.assert_array_equal(numpy_of(attached[0].content[C.CLIENT_STATE])["w"], [2.0, 2.0])


def test_moon_state_dict_round_trip():
    strategy = Moon(query_client_info=True)
    start(strategy, hand_app("moon"), rounds=2)
    fresh = Moon(query_client_info=True)
    fresh.load_state_dict(strategy.state_dict())
    assert fresh.client_states.mirror.state_round("2") == 2
    assert fresh.client_states.mirror.digest_of("2") == strategy.client_states.mirror.digest_of("2")
    state = strategy.state_dict()
    with pytest.raises(ValueError, match="client-state mirror version"):
        fresh.load_state_dict({**state, "client-states": {**state["client-states"], "version": 0}})


@pytest.mark.parametrize("kwargs, match", [({"mu": -0.1}, "mu must be >= 0"),
                                           ({"temperature": 0.0}, "tau must be > 0")])
def test_moon_refuses_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Moon(**kwargs)


# ------------------------------------------------------------------ both
@pytest.mark.parametrize("strategy, helper", [(FedDyn, "strategies.client.FedDynClient"),
                                              (Moon, "strategies.client.MoonClient")])
def test_a_stock_client_stops_with_one_error_naming_the_helper(strategy, helper):
    stock = ClientApp()

    @stock.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = {k: v + 1 for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.STOCK_TRAIN_LOSS: 0.5, C.NUM_EXAMPLES: 10})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)

    with pytest.raises(ClientContractError) as info:
        start(strategy(), stock, rounds=2)
    message = str(info.value)
    assert helper in message and "round 1" in message and "'state-digest'" in message


@pytest.mark.parametrize("strategy, kind", [(FedDyn, "feddyn"), (Moon, "moon")])
def test_a_reply_that_started_from_another_state_is_rejected(strategy, kind, caplog):
    instance = strategy(query_client_info=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(instance, hand_app(kind, wrong_digest={(2, 0)}), rounds=3)
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1 and "state of round 1 differs from the server's copy" in lines[0]
    assert instance.round_log(2)[C.LOG_CLIENTS_FAILED] == 1
    # its next message carries the copy; the client installs it and is accepted again
    assert instance.round_log(3)[C.LOG_CLIENT_STATE_ATTACHED] == 1
    assert instance.round_log(3)[C.LOG_CLIENTS_FAILED] == 0
    assert instance.round_log(3)[C.LOG_CLIENT_STATE_ROUNDS] == [1, 2, 2]


@pytest.mark.parametrize("strategy, words", [(FedDyn(alpha=0.3), "FedDyn: alpha 0.3"),
                                             (Moon(mu=5.0), "MOON: mu 5.0")])
def test_summary_names_the_algorithm(strategy, words, caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy.summary()
    assert any(words in r.getMessage() for r in caplog.records)
