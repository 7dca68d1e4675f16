"""FedExP (Jhunjhunwala, Wang and Joshi, ICLR 2023): the step size and the extrapolated
update against numbers worked out by hand, the same functions inside a round of the strategy
on the in-process Grid, the epsilon schedule, the registration's keys and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from fedapp.config import ConfigError, RunConfig
from fedapp.registry import build_strategy
from strategies import FedExP
from strategies import contract as C
from strategies.algorithms.fedexp import (LOG_FEDEXP_EPSILON, LOG_FEDEXP_ETA, extrapolate,
                                          squared_distance, step_size)
from strategies.client.info import client_info_reply
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record

# client k returns w + STEP[k]; its n_k is SIZES[k]
STEP = [np.array([3.0, 1.0]), np.array([-1.0, 1.0])]
SIZES = [10, 10]


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def app() -> ClientApp:
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        w = numpy_of(msg.content[C.ARRAYS])
        local = {"w": (w["w"] + STEP[pid]).astype(np.float32), "count": w["count"] + 1}
        return Message(RecordDict({C.ARRAYS: record(local), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: SIZES[pid]})}), reply_to=msg)

    @client.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return client_info_reply(msg, partition_id=pid, num_examples=SIZES[pid])

    return client


def test_the_step_size_by_hand():
    # Delta_1 = (3, 1), Delta_2 = (-1, 1), p = 1/2 each: Delta_bar = (1, 1), ||.||^2 = 2;
    # sum p ||Delta_i||^2 = (10 + 2) / 2 = 6; eta = 6 / (2 (2 + 2 eps))
    assert step_size([10.0, 2.0], [0.5, 0.5], 2.0, 1e-3) == pytest.approx(6 / (2 * 2.002))
    # aligned updates: eta would be 1/2, clipped to 1 (FedAvg)
    assert step_size([4.0, 4.0], [0.5, 0.5], 4.0, 1e-3) == 1.0
    assert step_size([4.0], [1.0], 4.0, 0.0) == 1.0


def test_the_update_and_the_norms_by_hand():
    w = {"w": np.array([1.0, 2.0], np.float32), "count": np.array(3, np.int64)}
    average = {"w": np.array([2.0, 3.0], np.float32), "count": np.array(4, np.int64)}
    assert squared_distance(average, w) == 2.0  # the counter is no parameter
    new = extrapolate(w, average, 1.5)
    np.testing.assert_array_equal(new["w"], np.array([2.5, 3.5], np.float32))
    assert new["w"].dtype == np.float32 and new["count"] == 4


def test_a_round_of_the_strategy_is_the_hand_computed_extrapolation():
    strategy = FedExP(query_client_info=True, fraction_evaluate=0.0, epsilon=1e-3)
    grid = InProcessGrid(app(), 2, {})
    start = record({"w": np.zeros(2, np.float32), "count": np.array(0, np.int64)})
    result = strategy.start(grid, start, num_rounds=1, train_config=ConfigRecord({C.LR: 0.1}))
    eta = 6 / (2 * (2 + 2 * 1e-3))
    np.testing.assert_allclose(numpy_of(result.arrays)["w"], [eta, eta], rtol=1e-6)
    log = strategy.round_log(1)
    assert log[LOG_FEDEXP_ETA] == pytest.approx(eta) and log[LOG_FEDEXP_EPSILON] == 1e-3


def test_epsilon_decays_by_d_squared_per_round():
    strategy = FedExP(query_client_info=True, fraction_evaluate=0.0, epsilon=0.1,
                      epsilon_decay=0.5)
    grid = InProcessGrid(app(), 2, {})
    start = record({"w": np.zeros(2, np.float32), "count": np.array(0, np.int64)})
    strategy.start(grid, start, num_rounds=2, train_config=ConfigRecord({C.LR: 0.1}))
    assert strategy.round_log(1)[LOG_FEDEXP_EPSILON] == pytest.approx(0.1 * 0.5 ** 2)
    assert strategy.round_log(2)[LOG_FEDEXP_EPSILON] == pytest.approx(0.1 * 0.5 ** 4)


@pytest.mark.parametrize("kwargs, match", [({"epsilon": 0.0}, "epsilon"),
                                           ({"epsilon_decay": 1.5}, "epsilon_decay"),
                                           ({"server_lr": 2.0}, "server_lr"),
                                           ({"weighting": "scheme-i"}, "weighting")])
def test_the_constructor_refuses_what_fedexp_cannot_honour(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedExP(**kwargs)


def test_the_app_builds_it_from_its_own_keys():
    cfg = RunConfig.from_user_config({"strategy": "fedexp", "fedexp-epsilon": 0.01,
                                      "fedexp-epsilon-decay": 0.998})
    strategy, _ = build_strategy(cfg)
    assert isinstance(strategy, FedExP)
    assert (strategy.algorithm.epsilon, strategy.algorithm.epsilon_decay) == (0.01, 0.998)
    with pytest.raises(ConfigError, match="server-lr"):
        RunConfig.from_user_config({"strategy": "fedexp", "server-lr": 0.5})
