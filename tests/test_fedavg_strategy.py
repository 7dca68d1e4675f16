"""Tests for strategies.FedAvg (Flower message-API Strategy subclass).

* aggregate_train on real reply Messages, one hand-computed example per weighting;
* rejection of bad replies (the good ones are still aggregated) and diagnostics;
* reproducible sampling keyed by partition id, via the in-process Grid and a tiny
  numpy-only ClientApp; fallback for a stock ClientApp without a query handler;
* constructor argument validation.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from strategies import WEIGHTINGS, FedAvg
from strategies import contract as C
from strategies.engine.records import ClientInfo
from tests.inprocess import InProcessGrid
from tests.messages import instruction, numpy_of, prepared_round, record


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages can only be built inside a run; pretend to be the ServerApp task."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1


# ---------------------------------------------------------------- helpers


def reply(node_or_instr, arrays: dict[str, np.ndarray] | None, metrics: dict | None) -> Message:
    instr = node_or_instr if isinstance(node_or_instr, Message) else instruction(node_or_instr)
    content = RecordDict()
    if arrays is not None:
        content[C.ARRAYS] = record(arrays)
    if metrics is not None:
        content[C.METRICS] = MetricRecord(metrics)
    msg = Message(content, reply_to=instr)
    assert msg.metadata.src_node_id == instr.metadata.dst_node_id
    return msg


def good(node, values, n, **extra) -> Message:
    return reply(node, {"w": np.asarray(values, dtype=np.float64)}, {C.NUM_EXAMPLES: n, **extra})


def prepared(weighting: str, global_w, sizes: dict[int, int], draws: dict[int, int],
             **kwargs) -> FedAvg:
    """A strategy in the state configure_train leaves behind (global model, nodes, sample)."""
    strategy = FedAvg(query_client_info=True, weighting=weighting, **kwargs)
    strategy.participation.clients.update({
        node: ClientInfo(partition_id=i, num_examples=n)
        for i, (node, n) in enumerate(sorted(sizes.items()))
    })
    return prepared_round(strategy, {"w": np.asarray(global_w, dtype=np.float64)},
                          {node: {} for node in draws}, draws=draws, nodes=sorted(sizes))


def result_w(arrays: ArrayRecord) -> np.ndarray:
    return numpy_of(arrays)["w"]


# ---------------------------------------------------------------- tiny ClientApp
def fake_sizes(context: Context) -> list[int]:
    return [int(s) for s in str(context.run_config.get("sizes", "")).split(",") if s]


fake_app = ClientApp()


@fake_app.query()
def fake_query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    sizes = fake_sizes(context)
    n = sizes[pid] if sizes else 10 * (pid + 1)
    return Message(RecordDict({C.METRICS: MetricRecord({C.PARTITION_ID: pid, C.NUM_EXAMPLES: n})}),
                   reply_to=msg)


@fake_app.train()
def fake_train(msg: Message, context: Context) -> Message:
    """Echo the model moved by (partition id + 1), with num-examples and a loss."""
    pid = int(context.node_config["partition-id"])
    sizes = fake_sizes(context)
    n = sizes[pid] if sizes else 10 * (pid + 1)
    arrays = {k: v + (pid + 1) for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
    metrics = MetricRecord({C.NUM_EXAMPLES: n, C.TRAIN_LOSS: float(pid), C.PARTITION_ID: pid})
    return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)


stock_app = ClientApp()  # a stock Flower client: train only, no query handler


@stock_app.train()
def stock_train(msg: Message, context: Context) -> Message:
    arrays = {k: v + 1 for k, v in numpy_of(msg.content[C.ARRAYS]).items()}
    metrics = MetricRecord({C.NUM_EXAMPLES: 5, C.STOCK_TRAIN_LOSS: 0.5})
    return Message(RecordDict({C.ARRAYS: record(arrays), C.METRICS: metrics}), reply_to=msg)


def partitions_of(grid: InProcessGrid, nodes) -> list[int]:
    return sorted(int(grid.contexts[n].node_config["partition-id"]) for n in nodes)


# ---------------------------------------------------------------- configure_train
def test_configure_train_then_aggregate_examples():
    grid = InProcessGrid(fake_app, 2, {"sizes": "10,30"})
    strategy = FedAvg(query_client_info=True, fraction_train=1.0, weighting="examples")
    messages = list(strategy.configure_train(1, record({"w": np.zeros(2)}),
                                             ConfigRecord({C.LR: 0.1}), grid))
    assert sorted(m.metadata.dst_node_id for m in messages) == sorted(grid.node_ids)
    for m in messages:
        assert m.metadata.message_type == MessageType.TRAIN
        assert m.content[C.CONFIG][C.SERVER_ROUND] == 1
        assert m.content[C.CONFIG][C.LR] == pytest.approx(0.1)
        np.testing.assert_array_equal(result_w(m.content[C.ARRAYS]), [0.0, 0.0])
    sizes = {n: strategy.participation.clients[n].num_examples for n in grid.node_ids}
    assert sizes == dict(zip(grid.node_ids, [10, 30]))
    by_node = {m.metadata.dst_node_id: m for m in messages}
    node0, node1 = grid.node_ids
    replies = [good(by_node[node0], [1.0, 2.0], 10, **{C.TRAIN_LOSS: 1.0}),
               good(by_node[node1], [3.0, 6.0], 30, **{C.TRAIN_LOSS: 3.0})]
    arrays, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0])
    assert metrics[C.NUM_EXAMPLES] == pytest.approx(40.0)
    assert metrics[C.TRAIN_LOSS] == pytest.approx(2.5)  # (10*1 + 30*3) / 40
    diag = strategy.round_log(1)
    assert diag[C.LOG_CLIENTS_SAMPLED] == 2 and diag[C.LOG_CLIENTS_RECEIVED] == 2
    assert diag[C.LOG_CLIENTS_FAILED] == 0
    assert diag["train-loss"] == pytest.approx(2.5)
    assert diag[C.LOG_BYTES_UP] > 0 and diag[C.LOG_BYTES_DOWN] > 0


# ---------------------------------------------------------------- weightings
def test_aggregate_examples_hand_computed():
    s = prepared("examples", [0.0, 0.0], {1: 10, 2: 30, 3: 60}, {1: 1, 2: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [1.0, 2.0], 10), good(2, [3.0, 6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0])


def test_aggregate_examples_uses_reply_num_examples():
    # n_k comes from the reply (what was trained on), not the query answer (the trust
    # gate only bounds it by the query answer: 30 <= 31)
    s = prepared("examples", [0.0, 0.0], {1: 999, 2: 31}, {1: 1, 2: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [1.0, 2.0], 10), good(2, [3.0, 6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0])


def test_aggregate_uniform_hand_computed():
    s = prepared("uniform", [0.0, 0.0], {1: 10, 2: 30}, {1: 1, 2: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [1.0, 2.0], 10), good(2, [3.0, 6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [2.0, 4.0])


def test_aggregate_pre_erratum_hand_computed():
    # n = 10 + 30 + 60 = 100; sampled 1, 2: w = 1 + 0.1*(2-1) + 0.3*(5-1) = 2.3
    s = prepared("pre-erratum", [1.0], {1: 10, 2: 30, 3: 60}, {1: 1, 2: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [2.0], 10), good(2, [5.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [2.3])


def test_aggregate_pre_erratum_unknown_size_filled_with_mean():
    # node 3 never reported a size: it is taken as the mean known size (20), n = 60:
    # w = 1 + (10/60)*(2-1) + (30/60)*(5-1) = 1 + 1/6 + 2 = 3.1666...
    s = prepared("pre-erratum", [1.0], {1: 10, 2: 30, 3: 60}, {1: 1, 2: 1})
    s.participation.clients[3].num_examples = None
    arrays, _ = s.aggregate_train(1, [good(1, [2.0], 10), good(2, [5.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [1 + 1 / 6 + 2])


def test_aggregate_scheme_i_hand_computed():
    # K = 3 draws: node 1 twice, node 2 once -> (3 + 3 + 6) / 3 = 4
    s = prepared("scheme-i", [0.0], {1: 10, 2: 30, 3: 60}, {1: 2, 2: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [3.0], 10), good(2, [6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [4.0])


def test_aggregate_scheme_ii_hand_computed():
    # p = (0.1, 0.2, 0.3, 0.4), N = 4, K = 2, sampled nodes 2 and 4:
    # c = (0.2*2, 0.4*2) = (0.4, 0.8); w = 1 + 0.4*(2-1) + 0.8*(3-1) = 3.0
    s = prepared("scheme-ii", [1.0], {1: 10, 2: 20, 3: 30, 4: 40}, {2: 1, 4: 1})
    arrays, _ = s.aggregate_train(1, [good(2, [2.0], 20), good(4, [3.0], 40)])
    np.testing.assert_allclose(result_w(arrays), [3.0])


def test_aggregate_scheme_ii_balanced_is_plain_mean():
    s = prepared("scheme-ii", [0.0], {1: 25, 2: 25, 3: 25, 4: 25}, {1: 1, 3: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [2.0], 25), good(3, [6.0], 25)])
    np.testing.assert_allclose(result_w(arrays), [4.0])


def test_server_lr_half():
    s = prepared("examples", [0.0, 0.0], {1: 10, 2: 30}, {1: 1, 2: 1}, server_lr=0.5)
    arrays, _ = s.aggregate_train(1, [good(1, [1.0, 2.0], 10), good(2, [3.0, 6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [1.25, 2.5])


def test_aggregate_preserves_dtypes_and_integer_buffers():
    s = prepared_round(FedAvg(query_client_info=True, weighting="examples"),
                       {"w": np.zeros(2, dtype=np.float32), "nbt": np.array([100], dtype=np.int64)},
                       {1: {}, 2: {}})
    replies = [
        reply(1, {"w": np.array([1.0, 2.0], np.float32), "nbt": np.array([110], np.int64)},
              {C.NUM_EXAMPLES: 10}),
        reply(2, {"w": np.array([3.0, 6.0], np.float32), "nbt": np.array([130], np.int64)},
              {C.NUM_EXAMPLES: 30}),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    out = numpy_of(arrays)
    assert out["w"].dtype == np.float32 and out["nbt"].dtype == np.int64
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    assert out["nbt"].tolist() == [125]  # 0.25*110 + 0.75*130


def test_aggregate_zero_dim_integer_buffer():
    s = prepared_round(FedAvg(query_client_info=True, weighting="examples"),
                       {"w": np.zeros(2, dtype=np.float32), "nbt": np.array(100, dtype=np.int64)},
                       {1: {}, 2: {}})
    replies = [
        reply(1, {"w": np.array([1.0, 2.0], np.float32), "nbt": np.array(110, np.int64)},
              {C.NUM_EXAMPLES: 10}),
        reply(2, {"w": np.array([3.0, 6.0], np.float32), "nbt": np.array(130, np.int64)},
              {C.NUM_EXAMPLES: 30}),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    out = numpy_of(arrays)
    assert out["nbt"].shape == () and int(out["nbt"]) == 125


# ---------------------------------------------------------------- bad replies
BAD_REPLIES = {
    "error": lambda node: Message(Error(code=0, reason="boom"), reply_to=instruction(node)),
    "missing-num-examples": lambda node: reply(node, {"w": np.array([9.0, 9.0])},
                                               {C.TRAIN_LOSS: 1.0}),
    "num-examples-zero": lambda node: good(node, [9.0, 9.0], 0),
    "num-examples-negative": lambda node: good(node, [9.0, 9.0], -5),
    "num-examples-fractional": lambda node: good(node, [9.0, 9.0], 2.5),
    "num-examples-list": lambda node: good(node, [9.0, 9.0], [1, 2]),
    "nan-array": lambda node: good(node, [float("nan"), 9.0], 20),
    "inf-array": lambda node: good(node, [float("inf"), 9.0], 20),
    "wrong-key": lambda node: reply(node, {"v": np.array([9.0, 9.0])}, {C.NUM_EXAMPLES: 20}),
    "extra-key": lambda node: reply(node, {"w": np.array([9.0, 9.0]), "v": np.zeros(1)},
                                    {C.NUM_EXAMPLES: 20}),
    "wrong-shape": lambda node: good(node, [9.0, 9.0, 9.0], 20),
    "wrong-dtype": lambda node: reply(node, {"w": np.array([9, 9], dtype=np.int64)},
                                      {C.NUM_EXAMPLES: 20}),
    "no-arrays": lambda node: reply(node, None, {C.NUM_EXAMPLES: 20}),
    "no-metrics": lambda node: reply(node, {"w": np.array([9.0, 9.0])}, None),
}


@pytest.mark.parametrize("weighting", ["examples", "uniform"])
@pytest.mark.parametrize("kind", sorted(BAD_REPLIES))
def test_bad_reply_rejected_good_ones_aggregated(kind, weighting, caplog):
    s = prepared(weighting, [0.0, 0.0], {1: 10, 2: 30, 3: 20}, {1: 1, 2: 1, 3: 1})
    replies = [good(1, [1.0, 2.0], 10), BAD_REPLIES[kind](3), good(2, [3.0, 6.0], 30)]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, metrics = s.aggregate_train(4, replies)
    expected = {"examples": [2.5, 5.0], "uniform": [2.0, 4.0]}[weighting]
    np.testing.assert_allclose(result_w(arrays), expected)
    assert metrics[C.NUM_EXAMPLES] == pytest.approx(40.0)
    assert s.round_log(4)[C.LOG_CLIENTS_FAILED] == 1
    assert s.round_log(4)[C.LOG_CLIENTS_RECEIVED] == 2
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and "node 3" in rejected[0].getMessage()


@pytest.mark.parametrize("bad_n", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_num_examples_rejected(bad_n):
    s = prepared("examples", [0.0, 0.0], {1: 10, 2: 30, 3: 20}, {1: 1, 2: 1, 3: 1})
    replies = [good(1, [1.0, 2.0], 10), good(3, [9.0, 9.0], bad_n), good(2, [3.0, 6.0], 30)]
    arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0])
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1


def test_failed_client_counts_and_weighting_renormalised_scheme_i():
    # node 3 (drawn once) fails; the remaining draws (2, 1) are renormalised: (3+3+6)/3 = 4
    s = prepared("scheme-i", [0.0], {1: 10, 2: 30, 3: 60}, {1: 2, 2: 1, 3: 1})
    arrays, _ = s.aggregate_train(2,
                                  [good(1, [3.0], 10), good(2, [6.0], 30), BAD_REPLIES["error"](3)])
    np.testing.assert_allclose(result_w(arrays), [4.0])
    assert s.round_log(2)[C.LOG_CLIENTS_FAILED] == 1


def test_missing_reply_counts_as_failed():
    s = prepared("examples", [0.0, 0.0], {1: 10, 2: 30, 3: 20}, {1: 1, 2: 1, 3: 1})
    arrays, _ = s.aggregate_train(1, [good(1, [1.0, 2.0], 10), good(2, [3.0, 6.0], 30)])
    np.testing.assert_allclose(result_w(arrays), [2.5, 5.0])
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 1


def test_all_replies_bad_keeps_model():
    s = prepared("examples", [1.0, 2.0], {1: 10, 2: 30}, {1: 1, 2: 1})
    before = s.plan.arrays
    replies = [BAD_REPLIES["error"](1), BAD_REPLIES["nan-array"](2)]
    assert s.aggregate_train(3, replies) == (None, None)
    assert s.plan.arrays is before
    np.testing.assert_array_equal(result_w(s.plan.arrays), [1.0, 2.0])
    assert s.round_log(3)[C.LOG_CLIENTS_FAILED] == 2
    assert s.round_log(3)[C.LOG_CLIENTS_RECEIVED] == 0


def test_no_replies_keeps_model():
    s = prepared("examples", [1.0, 2.0], {1: 10, 2: 30}, {1: 1, 2: 1})
    assert s.aggregate_train(1, []) == (None, None)
    assert s.round_log(1)[C.LOG_CLIENTS_FAILED] == 2


def test_run_keeps_model_when_every_client_fails():
    failing = ClientApp()
    received = []

    @failing.query()
    def q(msg, context):
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({C.PARTITION_ID: pid, C.NUM_EXAMPLES: 5})
        return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)

    @failing.train()
    def t(msg, context):
        received.append(numpy_of(msg.content[C.ARRAYS])["w"].tolist())
        raise RuntimeError("out of memory")

    grid = InProcessGrid(failing, 3, {})
    strategy = FedAvg(query_client_info=True, fraction_train=1.0)
    strategy.start(grid, record({"w": np.array([1.0, 2.0])}), num_rounds=2)
    # round 2 was sent the unchanged initial model
    assert received == [[1.0, 2.0]] * 6
    assert strategy.round_log(1)[C.LOG_CLIENTS_FAILED] == 3
    assert strategy.round_log(2)[C.LOG_CLIENTS_FAILED] == 3


# ---------------------------------------------------------------- sampling
def sampled_partitions(node_ids, seed, fraction=0.3, rounds=5, weighting="examples"):
    grid = InProcessGrid(fake_app, len(node_ids), {}, node_ids=node_ids)
    strategy = FedAvg(query_client_info=True, fraction_train=fraction, seed=seed,
                      weighting=weighting)
    arrays = record({"w": np.zeros(2)})
    out = []
    for r in range(1, rounds + 1):
        messages = list(strategy.configure_train(r, arrays, ConfigRecord(), grid))
        out.append(tuple(partitions_of(grid, [m.metadata.dst_node_id for m in messages])))
    return out


NODES_A = [1000 + 7919 * i for i in range(10)]
# descending: node order != partition order
NODES_B = [9_000_000_000 - 104_729 * i for i in range(10)]
NODES_C = [int(x) for x in np.random.default_rng(99).permutation(10**6)[:10] + 1]


@pytest.mark.parametrize("weighting", ["examples", "scheme-i"])
def test_sampling_independent_of_node_ids(weighting):
    a = sampled_partitions(NODES_A, seed=7, weighting=weighting)
    assert a == sampled_partitions(NODES_B, seed=7, weighting=weighting)
    assert a == sampled_partitions(NODES_C, seed=7, weighting=weighting)
    assert a != sampled_partitions(NODES_A, seed=8, weighting=weighting)


def test_sampling_varies_across_rounds():
    rounds = sampled_partitions(NODES_A, seed=7, rounds=8)
    assert len(set(rounds)) > 1


@pytest.mark.parametrize("fraction, expected",
                         [(0.05, 1), (0.1, 1), (0.3, 3), (0.35, 3), (0.5, 5), (1.0, 10)])
def test_sample_size(fraction, expected):
    for parts in sampled_partitions(NODES_A, seed=3, fraction=fraction, rounds=3):
        assert len(parts) == expected == max(int(fraction * 10 + 1e-9), 1)
        assert len(set(parts)) == expected


def test_scheme_i_draws_sum_to_m():
    grid = InProcessGrid(fake_app, 10, {})
    strategy = FedAvg(query_client_info=True, fraction_train=0.5, weighting="scheme-i", seed=1)
    for r in range(1, 6):
        messages = list(strategy.configure_train(r, record({"w": np.zeros(1)}), ConfigRecord(),
                                                 grid))
        tasks = strategy.plans[r].tasks
        assert sum(t.draws for t in tasks.values()) == 5
        assert sorted(m.metadata.dst_node_id for m in messages) == sorted(tasks)


def test_query_sent_once_per_node():
    grid = InProcessGrid(fake_app, 4, {})
    strategy = FedAvg(query_client_info=True, fraction_train=0.5)
    for r in range(1, 4):
        list(strategy.configure_train(r, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    queries = [node for node, kind in grid.calls if kind == MessageType.QUERY]
    assert sorted(queries) == sorted(grid.node_ids)


def test_query_that_did_not_reach_a_node_is_sent_again_next_round():
    """A SuperNode still reconnecting (its heartbeats missed) gets Flower's NODE_UNAVAILABLE
    error reply; asked again next round, it is ordered by its partition id from then on.
    A ClientApp's own error (no query handler, missing data) is not asked again."""
    unreachable = {"round": 1}

    def hook(msg, reply, context):
        pid = int(context.node_config["partition-id"])
        if msg.metadata.message_type == MessageType.QUERY and unreachable["round"] == 1:
            if pid == 0:
                return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node_unavail"),
                               reply_to=msg)
            if pid == 1:
                return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                     reason="no query handler"), reply_to=msg)
        return reply

    node_ids = [30, 20, 10]  # partition 0 has the largest node id
    grid = InProcessGrid(fake_app, 3, {}, node_ids=node_ids)
    grid.reply_hook = hook
    strategy = FedAvg(query_client_info=True, fraction_train=1.0)
    list(strategy.configure_train(1, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    assert strategy.participation.clients[30].unreached and strategy.participation.clients[30].partition_id is None
    assert not strategy.participation.clients[20].unreached and strategy.participation.clients[20].partition_id is None
    assert strategy.participation.ordered(node_ids) == [10, 20, 30]  # unknown ones last, by node id
    unreachable["round"] = 2
    for r in (2, 3):
        list(strategy.configure_train(r, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    queries = [node for node, kind in grid.calls if kind == MessageType.QUERY]
    assert sorted(queries) == [10, 20, 30, 30]  # only the unreached node, once more
    assert strategy.participation.clients[30].partition_id == 0 and not strategy.participation.clients[30].unreached
    assert strategy.participation.ordered(node_ids) == [30, 10, 20]  # partition 0, 2, then unknown


def test_full_run_with_fake_client_app():
    # 3 nodes, sizes 10, 30, 60, all sampled; client k returns w + (k + 1):
    # one round moves w by (10*1 + 30*2 + 60*3) / 100 = 2.5
    grid = InProcessGrid(fake_app, 3, {"sizes": "10,30,60"})
    strategy = FedAvg(query_client_info=True, fraction_train=1.0, weighting="examples")
    result = strategy.start(grid, record({"w": np.array([0.0, 1.0])}), num_rounds=2)
    np.testing.assert_allclose(result_w(result.arrays), [5.0, 6.0])
    # train-loss = partition id: (10*0 + 30*1 + 60*2) / 100 = 1.5
    assert result.train_metrics_clientapp[2][C.TRAIN_LOSS] == pytest.approx(1.5)


def test_stock_client_app_without_query_trains_and_warns_once(caplog):
    node_ids = [50, 10, 40, 20, 30]
    grid = InProcessGrid(stock_app, 5, {}, node_ids=node_ids)
    strategy = FedAvg(fraction_train=0.4, seed=11)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid, record({"w": np.zeros(2)}), num_rounds=3)
    # every round trained 2 nodes, each moving w by +1
    np.testing.assert_allclose(result_w(result.arrays), [3.0, 3.0])
    assert sum(1 for _, kind in grid.calls if kind == MessageType.TRAIN) == 6
    warnings = [r for r in caplog.records
                if r.levelno == logging.WARNING and C.QUERY_CLIENT_INFO in r.getMessage()]
    assert len(warnings) == 1
    assert all(info.partition_id is None for info in strategy.participation.clients.values())
    # fallback: node-id order
    assert strategy.participation.ordered(node_ids) == [10, 20, 30, 40, 50]


# ---------------------------------------------------------------- constructor
@pytest.mark.parametrize(
    "kwargs, name, value",
    [
        ({"fraction_train": 0}, "fraction_train", "0"),
        ({"fraction_train": 1.5}, "fraction_train", "1.5"),
        ({"fraction_train": -0.1}, "fraction_train", "-0.1"),
        ({"fraction_train": float("nan")}, "fraction_train", "nan"),
        ({"fraction_evaluate": -0.5}, "fraction_evaluate", "-0.5"),
        ({"fraction_evaluate": 2.0}, "fraction_evaluate", "2.0"),
        ({"weighting": "median"}, "weighting", "median"),
        ({"weighting": "Examples"}, "weighting", "Examples"),
        ({"server_lr": 0}, "server_lr", "0"),
        ({"server_lr": -1.0}, "server_lr", "-1.0"),
        ({"seed": "x"}, "seed", "'x'"),
        ({"seed": -1}, "seed", "-1"),
        ({"min_available_nodes": 0}, "min_available_nodes", "0"),
        ({"min_available_nodes": 1.5}, "min_available_nodes", "1.5"),
        ({"query_timeout": 0}, "query_timeout", "0"),
    ],
)
def test_invalid_constructor_args(kwargs, name, value):
    with pytest.raises(ValueError) as info:
        FedAvg(**kwargs)
    message = str(info.value)
    assert name in message
    assert re.search(re.escape(value), message)


def test_valid_constructor_args():
    for weighting in WEIGHTINGS:
        s = FedAvg(query_client_info=True, weighting=weighting, fraction_train=1.0,
                   fraction_evaluate=0.0, server_lr=2.0)
        assert s.weighting == weighting and s.server_lr == 2.0
    assert FedAvg(fraction_train=0.001).fraction_train == 0.001


def test_weightings_listed():
    assert set(WEIGHTINGS) == {"examples", "uniform", "pre-erratum", "scheme-i", "scheme-ii"}



def test_with_a_clock_a_node_the_query_did_not_reach_sits_the_round_out():
    """At 1,000 SuperNodes a query reply can come back NODE_UNAVAILABLE; the simulated clock
    keys profiles by partition id, so that node is left out of the round (not a crash) and
    joins once the next round's query reaches it."""
    from strategies.engine.clock import SimClock
    from strategies.engine.devices import GeneratedFleet

    reach = {"node 0": False}

    def hook(msg, reply, context):
        pid = int(context.node_config["partition-id"])
        if msg.metadata.message_type == MessageType.QUERY and pid == 0 and not reach["node 0"]:
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node_unavail"),
                           reply_to=msg)
        return reply

    grid = InProcessGrid(fake_app, 3, {}, node_ids=[30, 20, 10])
    grid.reply_hook = hook
    clock = SimClock(GeneratedFleet("homogeneous", seed=0), seconds_per_example=0.01)
    strategy = FedAvg(query_client_info=True, fraction_train=1.0, clock=clock)
    list(strategy.configure_train(1, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    assert sorted(strategy.plans[1].tasks) == [10, 20]  # partition 0's node sits out
    reach["node 0"] = True
    list(strategy.configure_train(2, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    assert sorted(strategy.plans[2].tasks) == [10, 20, 30]


def test_with_a_clock_a_node_whose_query_failed_sits_out_with_a_warning(caplog):
    """A ClientApp that answers the client-info query with an error (its data missing) has
    no partition id for the clock: it sits out, named once; the others train."""
    from strategies.engine.clock import SimClock
    from strategies.engine.devices import GeneratedFleet

    def hook(msg, reply, context):
        if msg.metadata.message_type == MessageType.QUERY and \
                int(context.node_config["partition-id"]) == 1:
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                 reason="data missing"), reply_to=msg)
        return reply

    grid = InProcessGrid(fake_app, 3, {}, node_ids=[30, 20, 10])
    grid.reply_hook = hook
    clock = SimClock(GeneratedFleet("homogeneous", seed=0), seconds_per_example=0.01)
    strategy = FedAvg(query_client_info=True, fraction_train=1.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for r in (1, 2):
            list(strategy.configure_train(r, record({"w": np.zeros(1)}), ConfigRecord(), grid))
    assert sorted(strategy.plans[2].tasks) == [10, 30]
    said = [m for m in caplog.messages if "cannot time them, so they sit out: 20" in m]
    assert len(said) == 1
