"""The strategies with a stock Flower ClientApp (train + evaluate only, as in Flower's
quickstart-pytorch template), with Flower's defaults, and with the client helpers.

* no client-info query is sent unless asked for, and one WARNING says what is lost;
* a configuration that needs the query, without it, is one ValueError naming the helper;
* a strategy whose contract the clients do not implement stops with one
  ClientContractError naming the helper to call;
* DynamicFL logs the server-side evaluation and a final summary as Flower's start does.
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.supercore.task_identity import TaskIdentity

from strategies import ClientContractError, DynamicFL, FedAvg, FedNova, FedProx, FedVeca
from strategies import contract as C
from strategies.client.info import client_info_reply
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record

SIZES = [10, 30, 60]
QUERY_HELPER = "strategies.client.client_info_reply"


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


def stock_train(msg: Message, context: Context) -> Message:
    """The template's train: E epochs, whatever the server asked; w + 1 here."""
    pid = int(context.node_config["partition-id"])
    arrays = {k: v + 1 for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
    metrics = MetricRecord({C.STOCK_TRAIN_LOSS: 0.5, C.NUM_EXAMPLES: SIZES[pid]})
    return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)


def stock_evaluate(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    metrics = MetricRecord({"eval_loss": 1.0, "eval_acc": 0.5, C.NUM_EXAMPLES: SIZES[pid]})
    return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)


stock_app = ClientApp()
stock_app.train()(stock_train)
stock_app.evaluate()(stock_evaluate)

helped_app = ClientApp()  # the stock app plus the client-info query helper
helped_app.train()(stock_train)
helped_app.evaluate()(stock_evaluate)


@helped_app.query()
def helped_query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return client_info_reply(msg, partition_id=pid, num_examples=SIZES[pid])


def run(strategy, app=stock_app, rounds=2, **kwargs):
    grid = InProcessGrid(app, len(SIZES), {})
    result = strategy.start(grid, record({"w": np.zeros(2)}), num_rounds=rounds, **kwargs)
    return grid, result


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- defaults
def test_defaults_match_flowers_where_flower_has_the_parameter():
    flower = inspect.signature(FlowerFedAvg.__init__).parameters
    for cls in (FedAvg, FedProx, FedNova, FedVeca, DynamicFL):
        ours = inspect.signature(cls.__init__).parameters
        if "min_available_nodes" in ours:
            assert ours["min_available_nodes"].default == flower["min_available_nodes"].default == 2
    assert FedAvg().min_available_nodes == 2
    assert FedVeca().min_available_nodes == 2
    dyn = DynamicFL(intervals="a", local_steps=3)
    assert dyn.fraction_train == flower["fraction_train"].default == 1.0
    assert dyn.min_available_nodes == 2
    assert FedAvg().fraction_evaluate == flower["fraction_evaluate"].default == 1.0
    assert dyn.fraction_evaluate == 1.0
    assert FedAvg().participation.query_client_info is False
    assert dyn.participation.query_client_info is False


def test_summary_states_the_deliberate_differences(caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        FedAvg().summary()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "min_train_nodes" in text


# ---------------------------------------------------------------- client-info query
@pytest.mark.parametrize("cls", [FedAvg, FedProx])
def test_stock_client_gets_no_query_and_one_warning(cls, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        grid, result = run(cls())
    assert not [kind for _, kind in grid.calls if kind == MessageType.QUERY]
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [2.0, 2.0])
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert QUERY_HELPER in warnings[0] and "query_client_info=True" in warnings[0]
    assert "not reproducible" in warnings[0] and "n_k" in warnings[0]
    assert result.evaluate_metrics_clientapp[2]["eval_acc"] == pytest.approx(0.5)


def test_query_opt_in_with_the_helper_sends_it_once_per_node(caplog):
    strategy = FedAvg(query_client_info=True, weighting="pre-erratum", fraction_train=0.5)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        grid, _ = run(strategy, helped_app, rounds=3)
    queries = [node for node, kind in grid.calls if kind == MessageType.QUERY]
    assert sorted(queries) == sorted(grid.node_ids)
    assert sorted(i.partition_id for i in strategy.participation.clients.values()) == [0, 1, 2]
    assert sorted(i.num_examples for i in strategy.participation.clients.values()) == SIZES
    assert not warnings_of(caplog)


@pytest.mark.parametrize("weighting", ["pre-erratum", "scheme-i", "scheme-ii"])
@pytest.mark.parametrize("cls", [FedAvg, FedProx])
def test_weightings_that_need_every_n_k_need_the_query(cls, weighting):
    with pytest.raises(ValueError) as info:
        cls(weighting=weighting)
    assert QUERY_HELPER in str(info.value) and weighting in str(info.value)
    assert cls(weighting=weighting, query_client_info=True).weighting == weighting


# ---------------------------------------------------------------- contracts
def test_fednova_with_a_stock_client_derives_tau_like_a_dataloader():
    # E = 1, B = 8, n = (10, 30, 60): tau = ceil(n / 8) = (2, 4, 8), p = (0.1, 0.3, 0.6);
    # every client moves w by 1, d_i = -1 / tau_i: tau_eff = 0.2 + 1.2 + 4.8 = 6.2,
    # sum_i p_i d_i = -(0.05 + 0.075 + 0.075) = -0.2, so w grows by 1.24 per round
    strategy = FedNova(local_epochs=1, batch_size=8)
    _, result = run(strategy)
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [2.48, 2.48])
    assert strategy.round_log(1)[C.LOG_A_NORMS] == [2.0, 4.0, 8.0]


def test_fednova_with_a_stock_client_and_no_batch_size_stops_naming_the_fix():
    with pytest.raises(ValueError, match="report_local_steps") as info:
        run(FedNova(), train_config=ConfigRecord({C.LR: 0.1}))
    assert "batch_size" in str(info.value)


def test_fedveca_with_a_stock_client_stops_with_one_error_naming_the_helper():
    grid = InProcessGrid(stock_app, len(SIZES), {})
    with pytest.raises(ClientContractError) as info:
        FedVeca().start(grid, record({"w": np.zeros(2)}), num_rounds=3,
                        train_config=ConfigRecord({C.LR: 0.01}))
    message = str(info.value)
    assert "strategies.client.fedveca_train" in message and "round 1" in message
    assert sum(1 for _, kind in grid.calls if kind == MessageType.TRAIN) == len(SIZES)


def test_dynamicfl_with_a_stock_client_stops_with_one_error_naming_the_helper():
    grid = InProcessGrid(stock_app, len(SIZES), {})
    with pytest.raises(ClientContractError, match="strategies.client.train_chunk"):
        DynamicFL(intervals="a", local_steps=3, poll_interval=0).start(
            grid, record({"w": np.zeros(2)}), num_rounds=2, train_config=ConfigRecord({C.LR: 0.1}))


@pytest.mark.parametrize("kwargs, what", [
    ({}, "intervals='a-g'"),  # the defaults: DynaComm needs label counts
    ({"intervals": "b*", "local_steps": 4}, "intervals='b*'"),
    ({"intervals": "a", "local_steps": 0}, "local_steps=0"),
])
def test_dynamicfl_configurations_that_need_the_query(kwargs, what):
    with pytest.raises(ValueError) as info:
        DynamicFL(**kwargs)
    assert QUERY_HELPER in str(info.value) and what in str(info.value)
    DynamicFL(query_client_info=True, **kwargs)


def chunk_app() -> ClientApp:
    """A client honouring the chunk contract (what strategies.client.dynamicfl.train_chunk
    reports): w + num-steps, local-steps = num-steps."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        k = int(msg.content[C.CONFIG][C.NUM_STEPS])
        arrays = {key: v + k for key, v in numpy_of(msg.content[C.ARRAYS]).items()}
        metrics = MetricRecord({C.NUM_EXAMPLES: SIZES[pid], C.LOCAL_STEPS_TAKEN: k,
                                C.TRAIN_LOSS: float(pid)})
        return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)

    return app


def test_dynamicfl_logs_server_evaluation_and_a_final_summary(caplog):
    def evaluate_fn(server_round, arrays):
        return MetricRecord({"accuracy": float(numpy_of(arrays)["w"][0])})

    strategy = DynamicFL(intervals="a", local_steps=3, poll_interval=0)
    grid = InProcessGrid(chunk_app(), len(SIZES), {})
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = strategy.start(grid, record({"w": np.zeros(2)}), num_rounds=2,
                                train_config=ConfigRecord({C.LR: 0.1}), evaluate_fn=evaluate_fn)
    # 3 steps per round, each +1: w = 3 after round 1, 6 after round 2
    assert result.evaluate_metrics_serverapp[1]["accuracy"] == pytest.approx(3.0)
    assert result.evaluate_metrics_serverapp[2]["accuracy"] == pytest.approx(6.0)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Initial global evaluation results" in text
    assert text.count("Global evaluation") == 2
    assert "Strategy execution finished" in text and "Final results:" in text
    assert "'accuracy': 6.0" in text
    # with the query off, sampling warned once
    assert len([m for m in warnings_of(caplog) if QUERY_HELPER in m]) == 1


def test_dynamicfl_runs_its_own_rounds_not_flowers_split_hooks():
    strategy = DynamicFL(intervals="a", local_steps=3)
    with pytest.raises(RuntimeError, match="its own start"):
        strategy.aggregate_train(1, [])
