"""Selection policies (Oort, Power-of-Choice, TiFL): their formulas against hand-computed
numbers, their choices, their state through a checkpoint, and in-process runs."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedapp import checkpoint_format
from strategies import FedAvg, FedBuff, FlashFleet
from strategies import contract as C
from strategies.engine.clock import SimClock, evaluation_seconds
from strategies.engine.devices import GeneratedFleet
from strategies.engine.participation import Participation, RandomSelection
from strategies.engine.rounds import run_rounds
from strategies.selection.policy import Candidate, Outcome
from strategies.selection.oort import (OortSelection, exploration_factor, oort_utilities,
                                       pacer_move, preferred_after_pacer, statistical_utility,
                                       system_factor)
from strategies.selection.power_of_choice import PowerOfChoice, candidate_set, largest_losses
from strategies.selection.tifl import TiFLSelection, change_probabilities, make_tiers
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record


# ---------------------------------------------------------------- Oort's formulas
def test_oort_statistical_and_system_utility():
    assert statistical_utility(10, 0.5) == 5.0  # n_i L_i
    assert system_factor(10.0, 20.0, 2.0) == 0.25  # (T / t)^alpha for t > T
    assert system_factor(10.0, 5.0, 2.0) == 1.0 and system_factor(10.0, None, 2.0) == 1.0


def test_oort_epsilon_decays_from_0_9_by_0_98_before_each_selection_to_0_2():
    # the authors' code decays before use: the first selection's eps is 0.9 x 0.98
    assert exploration_factor(1) == pytest.approx(0.882)
    assert exploration_factor(2) == pytest.approx(0.9 * 0.98 ** 2)
    # 0.9 * 0.98^n < 0.2 from n = 75 on
    assert exploration_factor(74) > 0.2 and exploration_factor(75) == 0.2
    assert exploration_factor(1000) == 0.2


def test_oort_pacer_relaxes_when_utility_is_flat_and_tightens_when_it_jumps():
    flat = [1.0] * 40
    assert pacer_move(flat, 20, 40) == 1  # |40 - 40| <= 0.1 x 20
    assert pacer_move(flat, 20, 41) == 0 and pacer_move(flat, 20, 20) == 0
    assert pacer_move([1.0] * 20 + [7.0] * 20, 20, 40) == -1  # 140 - 20 >= 5 x 20
    assert pacer_move([1.0] * 20 + [2.0] * 20, 20, 40) == 0
    seconds = [float(s) for s in range(1, 11)]
    # T = 3 s is at the 30th percentile; +5 points -> the 35th: sorted[int(10 x 0.35)] = 4
    assert preferred_after_pacer(3.0, seconds, 1, 5.0) == 4.0
    assert preferred_after_pacer(3.0, seconds, -1, 5.0) == 3.0  # 25th: sorted[2]
    assert preferred_after_pacer(3.0, seconds, 0, 5.0) == 3.0


def test_oort_utility_of_explored_clients_by_hand():
    util = oort_utilities([1.0, 2.0, 3.0], [1, 1, 2], [1.0, 1.0, 4.0], server_round=3,
                          preferred=2.0, alpha=2.0, clip_bound=0.95, pool=[1.0, 2.0, 3.0])
    low, spread = 0.999, 3.0 - 0.999  # min x 0.999; clip = sorted[int(3 x 0.95)] = 3
    bonus = [math.sqrt(0.1 * math.log(3) / last) for last in (1, 1, 2)]
    expected = [(1 - low) / spread + bonus[0], (2 - low) / spread + bonus[1],
                ((3 - low) / spread + bonus[2]) * (2.0 / 4.0) ** 2]
    np.testing.assert_allclose(util, expected, rtol=1e-12)


def test_oort_clips_outlier_utilities():
    rewards = [1.0] * 19 + [1000.0]
    util = oort_utilities(rewards, [1] * 20, [None] * 20, 2, math.inf, 2.0, 0.9, pool=rewards)
    # clip = sorted[int(20 x 0.9)] = 1: the outlier counts as 1
    assert util[-1] == pytest.approx(util[0])


def candidates(n: int, seconds=None, sizes=None) -> list[Candidate]:
    return [Candidate(str(k), (sizes or [10] * n)[k], (seconds or [1.0] * n)[k])
            for k in range(n)]


def test_oort_first_round_explores_by_data_size_and_sets_t_to_the_median():
    policy = OortSelection(seed=1)
    choice = policy.choose(1, candidates(4, seconds=[1.0, 2.0, 3.0, 10.0],
                                         sizes=[10, 40, 20, 30]), 2, None)
    s = choice.section
    assert s.epsilon == pytest.approx(0.882) and s.preferred_seconds == 2.5 and s.explored == 2
    assert len(choice.picks) == 2 and set(choice.picks.values()) == {1}
    # the same seed and round: the same choice
    again = OortSelection(seed=1).choose(1, candidates(4, seconds=[1.0, 2.0, 3.0, 10.0],
                                                        sizes=[10, 40, 20, 30]), 2, None)
    assert again.picks == choice.picks


def explored_policy(rewards, seconds, **kwargs) -> tuple[OortSelection, list[Candidate]]:
    policy = OortSelection(seed=2, preferred_duration=5.0, **kwargs)
    policy.selections = 200
    policy.exploration_over = True  # every client explored before: epsilon 0
    cands = [Candidate(str(k), 10, s) for k, s in enumerate(seconds)]
    policy.feedback(1, [Outcome(str(k), r / 10, 10, s)
                        for k, (r, s) in enumerate(zip(rewards, seconds))])
    return policy, cands


def test_oort_exploits_the_highest_utility_above_the_cut_off():
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]
    policy, cands = explored_policy(rewards, [1.0] * 10, cut_off=1.0, clip_bound=1.0)
    choice = policy.choose(2, cands, 4, None)
    # epsilon 0: all m = 4 exploited among the admitted, util >= the 5th best's
    assert choice.section.explored == 0
    assert set(choice.picks) <= {5, 6, 7, 8, 9} and len(choice.picks) == 4


def test_oort_penalises_clients_slower_than_t():
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]
    seconds = [1.0] * 8 + [500.0, 500.0]  # the two best are 100x slower than T = 5
    policy, cands = explored_policy(rewards, seconds, cut_off=1.0, clip_bound=1.0)
    choice = policy.choose(2, cands, 4, None)
    assert not set(choice.picks) & {8, 9}


def test_oort_blacklists_clients_that_took_part_too_often():
    policy, cands = explored_policy([1.0, 2.0, 3.0, 4.0], [1.0] * 4, blacklist_rounds=0,
                                    blacklist_max_len=0.5)
    choice = policy.choose(2, cands, 2, None)
    assert choice.section.blacklisted == 2  # 4 over the limit, at most half of them
    assert len(choice.picks) == 2


def test_oort_warns_once_about_clients_without_a_loss(caplog):
    policy = OortSelection()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        policy.feedback(1, [Outcome("0", None, 10, 1.0), Outcome("1", None, 10, 1.0)])
    assert sum("reported no training loss" in r.message for r in caplog.records) == 1
    assert policy.clients == {}  # both stay unexplored


def test_oort_state_goes_through_a_checkpoint_and_resumes_the_same_choices():
    def run(policy, rounds):
        chosen = []
        for r in rounds:
            choice = policy.choose(r, candidates(8, seconds=[float(k + 1) for k in range(8)]),
                                   3, None)
            chosen.append(sorted(choice.picks))
            policy.feedback(r, [Outcome(str(k), 0.1 * (k + 1), 10, float(k + 1))
                                for k in choice.picks])
        return chosen

    full = run(OortSelection(seed=3), range(1, 7))
    first = OortSelection(seed=3)
    run(first, range(1, 4))
    tree, arrays = checkpoint_format.encode(first.state_dict())
    resumed = OortSelection(seed=3)
    resumed.load_state_dict(checkpoint_format.decode(
        checkpoint_format.loads(checkpoint_format.dumps(tree)), arrays))
    assert run(resumed, range(4, 7)) == full[3:]


# ---------------------------------------------------------------- Power-of-Choice
def test_poc_takes_the_m_largest_losses_of_its_candidates():
    assert largest_losses({0: 0.5, 3: 2.0, 5: None, 7: 1.0}, 2) == [3, 7]
    assert largest_losses({0: None, 1: 0.1}, 2) == [1, 0]  # no answer: last
    rng = np.random.default_rng(0)
    pool = candidate_set(rng, [1, 1, 1000, 1], 1)
    assert pool == [2]  # p_k = n_k / n: the big client
    asked = []

    def query(positions):
        asked.append(list(positions))
        return {k: float(10 - k) for k in positions}  # lower position, larger loss

    choice = PowerOfChoice(seed=4, candidates=4).choose(1, candidates(8), 2, query)
    assert len(asked) == 1 and len(asked[0]) == 4
    assert sorted(choice.picks) == sorted(asked[0])[:2]
    assert choice.section.losses == {str(k): float(10 - k) for k in asked[0]}
    # d = 0: 2m candidates
    PowerOfChoice(seed=4).choose(1, candidates(8), 3, query)
    assert len(asked[1]) == 6


# ---------------------------------------------------------------- TiFL
def test_tifl_tiers_from_times_and_alg2_probabilities():
    assert make_tiers({"a": 3.0, "b": 1.0, "c": 2.0, "d": 4.0}, 2) == \
        {"b": 0, "c": 0, "a": 1, "d": 1}
    # accuracy ascending: tier 1, tier 2, tier 0 -> 3/6, 2/6, 1/6
    assert change_probabilities([-1.0, -3.0, -2.0], [1, 1, 1]) == \
        pytest.approx([1 / 6, 3 / 6, 2 / 6])
    # tier 1 out of credits: n = 2, D = 3
    assert change_probabilities([-1.0, -3.0, -2.0], [1, 0, 1]) == \
        pytest.approx([1 / 3, 0.0, 2 / 3])


def test_tifl_picks_within_one_tier_spends_its_credit_and_adapts():
    policy = TiFLSelection(seed=5, tiers=2, credits=3, interval=2)
    cands = candidates(6, seconds=[1.0, 9.0, 2.0, 8.0, 3.0, 7.0])
    choice = policy.choose(1, cands, 2, None)
    tier = choice.section.tier
    members = {0, 2, 4} if tier == 0 else {1, 3, 5}
    assert set(choice.picks) <= members and len(choice.picks) == 2
    assert choice.section.credits[tier] == 2 and choice.section.probabilities == [0.5, 0.5]
    # the slow tier's clients report higher losses: at round 2 it gets the larger probability
    policy.feedback(1, [Outcome(str(k), 1.0 + (k % 2), 10, None) for k in range(6)])
    choice = policy.choose(2, cands, 2, None)
    assert choice.section.probabilities == pytest.approx([1 / 3, 2 / 3])
    state = policy.state_dict()
    copy = TiFLSelection(seed=5, tiers=2, credits=3, interval=2)
    copy.load_state_dict(checkpoint_format.decode(*checkpoint_format.encode(state)))
    assert copy.choose(3, cands, 2, None).picks == policy.choose(3, cands, 2, None).picks


# ---------------------------------------------------------------- in the participation model
def app(with_loss: bool = True) -> ClientApp:
    """Partition p: n = 10 (p + 1); train returns w + p + 1 and loss 1 / (p + 1); evaluate
    answers loss p."""
    client = ClientApp()

    @client.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(
            {C.PARTITION_ID: pid, C.NUM_EXAMPLES: 10 * (pid + 1)})}), reply_to=msg)

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        w = msg.content[C.ARRAYS]["w"].numpy() + pid + 1
        metrics = {C.NUM_EXAMPLES: 10 * (pid + 1)}
        if with_loss:
            metrics["train_loss"] = 1.0 / (pid + 1)
        return Message(RecordDict({C.ARRAYS: record({"w": w}),
                                   C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @client.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(
            {"eval_loss": float(pid), C.NUM_EXAMPLES: 10 * (pid + 1)})}), reply_to=msg)

    return client


def clock() -> SimClock:
    return SimClock(GeneratedFleet("lognormal", seed=3, sigma=1.0), seconds_per_example=0.01)


POLICIES = {
    "oort": lambda: OortSelection(seed=7),
    "power-of-choice": lambda: PowerOfChoice(seed=7, candidates=5),
    "tifl": lambda: TiFLSelection(seed=7, tiers=3, credits=4),
}


def fedavg(policy) -> FedAvg:
    return FedAvg(fraction_evaluate=0.0, participation=Participation(
        fraction_train=0.3, seed=7, query_client_info=True, clock=clock(), selection=policy))


def run(strategy, rounds, first_round=1, arrays=None):
    return run_rounds(strategy, InProcessGrid(app(), 10, {}),
                      arrays or record({"w": np.zeros(2)}), num_rounds=rounds,
                      train_config=ConfigRecord({C.LOCAL_STEPS: 2}), first_round=first_round)


@pytest.mark.parametrize("name", POLICIES)
def test_fedavg_runs_each_policy_logs_its_choice_and_resumes_bit_exact(name):
    full = fedavg(POLICIES[name]())
    full_result = run(full, 4)
    log = [full.round_log(r) for r in range(1, 5)]
    assert all(r[C.LOG_SELECTION] == name and len(r[C.LOG_SELECTION_CHOSEN]) == 3
               and r[C.LOG_CLIENTS_SAMPLED] == 3 for r in log)
    if name == "power-of-choice":
        # 5 candidates asked, the 3 with the largest loss (the highest partition ids) chosen
        assert all(r[C.LOG_POC_QUERY_MESSAGES] == 5 and r[C.LOG_POC_QUERY_BYTES] > 0
                   for r in log)
        losses = log[0][C.LOG_POC_LOSSES]
        assert sorted(log[0][C.LOG_SELECTION_CHOSEN]) == sorted(
            sorted(losses, key=losses.get)[-3:])
        # the query on the clock: the slowest candidate's download + n_i c / 3, before training
        model_bytes = record({"w": np.zeros(2)}).count_bytes()
        fleet = clock()
        for r in log:
            query = max(evaluation_seconds(fleet.profile(int(k)), 10 * (int(k) + 1), 0.01,
                                           model_bytes) for k in r[C.LOG_POC_LOSSES])
            assert r[C.LOG_POC_QUERY_SECONDS] == pytest.approx(query, rel=1e-12)
            assert r[C.LOG_SIM_SECONDS] > query
            assert C.LOG_SIM_WAIT_SECONDS not in r  # no device window waited for
    first = fedavg(POLICIES[name]())
    first_result = run(first, 2)
    tree, arrays = checkpoint_format.encode(first.state_dict())
    resumed = fedavg(POLICIES[name]())
    resumed.load_state_dict(checkpoint_format.decode(
        checkpoint_format.loads(checkpoint_format.dumps(tree)), arrays))
    result = run(resumed, 4, first_round=3, arrays=first_result.arrays)
    assert numpy_of(result.arrays)["w"].tobytes() == numpy_of(full_result.arrays)["w"].tobytes()
    assert resumed.round_log(4) == full.round_log(4)


def test_fedbuff_draws_each_freed_slot_with_oort_and_feeds_it_back():
    policy = OortSelection(seed=7)
    strategy = FedBuff(buffer_size=2, concurrency=3, fraction_evaluate=0.0,
                       participation=Participation(seed=7, query_client_info=True,
                                                   clock=clock(), selection=policy))
    run(strategy, 3)
    log = strategy.round_log(2)
    assert log[C.LOG_SELECTION] == "oort" and log[C.LOG_SELECTION_CHOSEN]
    assert policy.clients, "the applied updates were fed back"


def test_fedbuffs_loss_query_is_timed_on_each_tasks_draw_of_the_fleet(monkeypatch):
    """Power-of-Choice's query before asynchronous task n takes the queried phones' round-n
    profiles (speed noise, bandwidths), as a task's training does, not their mean ones."""
    fleet = FlashFleet(seed=0, speed_noise=0.5)
    strategy = FedBuff(buffer_size=2, concurrency=3, fraction_evaluate=0.0,
                       participation=Participation(
                           seed=7, query_client_info=True, clock=SimClock(fleet, 0.01),
                           selection=PowerOfChoice(seed=7, candidates=4)))
    seen = []
    select_among = Participation.select_among

    def recording(self, server_round, *args):
        picks, section = select_among(self, server_round, *args)
        seen.append((server_round, section))
        return picks, section

    monkeypatch.setattr(Participation, "select_among", recording)
    run(strategy, 3)
    model_bytes = record({"w": np.zeros(2)}).count_bytes()
    differ = 0
    for n, section in seen:
        def query(profile):
            return max(evaluation_seconds(profile(int(k)), 10 * (int(k) + 1), 0.01, model_bytes)
                       for k in section.losses)
        assert section.query_seconds == pytest.approx(
            query(lambda pid: fleet.round_profile(pid, n)), rel=1e-12)
        differ += section.query_seconds != pytest.approx(query(fleet.profile), rel=1e-12)
    assert len(seen) >= 6 and differ == len(seen)  # none on the mean profiles


def test_random_selection_is_unchanged_and_logs_nothing_new():
    strategy = FedAvg(fraction_evaluate=0.0, fraction_train=0.3, seed=7, query_client_info=True)
    run(strategy, 2)
    assert C.LOG_SELECTION not in strategy.round_log(1)
    assert "selection-state" not in strategy.state_dict()
    assert isinstance(strategy.participation.selection, RandomSelection)


def test_policies_that_need_the_clock_refuse_to_run_without_one():
    for policy in (OortSelection(), TiFLSelection()):
        with pytest.raises(ValueError, match="simulated clock"):
            Participation(query_client_info=True, selection=policy)
    Participation(selection=PowerOfChoice())  # needs no clock


def test_a_resume_with_another_policy_is_refused():
    saved = fedavg(TiFLSelection(seed=7)).state_dict()
    with pytest.raises(ValueError, match="selection 'oort'"):
        fedavg(OortSelection(seed=7)).load_state_dict(saved)


def test_clients_without_a_loss_are_explored_and_said_once(caplog):
    strategy = fedavg(OortSelection(seed=7))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_rounds(strategy, InProcessGrid(app(with_loss=False), 10, {}),
                   record({"w": np.zeros(2)}), num_rounds=3,
                   train_config=ConfigRecord({C.LOCAL_STEPS: 2}))
    assert sum("reported no training loss" in r.message for r in caplog.records) == 1
    assert all(strategy.round_log(r)[C.LOG_CLIENTS_SAMPLED] == 3 for r in (1, 2, 3))


def test_selection_bench_prints_each_policys_cost_per_round(capsys, monkeypatch):
    """The pure-policy part of ``bench selection`` (no flwr run with --round-clients 0)."""
    from simulation.__main__ import main

    # its first line asks git for the commit, a process (tests/test_bench_figures.py)
    monkeypatch.setattr("simulation.bench.git_state",
                        lambda: {"git-commit": "0" * 40, "git-dirty": False})

    main(["bench", "selection", "--clients", "200", "--rounds", "3", "--round-clients", "0"])
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("selection cost per round at 200"))
    for name in ("random", "oort", "power-of-choice", "tifl"):
        assert f"{name} " in line and " ms" in line


def test_poc_query_on_the_clock_with_a_client_that_reported_no_size():
    """A client-info answer without num-examples (allowed: the fact is optional) costs the
    query only its download on the clock, not the run."""
    import dataclasses

    strategy = fedavg(PowerOfChoice(seed=7, candidates=10))
    run(strategy, 1)
    clients = strategy.participation.clients
    for node in clients:
        clients[node] = dataclasses.replace(clients[node], num_examples=None)
    run_rounds(strategy, InProcessGrid(app(), 10, {}), record({"w": np.zeros(2)}),
               num_rounds=2, first_round=2,
               train_config=ConfigRecord({C.LOCAL_STEPS: 2, C.BATCH_SIZE: 5}))
    assert strategy.round_log(2)[C.LOG_POC_QUERY_SECONDS] > 0
