"""FedBuff and FedAsync: the staleness math against hand-computed numbers, the buffer and the
mixing on an in-process Grid, the simulated arrival order (same bits whatever order the real
replies come in), resume mid-flight, the trust gate, and over-commitment."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord

from strategies import FedAsync, FedAvg, FedBuff
from strategies import contract as C
from strategies.algorithms.staleness import (
    Staleness,
    add_update,
    fedasync_mix,
    fedbuff_step,
)
from strategies.engine.averaging import WeightedModelSum
from strategies.engine.clock import SimClock
from strategies.engine.devices import GeneratedFleet
from strategies.engine.participation import Participation
from strategies.engine.rounds import run_rounds
from tests.inprocess import InProcessGrid, adding_app
from tests.messages import numpy_of, record


# ---------------------------------------------------------------- the math
def test_staleness_functions_are_the_papers():
    fedbuff = Staleness("fedbuff")
    assert fedbuff(0) == 1.0 and fedbuff(3) == 0.5 and fedbuff(8) == pytest.approx(1 / 3)
    poly = Staleness("polynomial", a=0.5)
    assert poly(0) == 1.0 and poly(3) == 0.5
    hinge = Staleness("hinge", a=10.0, b=4.0)
    assert hinge(4) == 1.0 and hinge(5) == pytest.approx(1 / 11) and hinge(6) == pytest.approx(1 / 21)
    assert Staleness("constant")(100) == 1.0
    with pytest.raises(ValueError, match="staleness='linear'"):
        Staleness("linear")
    with pytest.raises(ValueError, match="whole number"):
        fedbuff(-1)


def test_fedbuff_step_is_the_mean_of_the_weighted_buffer():
    sent = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    acc = add_update(WeightedModelSum(), sent, {"w": np.array([3.0, 2.0], np.float32)}, 1.0)
    acc = add_update(acc, sent, {"w": np.array([1.0, 6.0], np.float32)}, 0.5)  # (2, 0), (0, 4)/2
    buffer = acc.sum
    assert acc.count == 2 and buffer["w"].dtype == np.float64  # the kernel, summed in float64
    new, velocity = fedbuff_step(sent, buffer, 2, server_lr=0.5)
    assert velocity is None and new["w"].dtype == np.float32
    np.testing.assert_array_equal(new["w"], [1.0 + 0.5 * 1.0, 2.0 + 0.5 * 1.0])
    new, velocity = fedbuff_step(sent, buffer, 2, server_lr=1.0, momentum=0.5,
                                 velocity={"w": np.array([2.0, -2.0])})
    np.testing.assert_array_equal(velocity["w"], [2.0, 0.0])  # 0.5 * (2, -2) + (1, 1)
    np.testing.assert_array_equal(new["w"], [3.0, 2.0])
    with pytest.raises(ValueError, match="at least one"):
        fedbuff_step(sent, buffer, 0, 1.0)


def test_fedasync_mix():
    new = fedasync_mix({"w": np.array([0.0, 4.0], np.float32)}, {"w": np.array([2.0, 0.0])}, 0.25)
    np.testing.assert_array_equal(new["w"], [0.5, 3.0])
    assert new["w"].dtype == np.float32
    with pytest.raises(ValueError, match="alpha_t"):
        fedasync_mix(new, new, 1.5)


# ---------------------------------------------------------------- strategies in process
class FirstIdle:
    """A selection policy: the first candidate (lowest partition id)."""

    def select(self, server_round, candidates, num_sampled, fraction, probabilities):
        return {0: 1}


class ShuffledGrid(InProcessGrid):
    """Replies come back in a seeded random order, some only at a later pull."""

    def __init__(self, *args, shuffle_seed: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(shuffle_seed)

    def pull_messages(self, message_ids):
        ids = [i for i in message_ids if i in self.pending]
        chosen = [i for i in ids if self.rng.random() < 0.5]
        self.rng.shuffle(chosen)
        replies = []
        for message_id in chosen:
            reply = self.deliver(self.pending.pop(message_id))
            if reply is not None:
                replies.append(reply)
        return replies


def participation(**kwargs) -> Participation:
    return Participation(query_client_info=True, **kwargs)


def test_fedbuff_buffers_k_staleness_weighted_updates(caplog):
    strategy = FedBuff(buffer_size=2, concurrency=2, fraction_evaluate=0.0,
                       participation=participation(selection=FirstIdle()))
    result = run_rounds(strategy, InProcessGrid(adding_app(), 2, {}),
                        record({"w": np.zeros(1, np.float32)}), num_rounds=2,
                        train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    # round 1: tasks 1 (p0) and 2 (p1) from w0 = 0: buffer 1 + 2, w1 = 3 / 2.
    # task 1's client is freed first and gets task 3 from w0 (task 2 is still out); task 2's
    # client then gets task 4 from w1. Round 2: task 3 (p0, staleness 1) and task 4 (p1, 0):
    # w2 = w1 + (1 / sqrt(2) + 2) / 2.
    w2 = np.float32(np.float32(1.5) + (1 / math.sqrt(2) + 2.0) / 2)
    assert numpy_of(result.arrays)["w"][0] == w2
    first, second = strategy.round_log(1), strategy.round_log(2)
    assert first[C.LOG_STALENESS] == [0, 0] and second[C.LOG_STALENESS] == [1, 0]
    assert second[C.LOG_BUFFER_FILL] == 2 and second[C.LOG_CLIENT_UPDATES] == 4
    assert second[C.LOG_MODEL_VERSION] == 2 and second[C.LOG_CONCURRENCY] == 1  # task 3 out
    assert second[C.LOG_TRAIN_LOSS] == pytest.approx(2 / 3)  # weighted by n_k


def test_fedasync_mixes_each_update_with_its_staleness():
    strategy = FedAsync(alpha=0.5, concurrency=2, updates_per_round=2, fraction_evaluate=0.0,
                        participation=participation(selection=FirstIdle()))
    result = run_rounds(strategy, InProcessGrid(adding_app(), 2, {}),
                        record({"w": np.zeros(1)}), num_rounds=1,
                        train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    # task 1 (p0, from x0 = 0): staleness 0, x1 = 0.5 * 0 + 0.5 * 1 = 0.5
    # task 2 (p1, from x0 = 0): staleness 1, alpha_t = 0.5 / sqrt(2), x2 = (1 - a) 0.5 + a 2
    a = 0.5 / math.sqrt(2)
    assert numpy_of(result.arrays)["w"][0] == pytest.approx((1 - a) * 0.5 + a * 2.0, abs=1e-15)
    assert strategy.round_log(1)[C.LOG_STALENESS] == [0, 1]


def clocked(dropout: float = 0.0, **kwargs) -> Participation:
    fleet = GeneratedFleet("lognormal", seed=3, sigma=1.0)
    return participation(clock=SimClock(fleet, seconds_per_example=0.01, dropout=dropout),
                         seed=5, **kwargs)


def run_fedbuff(grid, rounds: int = 4, strategy=None, first_round: int = 1, arrays=None,
                dropout: float = 0.0):
    strategy = strategy or FedBuff(buffer_size=3, concurrency=4, fraction_evaluate=0.0,
                                   participation=clocked(dropout))
    result = run_rounds(strategy, grid, arrays or record({"w": np.zeros(3, np.float32)}),
                        num_rounds=rounds, train_config=ConfigRecord({C.LOCAL_STEPS: 2}),
                        first_round=first_round)
    return strategy, result


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_simulated_order_gives_the_same_bits_whatever_order_replies_arrive_in(dropout):
    runs = [run_fedbuff(InProcessGrid(adding_app(), 7, {}), dropout=dropout)]
    runs += [run_fedbuff(ShuffledGrid(adding_app(), 7, {}, shuffle_seed=s), dropout=dropout)
             for s in (1, 2)]
    models = {numpy_of(result.arrays)["w"].tobytes() for _, result in runs}
    assert len(models) == 1
    logs = [[s.round_log(r) for r in range(1, 5)] for s, _ in runs]
    assert logs[0] == logs[1] == logs[2]
    assert all(r[C.LOG_SIM_ELAPSED] > 0 for r in logs[0])
    elapsed = [r[C.LOG_SIM_ELAPSED] for r in logs[0]]
    assert elapsed == sorted(elapsed)
    assert (sum(r.get(C.LOG_CLIENTS_DROPPED_OUT, 0) for r in logs[0]) > 0) == (dropout > 0)


@pytest.mark.parametrize("dropout, split", [(0.0, 2), (0.3, 1)])
def test_resume_mid_flight_gives_the_uninterrupted_model(dropout, split):
    full, full_result = run_fedbuff(InProcessGrid(adding_app(), 7, {}), dropout=dropout)
    first, first_result = run_fedbuff(InProcessGrid(adding_app(), 7, {}), rounds=split,
                                      dropout=dropout)
    state = first.state_dict()
    assert state["tasks"]["tasks"], f"tasks in flight at the end of round {split}"
    resumed = FedBuff(buffer_size=3, concurrency=4, fraction_evaluate=0.0,
                      participation=clocked(dropout))
    resumed.load_state_dict(state)
    # other node ids: the in-flight tasks follow their partitions
    grid = ShuffledGrid(adding_app(), 7, {}, node_ids=[5 + 11 * i for i in range(7)],
                        shuffle_seed=9)
    _, result = run_fedbuff(grid, strategy=resumed, first_round=split + 1,
                            arrays=first_result.arrays)
    assert numpy_of(result.arrays)["w"].tobytes() == numpy_of(full_result.arrays)["w"].tobytes()
    assert resumed.round_log(4) == full.round_log(4)  # round split + 1 counts the re-sends
    if dropout:  # a task of the checkpoint drops out after the resume, as it did before
        assert any(t["dropped-out"] for t in state["tasks"]["tasks"])
        assert [resumed.round_log(r)[C.LOG_DROPPED_OUT] for r in range(split + 1, 5)] == \
            [full.round_log(r)[C.LOG_DROPPED_OUT] for r in range(split + 1, 5)]


def test_real_time_order_runs_and_says_it_is_not_reproducible(caplog):
    strategy = FedBuff(buffer_size=2, concurrency=3, arrival="real-time", fraction_evaluate=0.0,
                       participation=participation())
    _, result = run_fedbuff(ShuffledGrid(adding_app(), 5, {}, shuffle_seed=1), rounds=3,
                            strategy=strategy)
    assert np.isfinite(numpy_of(result.arrays)["w"]).all()
    assert [strategy.round_log(r)[C.LOG_BUFFER_FILL] for r in (1, 2, 3)] == [2, 2, 2]
    assert "not reproducible" in caplog.text


def test_a_non_finite_reply_is_refused_and_its_client_freed(caplog):
    strategy = FedBuff(buffer_size=2, concurrency=3, fraction_evaluate=0.0,
                       participation=participation())
    _, result = run_fedbuff(InProcessGrid(adding_app(bad_partition=1), 3, {}), rounds=3,
                            strategy=strategy)
    assert np.isfinite(numpy_of(result.arrays)["w"]).all()
    assert sum(strategy.round_log(r)[C.LOG_CLIENTS_FAILED] for r in (1, 2, 3)) >= 1
    assert "NaN or Inf" in caplog.text


def test_a_round_of_only_failures_keeps_the_model():
    strategy = FedBuff(buffer_size=2, concurrency=1, fraction_evaluate=0.0,
                       participation=participation(min_available_nodes=1))
    _, result = run_fedbuff(InProcessGrid(adding_app(bad_partition=0), 1, {}), rounds=1,
                            strategy=strategy)
    assert not numpy_of(result.arrays)["w"].any()
    assert strategy.round_log(1)[C.LOG_MODEL_KEPT] is True


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="buffer_size"):
        FedBuff(buffer_size=0)
    with pytest.raises(ValueError, match="concurrency"):
        FedBuff(concurrency=0)
    with pytest.raises(ValueError, match="arrival='soon'"):
        FedAsync(arrival="soon")
    with pytest.raises(ValueError, match="alpha"):
        FedAsync(alpha=0.0)
    with pytest.raises(ValueError, match="waits for no round"):
        FedBuff(participation=clocked(round_deadline=10.0))


# ---------------------------------------------------------------- over-commitment
def test_over_commitment_closes_the_round_at_the_first_m_replies_on_the_clock():
    base = FedAvg(fraction_train=0.3, fraction_evaluate=0.0, participation=clocked(
        fraction_train=0.3))
    over = FedAvg(fraction_evaluate=0.0, participation=clocked(
        fraction_train=0.3, over_commitment=1.0))
    grid = InProcessGrid(adding_app(), 10, {})
    run_rounds(base, grid, record({"w": np.zeros(1)}), num_rounds=1,
               train_config=ConfigRecord({C.LOCAL_STEPS: 2}))
    run_rounds(over, InProcessGrid(adding_app(), 10, {}), record({"w": np.zeros(1)}),
               num_rounds=1, train_config=ConfigRecord({C.LOCAL_STEPS: 2}))
    plain, committed = base.round_log(1), over.round_log(1)
    assert plain[C.LOG_CLIENTS_SAMPLED] == 3 and committed[C.LOG_CLIENTS_SAMPLED] == 6
    assert committed[C.LOG_CLIENTS_RECEIVED] == 3 and committed[C.LOG_CLIENTS_LATE] == 3
    # the round lasts until its 3rd reply: the 3 fastest of 6 are no slower than 3 random ones
    assert committed[C.LOG_SIM_SECONDS] <= plain[C.LOG_SIM_SECONDS]
    with pytest.raises(ValueError, match="clock"):
        Participation(over_commitment=0.3)
    with pytest.raises(ValueError, match="over_commitment"):
        Participation(over_commitment=-1)


def test_fedbuffs_defaults_on_2_supernodes_say_what_a_round_is(caplog):
    """FedBuff's defaults (K = 10, 20 in flight) on Flower's 2 default SuperNodes: a round
    is 10 trainings, 5x FedAvg's work; said once at the first round (#58)."""
    strategy = FedBuff(fraction_evaluate=0.0, participation=participation(selection=FirstIdle()))
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_rounds(strategy, InProcessGrid(adding_app(), 2, {}), record({"w": np.zeros(1)}),
                   num_rounds=2, train_config=ConfigRecord({C.LOCAL_STEPS: 1}))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.getMessage().startswith("FedBuff: concurrency")]
    assert warned == ["FedBuff: concurrency 20 exceeds the 2 connected nodes: at most 2 tasks "
                      "train at once; each server update (\"round\") waits for 10 client "
                      "updates, 5 per node (a FedAvg round: one each)"]


def test_differences_from_flower_and_the_work_per_update(caplog):
    from strategies.engine.flower_args import (differences_from_flower,  # noqa: PLC0415
                                               work_per_update_warning)

    assert differences_from_flower(2, 2) is None
    assert differences_from_flower(1, 2).endswith("(min_train_nodes 1, Flower's default 2)")
    assert work_per_update_warning("FedAsync", 1, 2, 2) is None
    assert work_per_update_warning("FedBuff", 3, 4, 10) is None
    with caplog.at_level(logging.INFO, logger="flwr"):
        FedBuff().summary()  # evaluating (Flower's fraction_evaluate 1.0): both differ
    assert ("Differs from Flower's FedAvg: m = max(floor(C K), 1) clients per round "
            "(min_train_nodes 1, Flower's default 2); min_evaluate_nodes 1 (Flower's default 2)"
            ) in caplog.text
