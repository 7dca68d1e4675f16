"""A client that lies about itself cannot capture informed selection (issue #57, item 1).

Ten clients, three a round, twelve rounds, on the simulated clock. Honest client p
reports n = 100 (p + 1) and loss 0.2 + 0.1 p; the liar reports loss 1e9 (to the loss
query too) and, in the "size" variant, 4,194,304 examples. Without the fleet guard
(FleetGuard(0, 0, 0): today's policies as the papers give them) Oort and
Power-of-Choice choose the liar in 9-12 of 12 rounds; with the default guard no client is
chosen more than twice the honest clients' mean."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedapp import checkpoint_format
from strategies import FedAvg
from strategies import contract as C
from strategies.engine.participation import Participation
from strategies.engine.robust import Median
from strategies.engine.rounds import run_rounds
from strategies.selection.fleet_guard import FleetGuard, capped, fleet_median
from strategies.selection.oort import OortSelection
from strategies.selection.policy import Candidate, Outcome
from strategies.selection.power_of_choice import PowerOfChoice
from strategies.selection.tifl import TiFLSelection
from tests.inprocess import InProcessGrid
from tests.messages import numpy_of, record
from tests.test_selection import clock

ROUNDS, CLIENTS = 12, 10
POLICIES = {"oort": lambda: OortSelection(seed=7),
            "power-of-choice": lambda: PowerOfChoice(seed=7),
            "tifl": lambda: TiFLSelection(seed=7, tiers=3)}


def liar_app(liar: int, big: bool) -> ClientApp:
    """The fleet of the module docstring; the liar trains a poisoned model (w = -50)."""
    client = ClientApp()

    def size(pid: int) -> int:
        return 4_194_304 if big and pid == liar else 100 * (pid + 1)

    def loss(pid: int) -> float:
        return 1e9 if pid == liar else 0.2 + 0.1 * pid

    def reply(msg: Message, metrics: dict, arrays=None) -> Message:
        content = {C.METRICS: MetricRecord(metrics)}
        if arrays is not None:
            content[C.ARRAYS] = record(arrays)
        return Message(RecordDict(content), reply_to=msg)

    @client.query()
    def query(msg, context):
        pid = int(context.node_config["partition-id"])
        return reply(msg, {C.PARTITION_ID: pid, C.NUM_EXAMPLES: size(pid)})

    @client.train()
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        w = msg.content[C.ARRAYS]["w"].numpy()
        w = np.full_like(w, -50.0) if pid == liar else w + 0.5 * (1.0 - w)
        return reply(msg, {C.NUM_EXAMPLES: size(pid), "train_loss": loss(pid)}, {"w": w})

    @client.evaluate()
    def evaluate(msg, context):
        pid = int(context.node_config["partition-id"])
        return reply(msg, {"eval_loss": loss(pid), C.NUM_EXAMPLES: size(pid)})

    return client


def selections(policy: str, liar: int, big: bool, guard: FleetGuard) -> collections.Counter:
    """How often each client (partition id as text) was chosen in ROUNDS rounds."""
    strategy = FedAvg(fraction_evaluate=0.0, participation=Participation(
        fraction_train=0.3, seed=7, query_client_info=True, clock=clock(),
        selection=POLICIES[policy](), selection_guard=guard))
    run_rounds(strategy, InProcessGrid(liar_app(liar, big), CLIENTS, {}),
               record({"w": np.zeros(1)}), num_rounds=ROUNDS,
               train_config=ConfigRecord({C.LOCAL_STEPS: 2}))
    return collections.Counter(key for r in range(1, ROUNDS + 1)
                               for key in strategy.round_log(r)[C.LOG_SELECTION_CHOSEN])


def liar_and_honest(counts: collections.Counter, liar: int) -> tuple[int, float]:
    honest = [counts.get(str(p), 0) for p in range(CLIENTS) if p != liar]
    return counts.get(str(liar), 0), sum(honest) / len(honest)


@pytest.mark.parametrize("policy, big, liar, captured", [
    ("oort", False, 2, 10), ("power-of-choice", True, 4, 12), ("power-of-choice", False, 8, 9)])
def test_without_the_guard_the_liar_captures_selection(policy, big, liar, captured):
    counts = selections(policy, liar, big, FleetGuard(0, 0, 0))
    chosen, honest = liar_and_honest(counts, liar)
    assert chosen == captured and chosen > 2.5 * honest


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("big", [False, True], ids=["loss", "loss+size"])
@pytest.mark.parametrize("liar", [2, 4, 8])
def test_with_the_guard_the_liar_is_chosen_at_most_twice_as_often_as_an_honest_client(
        policy, big, liar):
    counts = selections(policy, liar, big, FleetGuard())
    chosen, honest = liar_and_honest(counts, liar)
    assert chosen <= 2 * honest
    assert max(counts.values()) <= 1.5 * ROUNDS * 3 / CLIENTS + 1  # nobody above the quota


def test_reports_are_capped_at_a_multiple_of_the_fleets_lower_median():
    assert fleet_median([5.0, 1.0, 3.0, 1e9]) == 3.0 and fleet_median([]) is None
    assert capped(1e9, 3.0, 4.0) == 12.0 and capped(2.0, 3.0, 4.0) == 2.0
    assert capped(1e9, 3.0, 0.0) == 1e9 and capped(None, 3.0, 4.0) is None
    guard = FleetGuard()
    sizes = [Candidate(str(k), n, None) for k, n in enumerate([100, 200, 300, 4_194_304])]
    assert [c.num_examples for c in guard.candidates(sizes)] == [100, 200, 300, 800]
    answers = guard.answers({0: "0", 1: "1", 2: "3"}, {0: 0.5, 1: 1.0, 2: 1e9})
    assert answers == {0: 0.5, 1: 1.0, 2: 4.0}
    out = guard.outcomes([Outcome("3", 1e9, 4_194_304, None), Outcome("0", 0.5, 100, None),
                          Outcome("1", 1.0, 200, None)])
    assert [(o.loss, o.num_examples) for o in out] == [(4.0, 800), (0.5, 100), (1.0, 200)]
    assert guard.losses == {"3": 4.0, "0": 0.5, "1": 1.0}  # the bounded value is remembered


def test_the_quota_holds_a_client_to_its_fair_share_and_resumes():
    guard = FleetGuard(share_factor=1.5)
    keys = [str(k) for k in range(10)]
    assert guard.eligible(keys, 3) == list(range(10))  # 1 <= 1.5 x 0.3 + 1
    guard.record(keys, ["0", "1", "2"], 3)
    # chosen once, earned 0.3: a second pick (2) > 1.5 x (0.3 + 0.3) + 1 = 1.9 waits a round
    assert guard.eligible(keys, 3) == list(range(3, 10))
    guard.record(keys, ["3", "4", "5"], 3)
    assert 0 in guard.eligible(keys, 3)  # 2 <= 1.5 x (0.6 + 0.3) + 1 = 2.35
    assert guard.chosen["0"] == 1 and guard.earned["0"] == pytest.approx(0.6)
    assert guard.eligible(keys[:3], 3) == [0, 1, 2]  # fewer than m within: nobody sits out
    copy = FleetGuard(share_factor=1.5)
    copy.load_state_dict(checkpoint_format.decode(*checkpoint_format.encode(guard.state_dict())))
    assert copy.state_dict() == guard.state_dict()
    assert FleetGuard(0, 0, 0).eligible(keys, 3) == list(range(10))


@pytest.mark.parametrize("bad", [0.5, -1, float("nan"), float("inf"), True, "2"])
def test_a_factor_below_one_is_refused(bad):
    with pytest.raises(ValueError, match="share_factor must be 0 .off. or a number >= 1"):
        FleetGuard(share_factor=bad)


def final_model(policy: str, liar: int, big: bool, robust) -> float:
    strategy = FedAvg(fraction_evaluate=0.0, robust=robust, participation=Participation(
        fraction_train=0.3, seed=7, query_client_info=True, clock=clock(),
        selection=POLICIES[policy]()))
    result = run_rounds(strategy, InProcessGrid(liar_app(liar, big), CLIENTS, {}),
                        record({"w": np.zeros(1)}), num_rounds=ROUNDS,
                        train_config=ConfigRecord({C.LOCAL_STEPS: 2}))
    return float(numpy_of(result.arrays)["w"][0])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("big", [False, True], ids=["loss", "loss+size"])
def test_with_the_guard_and_the_median_the_model_ends_where_the_honest_run_does(policy, big):
    """The guard bounds how often the liar is chosen, the median what its model does once
    chosen (tests/test_robust_aggregation.py): together the run ends within 1e-3 of the
    run without a liar (w -> 1.0); the guard alone ends between 0.8 and -50."""
    honest = final_model(policy, -1, big, Median())
    assert honest == pytest.approx(1.0, abs=1e-2)
    assert final_model(policy, 4, big, Median()) == pytest.approx(honest, abs=1e-3)
    assert abs(final_model(policy, 4, big, None) - honest) > 0.1
