"""The trust gate's pure functions (strategies/engine/trust_gate.py) and the fixes around it:
the .npy payload checks, the scalar bounds with hand-computed limits, the client-info
checks, the checked aggregate_evaluate against Flower's own, SCAFFOLD's option-II bound,
FedVeca's eq. (8) without recursion, and state that is not finite not being adopted."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
from flwr.supercore.task_identity import TaskIdentity

from strategies import contract as C
from strategies.algorithms import fedveca_math as vm
from strategies.algorithms.fedveca import global_gradient
from strategies.engine import records
from strategies.algorithms import scaffold_math as sm
from strategies.engine import trust_gate as tg
from strategies.algorithms.flower_optimizers import FedAdam, FedAvgM
from tests.inprocess import InProcessGrid


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def npy(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


def declared(data: bytes, dtype="float32", shape=(3, 4), stype="numpy.ndarray") -> Array:
    return Array(dtype=dtype, shape=shape, stype=stype, data=data)


LAYER = np.arange(12, dtype=np.float32).reshape(3, 4)
SPEC = tg.ArraySpec((3, 4), np.dtype(np.float32))


def refusal(array: Array, expected=SPEC) -> str:
    with pytest.raises(tg.Refused) as info:
        tg.read_array(array, expected, "'arrays' array 'w'")
    return str(info.value)


# ---------------------------------------------------------------- .npy payloads
def test_a_good_payload_is_a_read_only_view_of_the_bytes_not_a_copy():
    array = Array(LAYER)
    view = tg.read_array(array, SPEC, "w")
    np.testing.assert_array_equal(view, LAYER)
    assert not view.flags.writeable
    assert np.shares_memory(view, np.frombuffer(array.data, np.uint8))


def test_a_one_element_payload_declared_with_the_layer_shape_is_refused():
    # before the gate it was broadcast silently into the layer
    message = refusal(declared(npy(np.array([7.0], np.float32))))
    assert "declares float32(3, 4) but its bytes hold float32(1,)" in message


def test_another_arrays_bytes_are_refused_naming_the_array():
    message = refusal(declared(npy(np.zeros(13, np.float32))))
    assert message.startswith("'arrays' array 'w' declares") and "(13,)" in message


@pytest.mark.parametrize("data, word", [
    (npy(LAYER)[:-4], "truncated"),
    (npy(LAYER) + b"\0" * 4, "trailing bytes"),
    (npy(LAYER)[:8], "too short"),
    (b"\x93NUMPZ" + npy(LAYER)[6:], "bad magic"),
    (b"\x93NUMPY\x03\x00" + npy(LAYER)[8:], "version 3.0"),
    (npy(LAYER.astype(np.float64)), "bytes hold float64"),
    (npy(LAYER.reshape(4, 3)), "bytes hold float32(4, 3)"),
])
def test_malformed_payloads_are_refused(data, word):
    assert word in refusal(declared(data))


def test_an_over_long_header_is_refused_before_numpy_reads_it():
    body = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }".ljust(59_999) + "\n"
    data = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode() + LAYER.tobytes()
    assert "header of 60000 bytes" in refusal(declared(data))


def test_an_object_dtype_and_another_stype_are_refused():
    body = "{'descr': '|O', 'fortran_order': False, 'shape': (3, 4), }".ljust(63) + "\n"
    data = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode() + b"\0" * 96
    assert "Python objects" in refusal(declared(data, dtype="object"))
    assert "stype 'pickle'" in refusal(declared(npy(LAYER), stype="pickle"))


def test_the_expected_dtype_and_shape_must_match():
    assert "expected float32(3, 4)" in refusal(Array(LAYER.astype(np.float64)))
    assert "expected float32(3, 4)" in refusal(Array(np.zeros((4, 3), np.float32)))


def test_values_nan_inf_and_the_norm_bound():
    # sqrt(float32 max) = 1.84e19: a float32 sum of squares of 1e19 is 1e38 (finite), of 2e19
    # is 4e38 (Inf)
    assert tg.value_problem(np.array([1e19], np.float32)) is None
    assert "L2 norm" in tg.value_problem(np.array([2e19], np.float32))
    assert "L2 norm" in tg.value_problem(np.array([2e19], np.float64))
    assert tg.value_problem(np.array([1e19], np.float64)) is None
    assert tg.value_problem(np.array([1.0, np.nan], np.float32)) == "has NaN or Inf"
    assert tg.value_problem(np.array([np.inf], np.float32)) == "has NaN or Inf"
    assert tg.value_problem(np.array(2**60, np.int64)) is not None
    assert tg.value_problem(np.array(5, np.int64)) is None


def test_read_record_names_missing_and_extra_keys():
    record = ArrayRecord({"w": Array(LAYER), "extra": Array(LAYER)})
    with pytest.raises(tg.Refused, match=r"missing \['b'\], unexpected \['extra'\]"):
        tg.read_record("arrays", record, {"w": SPEC, "b": SPEC})


# ---------------------------------------------------------------- scalars
def metrics(**values) -> dict:
    return {C.NUM_EXAMPLES: 20, **values}


def test_num_examples_within_the_query_answer_or_the_cap():
    ok = tg.train_metrics_problem
    assert ok(metrics(), sent=None, reported_size=20) is None
    assert "above 20" in ok(metrics(**{C.NUM_EXAMPLES: 21}), sent=None, reported_size=20)
    assert ok(metrics(**{C.NUM_EXAMPLES: tg.MAX_NUM_EXAMPLES}), sent=None,
              reported_size=None) is None
    assert "MAX_NUM_EXAMPLES" in ok(metrics(**{C.NUM_EXAMPLES: tg.MAX_NUM_EXAMPLES + 1}),
                                    sent=None, reported_size=None)
    assert ok(metrics(**{C.NUM_EXAMPLES: 2.5}), sent=None, reported_size=None)
    assert ok(metrics(**{C.NUM_EXAMPLES: True}), sent=None, reported_size=None)


def test_steps_bound_by_hand():
    assert tg.steps_bound({C.LOCAL_STEPS: 7}, 100) == 7
    # E = 2, B = 10, n = 25: a DataLoader without drop_last runs 2 * ceil(25 / 10) = 6 steps
    assert tg.steps_bound({C.LOCAL_STEPS: 0, C.LOCAL_EPOCHS: 2, C.BATCH_SIZE: 10}, 25) == 6
    # E = 0.5: ceil(0.5 * 3) = 2; full batch (B = 0), E = 3: 3 steps
    assert tg.steps_bound({C.LOCAL_EPOCHS: 0.5, C.BATCH_SIZE: 10}, 25) == 2
    assert tg.steps_bound({C.LOCAL_EPOCHS: 3, C.BATCH_SIZE: 0}, 25) == 3
    assert tg.steps_bound({}, 25) == tg.MAX_LOCAL_STEPS


def test_local_steps_within_what_was_sent():
    sent = {C.LOCAL_STEPS: 5}
    check = tg.train_metrics_problem
    assert check(metrics(**{C.LOCAL_STEPS_TAKEN: 5}), sent=sent, reported_size=None) is None
    assert "above 5" in check(metrics(**{C.LOCAL_STEPS_TAKEN: 6}), sent=sent,
                              reported_size=None)
    assert check(metrics(**{C.LOCAL_STEPS_TAKEN: 0}), sent=sent, reported_size=None)
    assert check(metrics(**{C.LOCAL_STEPS_TAKEN: 10**12}), sent=sent, reported_size=None)


def test_a_norm_bound_is_tau_over_one_minus_rho():
    # tau = 4, rho = 0.5: the bound is 8; momentum SGD's own ||a||_1 is (4 - 0.5 * 0.9375 /
    # 0.5) / 0.5 = 6.125 (FedNova, Wang et al. 2020)
    from strategies.engine.averaging import fednova_norm_momentum
    assert fednova_norm_momentum(4, 0.5) == pytest.approx(6.125)
    sent = {C.LOCAL_STEPS: 4, C.MOMENTUM: 0.5}
    check = tg.train_metrics_problem
    for a_norm, ok in ((6.125, True), (8.0, True), (8.01, False), (0.0, False), (1e12, False)):
        problem = check(metrics(**{C.LOCAL_STEPS_TAKEN: 4, C.A_NORM: a_norm}), sent=sent,
                        reported_size=None)
        assert (problem is None) == ok, (a_norm, problem)


# ---------------------------------------------------------------- client-info answers
@pytest.mark.parametrize("field, value", [
    (C.PARTITION_ID, float("nan")), (C.PARTITION_ID, -1), (C.PARTITION_ID, 2.5),
    (C.PARTITION_ID, tg.MAX_PARTITION_ID + 1), (C.NUM_EXAMPLES, -1), (C.NUM_EXAMPLES, 2.5),
    (C.NUM_EXAMPLES, tg.MAX_NUM_EXAMPLES + 1), (C.LABEL_COUNTS, 5), (C.LABEL_COUNTS, [1, -1]),
    (C.LABEL_COUNTS, []), (C.COMM_BUDGET, float("inf")), (C.COMM_BUDGET, 0.0),
])
def test_client_facts_refuse_each_bad_field(field, value):
    answer = {C.PARTITION_ID: 3, C.NUM_EXAMPLES: 10, C.LABEL_COUNTS: [4, 6], **{field: value}}
    refused = tg.client_facts(answer)
    assert isinstance(refused, tg.FactRefusal) and refused.field == field
    line = refused.line(77)
    assert "node 77" in line and f"'{field}'" in line and "Fix" in line


def test_an_empty_partition_is_an_honest_fact():
    """n = 0 is what a node with an empty partition truthfully answers; its train replies are
    skipped (tests/test_reliability_data.py), its facts are kept."""
    facts = tg.client_facts({C.PARTITION_ID: 3, C.NUM_EXAMPLES: 0, C.LABEL_COUNTS: [0, 0]})
    assert facts == tg.ClientFacts(3, 0, [0, 0], None)


def test_client_facts_and_conflicts():
    facts = tg.client_facts({C.PARTITION_ID: 3, C.NUM_EXAMPLES: 10, C.LABEL_COUNTS: [4, 6]})
    assert facts == tg.ClientFacts(3, 10, [4, 6], None)
    other = records.ClientInfo(partition_id=3, label_counts=[1, 1])
    assert tg.facts_conflict(facts, [other]).field == C.PARTITION_ID
    ragged = records.ClientInfo(partition_id=4, label_counts=[1, 1, 1])
    assert tg.facts_conflict(facts, [ragged]).field == C.LABEL_COUNTS
    assert tg.facts_conflict(facts, [records.ClientInfo(partition_id=4,
                                                        label_counts=[0, 9])]) is None


def query_app(answers: dict[int, dict]) -> ClientApp:
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(answers[pid])}), reply_to=msg)

    return app


def test_update_clients_refuses_the_second_claimant_and_bad_answers(caplog):
    answers = {0: {C.PARTITION_ID: 0, C.NUM_EXAMPLES: 10, C.LABEL_COUNTS: [4, 6]},
               1: {C.PARTITION_ID: 0, C.NUM_EXAMPLES: 10, C.LABEL_COUNTS: [4, 6]},
               2: {C.PARTITION_ID: 2, C.NUM_EXAMPLES: -4, C.LABEL_COUNTS: [4, 6]},
               3: {C.PARTITION_ID: 3, C.NUM_EXAMPLES: 10, C.LABEL_COUNTS: [4, 6]}}
    grid = InProcessGrid(query_app(answers), 4, {})
    clients: dict[int, records.ClientInfo] = {}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        nodes, _ = records.update_clients(grid, clients, min_nodes=4, query=True, timeout=5,
                                          owner="test", warned=True)
    first, second, negative, fine = grid.node_ids
    assert clients[first].partition_id == 0 and clients[fine].partition_id == 3
    assert clients[second].refused and clients[second].partition_id is None
    assert clients[negative].refused and clients[negative].num_examples is None
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"node {second}" in line and "already claimed" in line for line in lines)
    assert any(f"node {negative}" in line and "'num-examples' = -4" in line for line in lines)
    assert records.usable_nodes(nodes, clients) == [first, fine]


# ---------------------------------------------------------------- evaluate replies
def evaluate_reply(node: int, **values) -> Message:
    msg = Message(RecordDict(), dst_node_id=node, message_type="evaluate")
    reply = Message(RecordDict({C.METRICS: MetricRecord(values)}), reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


def test_aggregate_evaluate_equals_flowers_on_good_replies_and_drops_bad_ones(caplog):
    good = [evaluate_reply(1, **{C.NUM_EXAMPLES: 10, C.EVAL_LOSS: 1.0, C.EVAL_ACCURACY: 0.5}),
            evaluate_reply(2, **{C.NUM_EXAMPLES: 30, C.EVAL_LOSS: 2.0, C.EVAL_ACCURACY: 0.25})]
    flower = aggregate_metricrecords([r.content for r in good], C.NUM_EXAMPLES)
    assert dict(tg.aggregate_evaluate(good).items()) == dict(flower.items())
    bad = [evaluate_reply(3, **{C.NUM_EXAMPLES: -10, C.EVAL_LOSS: 1.0, C.EVAL_ACCURACY: 0.5}),
           evaluate_reply(4, **{C.NUM_EXAMPLES: 10, C.EVAL_LOSS: float("nan"),
                                C.EVAL_ACCURACY: 0.5}),
           evaluate_reply(5, **{C.NUM_EXAMPLES: 10, C.EVAL_LOSS: 1.0, C.EVAL_ACCURACY: 0.5,
                                "extra": 1.0})]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        mixed = tg.aggregate_evaluate(good + bad)
    assert dict(mixed.items()) == dict(flower.items())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3 and all(f"node {n}" in line for n, line in zip((3, 4, 5), lines))
    assert tg.aggregate_evaluate(bad[:2]) is None


# ---------------------------------------------------------------- SCAFFOLD's bound
def test_scaffold_delta_bound_by_hand_and_option_ii_within_it():
    c = {"w": np.array([3.0, 4.0], np.float32)}  # ||c|| = 5
    x = {"w": np.array([1.0, 1.0], np.float32)}
    y = {"w": np.array([0.7, 0.6], np.float32)}  # ||x - y|| = 0.5
    # 5 + 0.5 / (K eta_l) = 5 + 0.5 / (2 * 0.05) = 10, times 1 + 1e-3
    assert sm.delta_bound(c, x, y, 2, 0.05) == pytest.approx(10.01)
    c_i = {"w": np.array([1.0, -2.0], np.float32)}
    delta = sm.control_delta(sm.option_ii(c_i, c, x, y, 2, 0.05), c_i)
    assert sm.delta_norm(delta) <= sm.delta_bound(c, x, y, 2, 0.05)
    assert sm.delta_norm({"w": np.array([1e30, 0.0])}) > sm.delta_bound(c, x, y, 2, 0.05)


# ---------------------------------------------------------------- FedVeca's eq. (8)
def test_gradient_mean_of_overflowing_finite_gradients_without_recursion():
    grads = [{"w": np.full(3, 3e38, np.float32)}, {"w": np.full(3, 1e38, np.float32)}]
    summed = vm.GradientSum()
    for g in grads:
        summed.add(g, 1000.0)
    assert summed.non_finite_key() == "w"  # D_i-weighted float32 sum overflows
    result = vm.gradient_mean(grads, [1000, 1000])
    assert result.kept == (0, 1) and result.rejected == ()
    np.testing.assert_allclose(result.mean["w"], np.full(3, 2e38), rtol=1e-6)


def test_gradient_mean_leaves_out_nan_gradients_and_keeps_exact_numbers():
    grads = [{"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([np.nan, 0], np.float32)},
             {"w": np.array([3.0, 6.0], np.float32)}]
    result = vm.gradient_mean(grads, [10, 5, 30])
    assert result.kept == (0, 2) and result.rejected == ((1, "w"),)
    np.testing.assert_array_equal(result.mean["w"], vm.global_gradient(
        [grads[0], grads[2]], [10, 30])["w"])


def fedveca_reply(node: int, grad: np.ndarray, n: int) -> Message:
    msg = Message(RecordDict(), dst_node_id=node, message_type="train")
    content = RecordDict({C.GRAD: records.to_record({"w": grad}),
                          C.METRICS: MetricRecord({C.NUM_EXAMPLES: n})})
    reply = Message(content, reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


def test_fedveca_global_gradient_no_longer_recurses_on_overflow():
    # was: RecursionError (global_gradient called itself with the same list)
    replies = [fedveca_reply(1, np.full(4, 3e38, np.float32), 1000),
               fedveca_reply(2, np.full(4, 3e38, np.float32), 1000)]
    grad, covered = global_gradient(replies)
    assert covered == [0, 1] and np.isfinite(grad["w"]).all()


# ---------------------------------------------------------------- adopted state
def test_finite_or_previous_keeps_the_previous_state(caplog):
    previous = {"c": np.zeros(2, np.float32)}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        kept = tg.finite_or_previous({"c": np.array([np.inf, 0], np.float32)}, previous,
                                     "SCAFFOLD's c", 4)
    assert kept is previous
    assert "Round 4: SCAFFOLD's c is not finite" in caplog.records[-1].getMessage()
    new = {"c": np.ones(2, np.float32)}
    assert tg.finite_or_previous(new, previous, "c", 4) is new


def train_reply(node: int, arrays: dict, n: int = 10, steps: int = 1) -> Message:
    msg = Message(RecordDict(), dst_node_id=node, message_type="train")
    content = RecordDict({C.ARRAYS: records.to_record(arrays),
                          C.METRICS: MetricRecord({C.NUM_EXAMPLES: n, C.LOCAL_STEPS_TAKEN: steps})})
    reply = Message(content, reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


def test_flower_fedadam_refuses_a_crafted_reply_and_equals_the_honest_aggregate(caplog):
    start = records.to_record({"w": np.zeros((2, 2), np.float32)})
    honest = [train_reply(1, {"w": np.full((2, 2), 1.0, np.float32)}, 10),
              train_reply(2, {"w": np.full((2, 2), 3.0, np.float32)}, 30)]
    crafted = train_reply(3, {"w": np.zeros((2, 2), np.float32)})
    crafted.content[C.ARRAYS]["w"] = Array(dtype="float32", shape=(2, 2), stype="numpy.ndarray",
                                           data=npy(np.array([1e6], np.float32)))

    def run(replies):
        strategy = FedAdam(eta=0.1, min_available_nodes=1, min_train_nodes=1)
        strategy.configure_train(1, start, ConfigRecord({C.LOCAL_STEPS: 1}), OneNodeGrid())
        return strategy.aggregate_train(1, replies)

    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = run([*honest, crafted])
    expected, _ = run(honest)
    np.testing.assert_array_equal(arrays["w"].numpy(), expected["w"].numpy())
    assert any("node 3" in r.getMessage() and "bytes hold float32(1,)" in r.getMessage()
               for r in caplog.records)


def test_flower_fedavgm_keeps_model_and_momentum_when_the_step_overflows(caplog):
    start = records.to_record({"w": np.zeros(2, np.float32)})
    strategy = FedAvgM(server_learning_rate=1e30, server_momentum=0.9, min_available_nodes=1,
                       min_train_nodes=1)
    strategy.configure_train(1, start, ConfigRecord({C.LOCAL_STEPS: 1}), OneNodeGrid())
    before = (strategy.current_arrays, strategy.momentum_vector)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, metrics = strategy.aggregate_train(
            1, [train_reply(1, {"w": np.full(2, 1e9, np.float32)})])
    assert arrays is None and metrics is None
    assert (strategy.current_arrays, strategy.momentum_vector) == before
    assert any("not finite" in r.getMessage() for r in caplog.records)


class OneNodeGrid(InProcessGrid):
    """A Grid with one node and no ClientApp (configure_train only samples)."""

    def __init__(self) -> None:
        super().__init__(None, 1, {})


def test_a_client_error_is_still_a_client_error():
    msg = Message(RecordDict(), dst_node_id=1, message_type="train")
    reply = Message(Error(code=0, reason="down"), reply_to=msg)
    assert tg.train_reply_problem(reply, {}, sent=None, reported_size=None) == \
        "client error: down"
