"""The selection policies as their authors define them, each rule against numbers this file
derives itself from the paper or the authors' code (never by calling the function it checks):

* Power-of-Choice (Cho, Wang and Joshi, AISTATS 2022, Sec. 2): the server averages the m
  chosen clients with a plain mean; averaging by n_k is an explicit option;
* Oort (Lai et al., OSDI 2021, Alg. 1; SymbioticLab/Oort ``oort/oort.py``,
  ``_training_selector.getTopK`` and ``get_norm``): eps is decayed before each selection and
  drops to 0 once nothing is left to explore; utilities are normalised over every online
  client with a reward, the unexplored ones' being their size;
* TiFL (Chai et al., HPDC 2020, Sec. 4): tiers whose sizes differ by at most one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedapp import checkpoint_format
from strategies import contract as C
from strategies.engine.participation import RandomSelection
from strategies.selection.oort import OortSelection, exploration_factor, normalisation
from strategies.selection.policy import Candidate, Outcome, selection_weighting
from strategies.selection.power_of_choice import PowerOfChoice
from strategies.selection.tifl import TiFLSelection, make_tiers, tier_sizes
from tests.messages import numpy_of
from tests.test_selection import fedavg, run


# ---------------------------------------------------------------- Power-of-Choice
def test_poc_averages_the_m_chosen_with_a_plain_mean_unless_told_otherwise():
    """The rule: pow-d's own weighting decides over the engine's default 'examples'; an
    engine weighting that disagrees with it is refused, naming both and the fix."""
    assert PowerOfChoice().weighting == "uniform"
    assert selection_weighting("FedAvg", "examples", PowerOfChoice()) == "uniform"
    assert selection_weighting("FedAvg", "uniform", PowerOfChoice()) == "uniform"
    assert selection_weighting("FedAvg", "examples",
                               PowerOfChoice(weighting="examples")) == "examples"
    for other in ("pre-erratum", "scheme-i", "scheme-ii"):
        with pytest.raises(ValueError, match=f"FedAvg: weighting='{other}' with selection "
                           r"PowerOfChoice\(weighting='uniform'\).*leave the strategy's "
                           "weighting at 'examples'"):
            selection_weighting("FedAvg", other, PowerOfChoice())
    with pytest.raises(ValueError, match="weighting='uniform' with selection "
                       r"PowerOfChoice\(weighting='examples'\)"):
        selection_weighting("FedAvg", "uniform", PowerOfChoice(weighting="examples"))
    # policies whose papers say nothing of the averaging leave the engine's weighting
    for policy in (None, RandomSelection(0), OortSelection(), TiFLSelection()):
        for weighting in ("examples", "uniform", "scheme-ii"):
            assert selection_weighting("FedAvg", weighting, policy) == weighting


@pytest.mark.parametrize("bad", ["n_k", "Uniform", "", None, 1])
def test_poc_refuses_an_unknown_weighting_naming_it_and_the_choices(bad):
    with pytest.raises(ValueError, match=rf"PowerOfChoice: weighting={bad!r} is not known; "
                       r"use 'uniform' \(the paper's plain mean of the m chosen, the "
                       r"default\) or 'examples'"):
        PowerOfChoice(weighting=bad)


def replay(strategy, rounds: int, by_examples: bool) -> np.ndarray:
    """The model after ``rounds`` rounds, re-derived from the logged choices: client p
    trains w -> w + p + 1 on n_p = 10 (p + 1) examples (tests/test_selection.py's app);
    pow-d's update is (1/m) sum_k w_k, the option sum_k n_k w_k / sum_k n_k."""
    w = np.zeros(2)
    for r in range(1, rounds + 1):
        chosen = [int(k) for k in strategy.round_log(r)[C.LOG_SELECTION_CHOSEN]]
        weights = [10.0 * (p + 1) if by_examples else 1.0 for p in chosen]
        w = sum(c * (w + p + 1) for c, p in zip(weights, chosen)) / sum(weights)
    return w


def test_poc_with_weighting_examples_averages_by_n_k():
    strategy = fedavg(PowerOfChoice(seed=7, candidates=5, weighting="examples"))
    w = numpy_of(run(strategy, 3).arrays)["w"]
    np.testing.assert_allclose(w, replay(strategy, 3, by_examples=True), rtol=1e-6)
    assert np.abs(w - replay(strategy, 3, by_examples=False)).max() > 0.1


def test_poc_by_default_averages_the_chosen_with_a_plain_mean():
    strategy = fedavg(PowerOfChoice(seed=7, candidates=5))
    w = numpy_of(run(strategy, 3).arrays)["w"]
    np.testing.assert_allclose(w, replay(strategy, 3, by_examples=False), rtol=1e-6)


# ---------------------------------------------------------------- Oort: epsilon
@pytest.mark.parametrize("start, decay, minimum", [(0.9, 0.98, 0.2), (0.9, 0.95, 0.2),
                                                   (0.9, 0.98, 0.3), (0.5, 0.9, 0.0)])
def test_oort_epsilon_is_decayed_before_each_selection(start, decay, minimum):
    """The authors' getTopK: ``exploration = max(exploration * decay, min)`` and then the
    selection uses it, so the n-th selection's eps is the n-th iterate from eps_0."""
    eps = start
    for n in range(1, 301):
        eps = max(eps * decay, minimum)
        assert exploration_factor(n, start, decay, minimum) == pytest.approx(eps, rel=1e-12)
    assert exploration_factor(1) == pytest.approx(0.882)  # 0.9 x 0.98, not 0.9


def test_oort_first_selection_uses_the_decayed_epsilon():
    cands = [Candidate(str(k), 10 * (k + 1), 1.0) for k in range(6)]
    assert OortSelection(seed=1).choose(1, cands, 3, None).section.epsilon == \
        pytest.approx(0.9 * 0.98)


def test_oort_stops_exploring_once_every_client_seen_has_been_explored():
    """Four clients, two a round. Selections 1-2 explore all four; selection 3 finds none
    left: it still uses its eps (its int(2 (1 - eps)) = 0 exploited slots, the leftover two
    drawn uniformly, nobody explored), and from selection 4 on eps = 0: both exploited."""
    policy = OortSelection(seed=4)
    cands = [Candidate(str(k), 10, 1.0) for k in range(4)]
    sections = []
    for r in range(1, 6):
        choice = policy.choose(r, cands, 2, None)
        sections.append(choice.section)
        policy.feedback(r, [Outcome(cands[k].key, 0.1 * (k + 1), 10, 1.0)
                            for k in choice.picks])
    eps = [0.9 * 0.98 ** n for n in (1, 2, 3)]
    assert [s.epsilon for s in sections[:3]] == pytest.approx(eps)
    assert [s.explored for s in sections[:2]] == [2, 2]
    assert sections[2].explored == 0 and policy.exploration_over
    assert [s.epsilon for s in sections[3:]] == [0.0, 0.0]
    assert all(s.explored == 0 for s in sections[3:])


def test_oort_explores_while_a_client_seen_before_is_unexplored_though_offline():
    """Client 8 was seen once and never trained, so exploration is not over (the authors'
    unexplored set holds every registered client). With only the explored clients 0-7
    online, eps = 0.9 x 0.98^21 = 0.59 leaves int(3 x 0.41) = 1 exploited slot (cut-off
    1: one of the two best, 6 or 7); the other two are drawn uniformly among the rest, not
    exploited: over 20 seeds clients below the four best are chosen too."""
    low = set()
    for seed in range(20):
        policy = OortSelection(seed=seed, cut_off=1.0, clip_bound=1.0)
        policy.choose(1, [Candidate(str(k), 10, 1.0) for k in range(9)], 3, None)
        policy.feedback(1, [Outcome(str(k), 0.1 * (k + 1), 10, 1.0) for k in range(8)])
        policy.selections = 20
        choice = policy.choose(2, [Candidate(str(k), 10, 1.0) for k in range(8)], 3, None)
        assert choice.section.epsilon == pytest.approx(0.9 * 0.98 ** 21)
        assert choice.section.explored == 0 and not policy.exploration_over
        assert choice.section.chosen[0] in ("6", "7")  # the exploited one comes first
        low |= {int(k) for k in choice.section.chosen[1:]} & {0, 1, 2, 3}
    assert low  # exploiting all three (utility >= the 4th best's) would never take 0-3


# ---------------------------------------------------------------- Oort: normalisation
def authors_norm(rewards: list[float], clip_bound: float) -> tuple[float, float, float]:
    """get_norm of the authors' code, over the rewards > 0, re-derived: min x 0.999,
    max(max - that, 1e-4), the sorted list at min(int(n clip_bound), n - 1)."""
    values = sorted(r for r in rewards if r > 0)
    low = min(values) * 0.999
    return low, max(max(values) - low, 1e-4), values[min(int(len(values) * clip_bound),
                                                         len(values) - 1)]


def test_oort_normalisation_bounds_by_hand():
    assert normalisation([2.0, 0.0, 6.0, 4.0, 50.0, 1.0], 0.95) == \
        pytest.approx(authors_norm([2.0, 6.0, 4.0, 50.0, 1.0], 0.95))
    assert normalisation([3.0], 0.95) == pytest.approx(authors_norm([3.0], 0.95))
    assert normalisation([0.0, 0.0], 0.95) == (0.0, 1e-4, 0.0)  # no reward: nothing to scale
    assert normalisation([1.0] * 19 + [1000.0], 0.9)[2] == 1.0  # sorted[18]: clipped


def test_oort_normalises_over_every_online_client_with_a_reward():
    """Three explored clients (U = n L = 2, 4, 6), two unexplored online (n = 1, 50) and one
    with no size. The exploited utilities are normalised over {2, 4, 6, 1, 50}, as the
    authors' getTopK does over every feasible client with a reward > 0, not over {2, 4, 6}."""
    policy = OortSelection(seed=6, preferred_duration=10.0)
    policy.selections = 200  # eps at its floor 0.2: int(3 x 0.8) = 2 exploited
    policy.feedback(1, [Outcome(str(k), u / 10, 10, 1.0) for k, u in enumerate([2, 4, 6])])
    cands = [Candidate(str(k), 10, 1.0) for k in range(3)] + [
        Candidate("3", 1, 1.0), Candidate("4", 50, 1.0), Candidate("5", None, 1.0)]
    choice = policy.choose(2, cands, 3, None)
    low, spread, clip = authors_norm([2.0, 4.0, 6.0, 1.0, 50.0], 0.95)
    assert (low, clip) == pytest.approx((0.999, 50.0))
    bonus = math.sqrt(0.1 * math.log(2) / 1)  # R = 2, last round L(i) = 1
    expected = {str(k): (min(u, clip) - low) / spread + bonus
                for k, u in enumerate([2.0, 4.0, 6.0])}
    exploited = {k: v for k, v in choice.section.scores.items() if k in expected}
    assert len(exploited) == 2
    for key, value in exploited.items():
        assert value == pytest.approx(expected[key], rel=1e-12)
    # over the explored alone the first term would be (u - 1.998) / 4.002: not what runs
    only = {str(k): (u - 1.998) / (6.0 - 1.998) + bonus for k, u in enumerate([2.0, 4.0, 6.0])}
    assert all(abs(v - only[k]) > 0.05 for k, v in exploited.items() if k != "0")


def test_oort_version_1_state_loads_with_the_explored_clients_as_those_seen():
    policy = OortSelection(seed=3)
    cands = [Candidate(str(k), 10, 1.0) for k in range(4)]
    choice = policy.choose(1, cands, 2, None)
    policy.feedback(1, [Outcome(cands[k].key, 0.5, 10, 1.0) for k in choice.picks])
    state = policy.state_dict()
    assert state["oort-state-version"] == 2 and state["seen"] == ["0", "1", "2", "3"]
    old = {k: v for k, v in state.items() if k not in ("seen", "exploration-over")}
    old["oort-state-version"] = 1
    resumed = OortSelection(seed=3)
    resumed.load_state_dict(checkpoint_format.decode(*checkpoint_format.encode(old)))
    assert resumed.seen == {cands[k].key for k in choice.picks}
    assert resumed.exploration_over is False
    with pytest.raises(ValueError, match="has version 7, not 2 .or 1."):
        OortSelection().load_state_dict({**state, "oort-state-version": 7})


# ---------------------------------------------------------------- TiFL
@pytest.mark.parametrize("clients, tiers", [(10, 3), (10, 4), (10, 5), (7, 5), (3, 5),
                                            (12, 5), (1, 1), (5, 5), (300, 7), (0, 3)])
def test_tifl_tiers_are_balanced_faster_tiers_first(clients, tiers):
    """Sizes differ by at most one, the larger ones the faster tiers, each tier a run of
    consecutive clients by time: numpy's array_split of the time-sorted clients."""
    times = {f"c{k}": float((7 * k) % (clients + 3)) + k / 1000 for k in range(clients)}
    ordered = sorted(times, key=times.get)
    expected = {key: t for t, part in enumerate(np.array_split(np.array(ordered, dtype=object),
                                                                tiers))
                for key in part}
    assert make_tiers(times, tiers) == expected
    sizes = [sum(1 for t in expected.values() if t == tier) for tier in range(tiers)]
    assert tier_sizes(clients, tiers) == sizes
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == clients


def test_tifl_cuts_ten_clients_into_4_3_3_not_4_4_2():
    times = {str(k): float(k) for k in range(10)}
    tiers = make_tiers(times, 3)
    assert [sorted(int(k) for k, t in tiers.items() if t == tier) for tier in range(3)] == \
        [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
