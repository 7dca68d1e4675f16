"""Robust aggregation (strategies.engine.robust): the coordinate-wise median and trimmed mean
of Yin et al. 2018 (Definitions 1 and 2) by hand, the refusals, and in-process runs in which
one selected client lies (a finite poisoned model, the largest num-examples the trust gate
lets through): plain averaging is dragged far off, the robust rules end where the honest run
ends, for FedAvg, FedProx, FedAvg with a server step size, FedBuff and FedBuff with server
momentum."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import FLOWER_LOGGER

from fedapp import checkpoint_format
from fedapp.config import ConfigError
from fedapp.registry import build_strategy, check_run_config
from strategies import (FedAdam, FedAsync, FedAvg, FedBuff, FedDyn, FedExP, FedNova, FedProx,
                        FedVeca, HeteroFL, Median, Moon, Scaffold, TrimmedMean)
from strategies import contract as C
from strategies.engine import robust
from strategies.engine.clock import SimClock
from strategies.engine.devices import GeneratedFleet
from strategies.engine.participation import Participation
from strategies.engine.robust import (ClientDelta, RobustBuffer, coordinate_median,
                                      coordinate_trimmed_mean, robust_rule, robust_update,
                                      trim_count)
from strategies.engine.rounds import run_rounds
from strategies.engine.trust_gate import MAX_NUM_EXAMPLES
from tests.inprocess import InProcessGrid, partition_facts
from tests.messages import numpy_of, record

NAN = np.nan


def column(*values: float) -> np.ndarray:
    """m values of one coordinate as the (m, 1) array the statistics take."""
    return np.array(values, dtype=np.float64)[:, None]


# ----------------------------------------------------------------- Definition 1: the median
def test_median_of_an_odd_count_is_the_middle_value_per_coordinate():
    values = np.array([[1.0, 5.0, 0.0], [3.0, -50.0, 0.0], [2.0, 4.0, 7.0]])
    np.testing.assert_array_equal(coordinate_median(values), [2.0, 4.0, 0.0])


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    assert coordinate_median(column(1.0, 2.0, 3.0, 100.0))[0] == 2.5
    assert coordinate_median(column(-50.0, 1.0))[0] == -24.5  # two values: no one outvoted


def test_median_with_ties_and_one_value():
    assert coordinate_median(column(1.0, 1.0, 1.0, 9.0))[0] == 1.0
    assert coordinate_median(column(1.0, 9.0, 9.0))[0] == 9.0
    assert coordinate_median(column(-3.25))[0] == -3.25


def test_median_does_not_overflow_between_huge_middle_values():
    big = np.finfo(np.float64).max
    assert coordinate_median(column(big, big))[0] == big
    assert coordinate_median(column(-big, big))[0] == 0.0


def test_median_agrees_with_numpy_and_ignores_values_not_there():
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 4, 7, 10):
        values = rng.normal(size=(m, 50))
        np.testing.assert_allclose(coordinate_median(values), np.median(values, axis=0),
                                   rtol=0, atol=1e-15)
    values = np.array([[1.0, NAN, NAN], [3.0, NAN, 5.0], [100.0, 2.0, 6.0]])
    np.testing.assert_array_equal(coordinate_median(values), [3.0, 2.0, 5.5])
    assert np.isnan(coordinate_median(column(NAN, NAN))[0])  # no one holds it


# ----------------------------------------------------------------- Definition 2: trimmed mean
def test_trimmed_mean_removes_floor_beta_m_at_each_end():
    values = column(1.0, 2.0, 3.0, 4.0, 100.0)
    assert coordinate_trimmed_mean(values, 0.2)[0] == 3.0  # b = 1: mean(2, 3, 4)
    assert coordinate_trimmed_mean(values, 0.1)[0] == 22.0  # b = floor(0.5) = 0: the mean
    assert coordinate_trimmed_mean(values, 0.0)[0] == 22.0
    assert coordinate_trimmed_mean(values, 0.4)[0] == 3.0  # b = 2: the middle value
    assert coordinate_trimmed_mean(column(1.0, 2.0, 4.0, 100.0), 0.25)[0] == 3.0  # b = 1


def test_trimmed_mean_with_ties_and_per_coordinate_counts():
    assert coordinate_trimmed_mean(column(5.0, 5.0, 5.0, -50.0, 5.0), 0.2)[0] == 5.0
    # column 0: h = 5, b = 1 -> mean(2, 3, 4); column 1: h = 3, b = floor(0.6) = 0 -> mean
    values = np.array([[1.0, NAN], [2.0, 1.0], [3.0, NAN], [4.0, 2.0], [100.0, 6.0]])
    np.testing.assert_array_equal(coordinate_trimmed_mean(values, 0.2), [3.0, 3.0])
    assert np.isnan(coordinate_trimmed_mean(column(NAN), 0.2)[0])


def test_trimmed_mean_near_one_half_is_the_median():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(100, 20))
    np.testing.assert_allclose(coordinate_trimmed_mean(values, 0.49),
                               np.median(values, axis=0), rtol=0, atol=1e-15)  # b = 49


def test_trim_count_takes_beta_as_the_decimal_it_prints_as():
    assert 0.29 * 100 < 29  # float rounding would trim 28
    assert trim_count(0.29, 100) == 29 and trim_count(0.1, 30) == 3
    assert trim_count(0.2, 4) == 0 and trim_count(0.25, 4) == 1 and trim_count(0.0, 9) == 0


@pytest.mark.parametrize("beta", [-0.1, 0.5, 0.7, True, "0.1", None])
def test_a_beta_outside_zero_to_one_half_is_refused_naming_it(beta):
    with pytest.raises(ValueError, match=r"beta must be a number in \[0, 0.5\)"):
        TrimmedMean(beta)
    with pytest.raises(ValueError, match="beta"):
        coordinate_trimmed_mean(column(1.0, 2.0, 3.0), beta)


def test_rules_by_name():
    assert robust_rule("none") is None and robust_rule("median") == Median()
    assert robust_rule("trimmed-mean", 0.25) == TrimmedMean(0.25)
    with pytest.raises(ValueError, match="robust-aggregation='mean' is not known; use one of "
                                         "none, median, trimmed-mean"):
        robust_rule("mean")
    with pytest.raises(ValueError, match="beta"):  # checked whatever the rule, as the table
        robust_rule("none", 0.5)
    with pytest.raises(ValueError, match=r"robust=42 is not a robust rule; pass Median\(\)"):
        FedAvg(robust=42)
    assert FedAvg(robust="trimmed-mean").robust == TrimmedMean(0.1)


# ----------------------------------------------------------------- the update
def test_robust_update_is_w_plus_eta_g_times_the_median_of_the_updates():
    w = {"w": np.array([1.0, 2.0], np.float32), "count": np.array(7, np.int64)}
    models = [{"w": np.array([2.0, 2.5], np.float32), "count": np.array(9, np.int64)},
              {"w": np.array([-50.0, 1e30], np.float32), "count": np.array(10**6, np.int64)},
              {"w": np.array([1.5, 3.0], np.float32), "count": np.array(8, np.int64)}]
    deltas = [ClientDelta(m, w) for m in models]
    new = robust_update(w, deltas, Median(), server_lr=2.0)
    np.testing.assert_array_equal(new["w"], [1.0 + 2 * 0.5, 2.0 + 2 * 1.0])
    assert new["w"].dtype == np.float32
    assert new["count"] == 9 and new["count"].dtype == np.int64  # w + R, rounded; no eta_g
    same = robust_update(w, deltas, TrimmedMean(0.34), server_lr=2.0)  # b = 1 of 3
    np.testing.assert_array_equal(same["w"], new["w"])


def test_the_update_is_taken_block_by_block_of_coordinates(monkeypatch):
    monkeypatch.setattr(robust, "BLOCK", 7)  # 50 coordinates in 8 blocks
    rng = np.random.default_rng(2)
    w = {"a": rng.normal(size=(5, 10)).astype(np.float32)}
    models = [{"a": rng.normal(size=(5, 10)).astype(np.float32)} for _ in range(6)]
    new = robust_update(w, [ClientDelta(m, w) for m in models], TrimmedMean(0.2))
    deltas = np.stack([m["a"].astype(np.float64) - w["a"] for m in models])
    kept = np.sort(deltas, axis=0)[1:5].mean(axis=0)  # b = floor(1.2) = 1 of 6
    np.testing.assert_allclose(new["a"], (w["a"] + kept).astype(np.float32), rtol=1e-6)


def test_sub_models_take_each_entry_over_its_holders():
    w = {"k": np.zeros((2, 4), np.float32), "n": np.array(3, np.int64)}
    half = {"k": (slice(None), np.array([0, 1])), "n": ()}
    everything = {"k": (slice(None), np.arange(4)), "n": ()}
    updates = [  # a width-1/2 client and two full ones
        ClientDelta({"k": np.full((2, 2), 1.0, np.float32), "n": np.array(5)}, w, indices=half),
        ClientDelta({"k": np.full((2, 4), 3.0, np.float32), "n": np.array(5)}, w,
                    indices=everything),
        ClientDelta({"k": np.full((2, 4), 100.0, np.float32), "n": np.array(5)}, w,
                    indices=everything)]
    new = robust_update(w, updates, Median())
    np.testing.assert_array_equal(new["k"], [[3.0, 3.0, 51.5, 51.5]] * 2)  # h = 3, 3, 2, 2
    assert new["n"] == 3  # integer arrays keep w with sub-models (HeteroFL)
    only_half = robust_update(w, updates[:1], Median())
    np.testing.assert_array_equal(only_half["k"], [[1.0, 1.0, 0.0, 0.0]] * 2)  # unheld: w


def test_fedbuffs_buffer_releases_k_copies_of_the_statistic_of_the_weighted_updates():
    def staleness(tau: int) -> float:
        return 1.0 / np.sqrt(1.0 + tau)

    buffer = RobustBuffer(Median(), 3, staleness)
    sent = {"w": np.array([1.0], np.float32)}
    assert not buffer.hold(sent, {"w": np.array([3.0], np.float32)}, 0)  # s = 1: +2
    assert not buffer.hold(sent, {"w": np.array([-50.0], np.float32)}, 3)  # s = 1/2: -25.5
    state = buffer.state_dict()
    assert buffer.hold({"w": np.array([0.0], np.float32)}, {"w": np.array([4.0], np.float32)},
                       8)  # s = 1/3: +4/3
    pairs = buffer.release({"w": np.array([9.0], np.float32)})
    assert len(pairs) == 3 and not buffer.held
    for zero, client in pairs:
        assert client["w"][0] - zero["w"][0] == pytest.approx(4.0 / 3.0)
    again = RobustBuffer(Median(), 3, staleness)  # a round that ended short, resumed
    again.load_state_dict(state)
    assert [float(h.model["w"][0]) for h in again.held] == [2.0, -25.5]


def test_heterofl_takes_each_entry_over_its_holders_in_a_round():
    """3 clients, widths 1, 0.5, 1 (HeteroFL's fixed rule): partition p returns its
    sub-model + p^2 + 1 and claims n = 10 (p + 1), which the median does not use."""
    spec = {"w1": (("h", 1), None), "b1": (("h", 1),), "w2": (None, ("h", 1)), "b2": (None,)}
    model = {"w1": np.zeros((4, 3), np.float32), "b1": np.zeros(4, np.float32),
             "w2": np.zeros((2, 4), np.float32), "b2": np.zeros(2, np.float32)}
    app = ClientApp()
    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        out = {k: v.numpy() + pid ** 2 + 1 for k, v in msg.content[C.ARRAYS].items()}
        return Message(RecordDict({C.ARRAYS: record(out), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: 10 * (pid + 1)})}), reply_to=msg)

    strategy = HeteroFL(query_client_info=True, fraction_evaluate=0.0, width_spec=spec,
                        levels=(1.0, 0.5), robust=Median(), label_split=False)
    result = strategy.start(InProcessGrid(app, 3, {}), record(model), num_rounds=1,
                            train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    new = numpy_of(result.arrays)
    np.testing.assert_array_equal(new["b1"], [2.0, 2.0, 3.0, 3.0])  # med(1, 2, 5); (1 + 5) / 2
    np.testing.assert_array_equal(new["w2"], [[2.0, 2.0, 3.0, 3.0]] * 2)
    np.testing.assert_array_equal(new["b2"], [2.0, 2.0])  # every client holds it
    assert strategy.round_log(1)[C.LOG_ROBUST_VALUES] == 3


# ----------------------------------------------------------------- what is refused
@pytest.mark.parametrize("cls", [FedNova, Scaffold, FedDyn, Moon, FedExP, FedVeca],
                         ids=lambda c: c.__name__)
def test_algorithms_with_their_own_update_refuse_a_robust_rule(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: robust='median' replaces the "
                                         r"engine's weighted average.*leave robust=None"):
        cls(robust=Median())


@pytest.mark.parametrize("weighting", ["pre-erratum", "scheme-i", "scheme-ii"])
def test_weightings_whose_point_is_their_weights_are_refused(weighting):
    with pytest.raises(ValueError, match=rf"weighting='{weighting}' with robust='trimmed-mean'"
                                         rf".*use weighting='uniform'"):
        FedAvg(weighting=weighting, query_client_info=True, robust=TrimmedMean(0.2))
    assert FedAvg(weighting="uniform", robust=Median()).robust == Median()


def test_asynchronous_refusals_name_the_argument_and_the_fix():
    with pytest.raises(ValueError, match=r"FedAsync: robust='median' needs a buffer of K "
                                         r"client updates.*FedBuff\(buffer_size=K"):
        FedAsync(robust=Median())
    with pytest.raises(ValueError, match=r"buffer_size=2: fewer than 3 updates per step"):
        FedBuff(buffer_size=2, robust=Median())
    with pytest.raises(ValueError, match=r"beta=0.1 and buffer_size=5 trims floor\(beta K\) = 0"
                                         r".*TrimmedMean\(beta >= 0.2\) or buffer_size >= 10"):
        FedBuff(buffer_size=5, robust=TrimmedMean(0.1))
    with pytest.raises(TypeError, match="robust"):  # Flower's own class: no robust rule
        FedAdam(robust=Median())


def test_the_run_config_builds_the_rule_and_refuses_what_cannot_honour_it():
    was, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True
    try:
        cfg = check_run_config({"robust-aggregation": "trimmed-mean", "robust-trim": 0.2})
        assert build_strategy(cfg).strategy.robust == TrimmedMean(0.2)
        cfg = check_run_config({"strategy": "fedbuff", "robust-aggregation": "median"})
        assert build_strategy(cfg).strategy.robust_buffer.rule == Median()
        for strategy in ("fednova", "fedasync", "fedadam", "dynamicfl"):
            with pytest.raises(ConfigError, match=rf"robust-aggregation='median' is not allowed "
                                                  rf"with strategy='{strategy}'.*"
                                                  rf"robust-aggregation='none'"):
                check_run_config({"strategy": strategy, "robust-aggregation": "median"})
        with pytest.raises(ConfigError, match=r"weighting='scheme-ii' with robust='median'"):
            check_run_config({"weighting": "scheme-ii", "robust-aggregation": "median"})
    finally:
        FLOWER_LOGGER.disabled = was


# ----------------------------------------------------------------- one liar, in process
LIAR = 3  # the partition that lies
POISON = -50.0  # its model, finite
TARGET = 1.0
TOLERANCE = 0.1  # |robust run - honest run| at the end
ROUNDS = 20


def liar_app(liar: int | None, calls: list[int]) -> ClientApp:
    """Partition p moves w 30 % of the way to its target 1 + 0.02 (p - 4.5) and reports
    n = 10 (p + 1); the liar (if any) sends w = POISON and claims n = MAX_NUM_EXAMPLES, in
    its replies and in the client-info query. ``calls`` counts the liar's train calls."""
    client = ClientApp()

    def examples(pid: int) -> int:
        return MAX_NUM_EXAMPLES if pid == liar else 10 * (pid + 1)

    @client.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(
            {C.PARTITION_ID: pid, C.NUM_EXAMPLES: examples(pid)})}), reply_to=msg)

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        w = msg.content[C.ARRAYS]["w"].numpy()
        if pid == liar:
            calls.append(pid)
            new = np.full_like(w, POISON)
        else:
            new = (w + 0.3 * (TARGET + 0.02 * (pid - 4.5) - w)).astype(w.dtype)
        return Message(RecordDict({C.ARRAYS: record({"w": new}), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: examples(pid)})}), reply_to=msg)

    return client


STRATEGIES = {
    "FedAvg": lambda rule: FedAvg(fraction_train=0.5, fraction_evaluate=0.0, seed=1,
                                  robust=rule),
    "FedAvg, client-info query": lambda rule: FedAvg(
        fraction_train=0.5, fraction_evaluate=0.0, seed=1, query_client_info=True, robust=rule),
    "FedProx": lambda rule: FedProx(fraction_train=0.5, fraction_evaluate=0.0, seed=1,
                                    robust=rule),
    "FedAvg, server lr 1.5": lambda rule: FedAvg(fraction_train=0.5, fraction_evaluate=0.0,
                                                 seed=1, server_lr=1.5, robust=rule),
    "FedBuff": lambda rule: FedBuff(fraction_evaluate=0.0, seed=1, buffer_size=5,
                                    concurrency=5, robust=rule),
    "FedBuff, server momentum": lambda rule: FedBuff(
        fraction_evaluate=0.0, seed=1, buffer_size=5, concurrency=5, server_momentum=0.5,
        robust=rule),
}


def final_w(strategy, liar: int | None, calls: list[int] | None = None) -> float:
    was = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.ERROR)
    try:
        result = run_rounds(strategy, InProcessGrid(liar_app(liar, [] if calls is None else
                                                             calls), 10, {}),
                            record({"w": np.zeros(1, np.float32)}), num_rounds=ROUNDS,
                            train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    finally:
        FLOWER_LOGGER.setLevel(was)
    return float(result.arrays["w"].numpy()[0])


@pytest.mark.parametrize("name", STRATEGIES)
def test_one_liar_drags_plain_averaging_off_but_not_the_robust_rules(name):
    make = STRATEGIES[name]
    honest = final_w(make(None), None)
    plain = final_w(make(None), LIAR)
    assert abs(honest - TARGET) < TOLERANCE, honest
    assert abs(plain - TARGET) > 5.0, plain
    for rule in (Median(), TrimmedMean(0.2)):  # 5 updates per step: b = 1 each end
        calls: list[int] = []
        strategy = make(rule)
        robust_w = final_w(strategy, LIAR, calls)
        assert len(calls) >= 5, calls  # the liar was selected, and accepted, repeatedly
        assert abs(robust_w - honest) < TOLERANCE, (rule, robust_w, honest)
        logged = strategy.round_log(ROUNDS)
        assert logged[C.LOG_ROBUST_AGGREGATION] == rule.name
        assert logged[C.LOG_ROBUST_VALUES] == 5 and logged[C.LOG_ROBUST_TRIMMED] >= 1
        assert logged.get(C.LOG_ROBUST_TRIM) == getattr(rule, "beta", None)


def test_num_examples_has_no_say_under_a_robust_rule():
    by_examples = final_w(FedAvg(fraction_train=0.5, fraction_evaluate=0.0, seed=1,
                                 robust=Median()), LIAR)
    uniform = final_w(FedAvg(fraction_train=0.5, fraction_evaluate=0.0, seed=1,
                             weighting="uniform", robust=Median()), LIAR)
    assert by_examples == uniform


def test_no_robust_rule_logs_nothing_new():
    strategy = FedAvg(fraction_train=0.5, fraction_evaluate=0.0, seed=1)
    final_w(strategy, None)
    assert not {C.LOG_ROBUST_AGGREGATION, C.LOG_ROBUST_VALUES} & set(strategy.round_log(1))


def test_fedbuff_with_a_robust_rule_resumes_bit_for_bit():
    """On the simulated clock (tests/test_async.py's resume test: the order the replies are
    applied in is the clock's, whatever the node ids)."""
    def fedbuff() -> FedBuff:
        clock = SimClock(GeneratedFleet("lognormal", seed=3, sigma=1.0),
                         seconds_per_example=0.01)
        return FedBuff(fraction_evaluate=0.0, buffer_size=5, concurrency=5,
                       robust=TrimmedMean(0.2), participation=Participation(
                           query_client_info=True, seed=5, clock=clock))

    def run(strategy, rounds: int, first_round: int = 1, arrays=None):
        return run_rounds(strategy, InProcessGrid(liar_app(LIAR, []), 10, {}),
                          arrays or record({"w": np.zeros(1, np.float32)}), num_rounds=rounds,
                          train_config=ConfigRecord({C.LOCAL_STEPS: 1}), first_round=first_round)

    full = fedbuff()
    full_result = run(full, 4)
    first = fedbuff()
    first_result = run(first, 2)
    resumed = fedbuff()
    resumed.load_state_dict(checkpoint_format.decode(*checkpoint_format.encode(
        first.state_dict())))
    result = run(resumed, 4, first_round=3, arrays=first_result.arrays)
    assert result.arrays["w"].numpy().tobytes() == full_result.arrays["w"].numpy().tobytes()
    assert resumed.round_log(4) == full.round_log(4)
