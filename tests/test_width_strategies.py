"""HeteroFL, FjORD and FedRolex on the Message API, in process: each client gets its own
sub-model and width, replies are checked against the sub-model sent, the overlap average is
the hand-computed one, widths follow the rule (fixed, dynamic, deadline on the clock)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from strategies import FedRolex, FjORD, HeteroFL
from strategies import contract as C
from strategies.engine import records
from strategies.engine.clock import SimClock
from strategies.engine.devices import DeviceProfile, TraceFleet
from strategies.engine.records import ClientContractError
from strategies.engine.submodels import SubModels, WidthRule, width_spec_of
from tests.inprocess import InProcessGrid, partition_facts
from tests.messages import numpy_of, record

# a two-layer "model" whose hidden dimension h has 4 units
SPEC = {"w1": (("h", 1), None), "b1": (("h", 1),), "w2": (None, ("h", 1)), "b2": (None,)}
GLOBAL = {"w1": np.zeros((4, 3), np.float32), "b1": np.zeros(4, np.float32),
          "w2": np.zeros((2, 4), np.float32), "b2": np.zeros(2, np.float32)}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def client_app(seen: list, *, ignore_width: bool = False, bad_partition: int | None = None,
               masks: dict | None = None) -> ClientApp:
    """Partition p (n = 10 (p + 1)) returns its sub-model + p^2 + 1 and records what it got;
    ``ignore_width``: replies with the full model's shapes. Asked for the label split, it
    replies ``masks[p]`` (default: both labels; None: no ``label-mask``)."""
    app = ClientApp()

    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content[C.CONFIG]
        arrays = numpy_of(msg.content[C.ARRAYS])
        seen.append((pid, dict(config), {k: v.shape for k, v in arrays.items()}))
        if ignore_width or pid == bad_partition:
            arrays = {k: np.zeros_like(v) for k, v in GLOBAL.items()}
        out = {k: v + pid ** 2 + 1 for k, v in arrays.items()}
        metrics = {C.NUM_EXAMPLES: 10 * (pid + 1), C.TRAIN_LOSS: 0.5}
        mask = (masks or {}).get(pid, [1, 1])
        if config.get(C.LABEL_SPLIT) and mask is not None:
            metrics[C.LABEL_MASK] = mask
        return Message(RecordDict({C.ARRAYS: record(out), C.METRICS: MetricRecord(metrics)}),
                       reply_to=msg)

    return app


def run(strategy, app, num_nodes=3, rounds=1):
    grid = InProcessGrid(app, num_nodes, {})
    result = strategy.start(grid, record(GLOBAL), num_rounds=rounds,
                            train_config=ConfigRecord({C.LR: 0.1, C.LOCAL_STEPS: 10,
                                                       C.BATCH_SIZE: 10}))
    return numpy_of(result.arrays)


def kwargs(**extra):
    return {"query_client_info": True, "fraction_evaluate": 0.0, "width_spec": SPEC,
            "levels": (1.0, 0.5), **extra}


def test_heterofl_sends_sub_models_and_averages_each_entry_over_its_holders():
    seen = []
    strategy = HeteroFL(**kwargs())
    new = run(strategy, client_app(seen))
    # fixed rule: partition p trains levels[p mod 2] -> widths 1, 0.5, 1
    assert [(p, c[C.MODEL_WIDTH], c[C.WIDTH_SCALER], c[C.LABEL_SPLIT]) for p, c, _ in seen] \
        == [(0, 1.0, True, True), (1, 0.5, True, True), (2, 1.0, True, True)]
    assert seen[1][2] == {"w1": (2, 3), "b1": (2,), "w2": (2, 2), "b2": (2,)}
    # units 0-1: uniform mean of 1, 2, 5; units 2-3: of 1 and 5 (partition 1 lacks them)
    np.testing.assert_allclose(new["b1"], [8 / 3, 8 / 3, 3, 3], rtol=1e-6)
    np.testing.assert_allclose(new["w2"][:, :2], 8 / 3, rtol=1e-6)
    np.testing.assert_allclose(new["w2"][:, 2:], 3, rtol=1e-6)
    np.testing.assert_allclose(new["b2"], 8 / 3, rtol=1e-6)  # unscaled: every client
    assert new["w1"].dtype == np.float32
    log = strategy.round_log(1)
    assert log[C.LOG_CLIENT_WIDTHS] == {"0": 1.0, "1": 0.5, "2": 1.0}
    assert log[C.LOG_WIDTH_COUNTS] == {"1": 2, "0.5": 1} and log[C.LOG_WIDTH_RULE] == "fixed"
    # bytes down: two full models and one half model, as Flower counts their arrays
    half_model = {"w1": np.zeros((2, 3), np.float32), "b1": np.zeros(2, np.float32),
                  "w2": np.zeros((2, 2), np.float32), "b2": np.zeros(2, np.float32)}
    full, half = (records.array_bytes(RecordDict({C.ARRAYS: record(m)}))
                  for m in (GLOBAL, half_model))
    assert log[C.LOG_BYTES_DOWN] == 2 * full + half


def test_fjord_weights_by_examples_and_sends_its_dropout_levels():
    seen = []
    new = run(FjORD(**kwargs()), client_app(seen))
    assert [c[C.WIDTH_LEVELS] for _, c, _ in seen] == [[0.5, 1.0], [0.5], [0.5, 1.0]]
    assert all(C.WIDTH_SCALER not in c and C.LABEL_SPLIT not in c for _, c, _ in seen)
    # units 0-1: (10*1 + 20*2 + 30*5) / 60; units 2-3: (10*1 + 30*5) / 40
    np.testing.assert_allclose(new["b1"], [200 / 60] * 2 + [160 / 40] * 2, rtol=1e-6)


def test_fedrolex_rolls_the_window_one_unit_per_round():
    strategy = FedRolex(**kwargs())
    grid = InProcessGrid(client_app([]), 3, {})
    strategy.start(grid, record(GLOBAL), num_rounds=1)
    second = {k: np.full_like(v, 0.0) for k, v in GLOBAL.items()}
    msgs = list(strategy.configure_train(2, record(second), ConfigRecord(), grid))
    half = next(m for m in msgs if m.content[C.CONFIG][C.MODEL_WIDTH] == 0.5)
    indices = strategy.plans[2].sub_models[half.metadata.dst_node_id][0]
    assert indices["b1"][0].tolist() == [1, 2]  # round 2: units 1 and 2
    assert indices["w2"][1].tolist() == [1, 2] and indices["w1"][0].tolist() == [1, 2]


def test_a_reply_of_the_wrong_shape_costs_only_itself(caplog):
    seen = []
    with caplog.at_level(logging.WARNING):
        new = run(HeteroFL(**kwargs()), client_app(seen, bad_partition=1))
    assert any("partition 1" in r.getMessage() and "expected float32(2, 3)" in r.getMessage()
               for r in caplog.records)
    # partition 1 (width 0.5) was refused: every entry is the mean of partitions 0 and 2
    np.testing.assert_allclose(new["b1"], 3.0, rtol=1e-6)


def test_clients_that_ignore_the_width_stop_the_run_naming_the_helper():
    with pytest.raises(ClientContractError, match="strategies.client.width_model"):
        run(HeteroFL(**kwargs(levels=(0.5,))), client_app([], ignore_width=True))


def test_dynamic_rule_draws_per_round_and_partition():
    rule = WidthRule("dynamic", (1.0, 0.5, 0.25), seed=3)
    draws = [[rule.dynamic(r, p) for p in range(20)] for r in (1, 2)]
    assert draws[0] != draws[1] and set(draws[0]) <= {1.0, 0.5, 0.25}
    assert draws == [[rule.dynamic(r, p) for p in range(20)] for r in (1, 2)]


def test_deadline_rule_gives_each_client_the_largest_width_that_fits():
    # compute time tau b c share / speed = 10 * 10 * 0.01 * share / speed = share / speed
    speeds = [1.0, 0.5, 1 / 8, 1 / 64]
    fleet = TraceFleet({p: DeviceProfile(s, 1e9, 1e9) for p, s in enumerate(speeds)})
    shares = {1.0: 1.0, 0.5: 0.25, 0.25: 0.0625}
    strategy = HeteroFL(**kwargs(levels=(1.0, 0.5, 0.25), level_compute=shares,
                                 clock=SimClock(fleet, 0.01), round_deadline=1.0))
    seen = []
    run(strategy, client_app(seen), num_nodes=4)
    # speed 1: full; 1/2: 0.25 / 0.5 = 0.5 s at width 1/2; 1/8: 0.0625 * 8 = 0.5 s at 1/4;
    # 1/64: nothing fits (4 s at 1/4): not sent work (straggler policy "drop")
    assert {p: c[C.MODEL_WIDTH] for p, c, _ in seen} == {0: 1.0, 1: 0.5, 2: 0.25}
    log = strategy.round_log(1)
    assert log[C.LOG_CLIENT_WIDTHS] == {"0": 1.0, "1": 0.5, "2": 0.25}
    assert log[C.LOG_WIDTH_RULE] == "deadline"
    # the round waits for the deadline (a client was dropped); every sent client fits it
    assert log[C.LOG_SIM_SECONDS] == pytest.approx(1.0)


@pytest.mark.parametrize("bad, match", [
    ({"width_rule": "deadline"}, "round_deadline"),
    ({"levels": ()}, "non-empty"),
    ({"levels": (1.0, 1.5)}, "levels entry"),
    ({"weighting": "scheme-i"}, "weighting"),
    ({"drift_diagnostics": True}, "drift_diagnostics"),
    ({"level_compute": {1.0: 1.0}}, "missing"),
])
def test_constructor_refuses_what_it_cannot_honour(bad, match):
    with pytest.raises(ValueError, match=match):
        HeteroFL(**kwargs(**bad))


def test_without_a_width_spec_the_error_says_how_to_give_one():
    strategy = HeteroFL(query_client_info=True, fraction_evaluate=0.0)
    with pytest.raises(ValueError, match="width_spec"):
        run(strategy, client_app([]))


def test_width_spec_of_plain_tuples():
    spec = width_spec_of({"a": (("h", 4), None)})
    assert spec.axes["a"][0].dim == "h" and spec.axes["a"][0].repeat == 4
    assert isinstance(HeteroFL(width_spec=SPEC).submodels, SubModels)


def test_one_hostile_client_alone_in_a_round_ends_no_run(caplog):
    """fraction-train 0.1 of 10 clients: the first round's only reply has the full model's
    shapes (it ignores its width). That is one client's word, not the ClientApp's: its reply
    is refused, the round keeps the model and the run goes on (#57: it ended the run)."""
    honest = []
    run(HeteroFL(**kwargs(levels=(0.5,), fraction_train=0.1)), client_app(honest), 10, rounds=4)
    first = honest[0][0]
    seen = []
    with caplog.at_level(logging.WARNING):
        strategy = HeteroFL(**kwargs(levels=(0.5,), fraction_train=0.1))
        run(strategy, client_app(seen, bad_partition=first), 10, rounds=4)
    assert [p for p, _, _ in seen] == [p for p, _, _ in honest] and seen[0][0] == first
    assert strategy.round_log(1)[C.LOG_MODEL_KEPT] == 1
    assert (f"(partition {first}) rejected: 'arrays' array 'w1' is float32(4, 3), expected "
            "float32(2, 3)") in caplog.text
    assert all(strategy.round_log(r)[C.LOG_MODEL_KEPT] == 0 for r in range(2, 5)
               if seen[r - 1][0] != first)


def test_clients_that_ignore_the_width_one_a_round_stop_the_run_at_the_second():
    seen = []
    with pytest.raises(ClientContractError, match="round 2.*strategies.client.width_model"):
        run(HeteroFL(**kwargs(levels=(0.5,), fraction_train=0.1)),
            client_app(seen, ignore_width=True), 10, rounds=4)
    assert len({p for p, _, _ in seen}) == 2


def test_a_single_client_that_lacks_the_contract_stops_the_run_at_the_third_round():
    with pytest.raises(ClientContractError, match="round 3"):
        run(HeteroFL(**kwargs(levels=(0.5,), min_available_nodes=1)),
            client_app([], ignore_width=True), 1, rounds=4)


def test_the_query_is_on_by_default_and_a_node_without_a_partition_is_named(caplog):
    """Flower's constructor call: HeteroFL(width_spec=...) asks for the partition ids itself
    (#58: every client trained width 1.0 without query_client_info=True); with the query
    off, one WARNING says why every node trains the largest level and what to register."""
    assert HeteroFL(width_spec=SPEC).participation.query_client_info
    assert FjORD(width_spec=SPEC).participation.query_client_info
    assert not HeteroFL(width_spec=SPEC, query_client_info=False).participation.query_client_info
    seen = []
    with caplog.at_level(logging.WARNING):
        run(HeteroFL(**kwargs(query_client_info=False)), client_app(seen), rounds=2)
    assert {c[C.MODEL_WIDTH] for _, c, _ in seen} == {1.0}
    warned = [r.getMessage() for r in caplog.records if "has no partition id" in r.getMessage()]
    assert len(warned) == 1 and "strategies.client.client_info_reply" in warned[0]


def test_no_width_spec_names_the_users_own_spec():
    with pytest.raises(ValueError, match=r"needs your model's width spec: pass width_spec="
                                         r"\{parameter name: .*docs/strategies/width.md"):
        run(HeteroFL(query_client_info=True, fraction_evaluate=0.0), client_app([]))
