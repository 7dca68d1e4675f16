"""FedAvgM on the round engine: ``FedAvg(server_momentum=beta)`` (Hsu, Qi and Brown 2019,
Sec. 3: v <- beta v + Delta_t, w <- w - eta_g v, Delta_t = w_t minus the weighted average).

Against the paper's equations computed here from hand-made replies; beta = 0 against plain
FedAvg bit for bit; against Flower's FedAvgM on the same replies; under the clock, a
deadline, over-commitment and Oort against plain FedAvg's averages of the same rounds; a
robust rule in the average's place; through a checkpoint file and back bit for bit; and the
refusals of a bad beta and of a checkpoint's buffer that does not fit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from flwr.supercore.task_identity import TaskIdentity

from fedapp.checkpoint import load_checkpoint, make_payload, restore_strategy, save_checkpoint
from fedapp.config import RunConfig
from fedapp.registry import build_strategy
from strategies import FedAvg, OortSelection
from strategies import contract as C
from strategies.algorithms.fedavg import ServerMomentum
from strategies.engine.algorithm import Algorithm
from strategies.engine.clock import SimClock
from strategies.engine.devices import DeviceProfile, TraceFleet
from strategies.engine.rounds import run_rounds
from tests.inprocess import InProcessGrid, adding_app
from tests.messages import numpy_of, record

SIZES = (10, 30, 60)  # n_k of partitions 0, 1, 2
W0 = {"w": np.array([0.5, -1.0, 2.0], dtype=np.float32),
      "b": np.array([[1.0, 0.0], [0.25, -0.5]], dtype=np.float32),
      "count": np.array(4, dtype=np.int64)}  # an integer buffer: averaged, no momentum
TRAIN = ConfigRecord({C.LOCAL_STEPS: 1})
QUIET = {"query_client_info": True, "fraction_evaluate": 0.0}


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def hand_made(server_round: int, pid: int) -> dict[str, np.ndarray]:
    """Partition ``pid``'s model in round ``server_round``: fixed numbers, not the model sent."""
    rng = np.random.default_rng(100 * server_round + pid)
    return {"w": rng.normal(size=3).astype(np.float32),
            "b": rng.normal(size=(2, 2)).astype(np.float32),
            "count": np.array(4 + server_round + pid, dtype=np.int64)}


def scripted_app() -> ClientApp:
    """Partition p answers the query with n_p = SIZES[p] and replies :func:`hand_made`."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(
            {C.PARTITION_ID: pid, C.NUM_EXAMPLES: SIZES[pid]})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        return Message(RecordDict({
            C.ARRAYS: record(hand_made(server_round, pid)),
            C.METRICS: MetricRecord({C.NUM_EXAMPLES: SIZES[pid], C.TRAIN_LOSS: float(pid)})}),
            reply_to=msg)

    return app


def run(strategy, app: ClientApp, rounds: int, nodes: int = 3, initial=None, first_round=1):
    """The global model after each round (round 0: the initial one), and the result."""
    models: dict[int, dict[str, np.ndarray]] = {}

    def keep(server_round, arrays):
        models[server_round] = {k: v.copy() for k, v in numpy_of(arrays).items()}

    result = run_rounds(strategy, InProcessGrid(app, nodes, {}),
                        record(W0) if initial is None else initial, num_rounds=rounds,
                        train_config=TRAIN, evaluate_fn=keep, first_round=first_round)
    return models, result


def fedavgm_reference(rounds: int, beta: float, eta: float):
    """Hsu et al.'s FedAvgM in float64 from the hand-made replies, weights n_k / sum n_k:
    the floating arrays and v after each round."""
    n = np.asarray(SIZES, dtype=np.float64)
    w = {k: W0[k].astype(np.float64) for k in ("w", "b")}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    after = {}
    for t in range(1, rounds + 1):
        for key in ("w", "b"):
            average = sum(n[p] * hand_made(t, p)[key] for p in range(3)) / n.sum()
            delta = w[key] - average
            v[key] = beta * v[key] + delta
            w[key] = w[key] - eta * v[key]
        after[t] = ({k: x.copy() for k, x in w.items()}, {k: x.copy() for k, x in v.items()})
    return after


# ---------------------------------------------------------------- the paper's equations
@pytest.mark.parametrize("beta, eta", [(0.9, 1.0), (0.5, 0.3)])
def test_three_rounds_follow_the_papers_equations(beta, eta):
    strategy = FedAvg(**QUIET, min_available_nodes=3, server_momentum=beta, server_lr=eta)
    models, _ = run(strategy, scripted_app(), 3)
    reference = fedavgm_reference(3, beta, eta)
    for t in (1, 2, 3):
        w_ref, _ = reference[t]
        for key in ("w", "b"):
            assert models[t][key].dtype == np.float32
            np.testing.assert_allclose(models[t][key], w_ref[key], rtol=2e-6, atol=2e-6)
        # the integer buffer is the rounded example-weighted mean of the replies, untouched
        count = sum(n * int(hand_made(t, p)["count"]) for p, n in enumerate(SIZES)) / sum(SIZES)
        assert models[t]["count"] == np.rint(count)
    _, v_ref = reference[3]
    buffer = strategy.algorithm.momentum_buffer
    assert set(buffer) == {"w", "b"} and all(buffer[k].dtype == np.float64 for k in buffer)
    for key in ("w", "b"):
        np.testing.assert_allclose(buffer[key], v_ref[key], rtol=2e-6, atol=2e-6)
    # momentum moved the model off plain FedAvg's (which is the weighted average itself)
    plain = fedavgm_reference(3, 0.0, 1.0)[3][0]
    assert not np.allclose(models[3]["w"], plain["w"], atol=1e-3)


# ---------------------------------------------------------------- beta = 0
def test_beta_zero_is_plain_fedavg_bit_for_bit():
    options = {**QUIET, "min_available_nodes": 3, "server_lr": 0.7, "weighting": "uniform",
               "fraction_train": 0.7, "seed": 5}
    zero = FedAvg(**options, server_momentum=0.0)
    plain = FedAvg(**options)
    assert type(zero.algorithm) is Algorithm  # not a momentum step with beta = 0
    initial = record({"w": W0["w"]})  # adding_app's model: w + p + 1 from the w sent
    zero_models, _ = run(zero, adding_app(), 3, nodes=4, initial=initial)
    plain_models, _ = run(plain, adding_app(), 3, nodes=4, initial=initial)
    assert plain.round_log(3)[C.LOG_CLIENTS_RECEIVED] == 2
    for t in (1, 2, 3):
        assert zero_models[t]["w"].tobytes() == plain_models[t]["w"].tobytes()
    assert zero.state_dict() == plain.state_dict()
    built = build_strategy(RunConfig.from_user_config({"strategy": "fedavg"})).strategy
    assert type(built.algorithm) is Algorithm
    built = build_strategy(RunConfig.from_user_config(
        {"strategy": "fedavg", "server-momentum": 0.9})).strategy
    assert isinstance(built.algorithm, ServerMomentum)
    assert built.algorithm.server_momentum == 0.9


# ---------------------------------------------------------------- Flower's FedAvgM
@pytest.mark.parametrize("beta, eta", [(0.9, 1.0), (0.7, 0.5)])
def test_equals_flowers_fedavgm_on_the_same_replies(beta, eta):
    """Every client every round, weights by num-examples: the same models as Flower's class
    up to float rounding. Flower also starts v at the first Delta (= beta 0 + Delta)."""
    ours = FedAvg(**QUIET, min_available_nodes=3, server_momentum=beta, server_lr=eta)
    theirs = FlowerFedAvgM(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=3,
                           min_available_nodes=3, server_learning_rate=eta,
                           server_momentum=beta)
    initial = {"w": W0["w"]}  # adding_app's model; its replies depend on the model sent
    ours_models, _ = run(ours, adding_app(), 4, initial=record(initial))
    theirs_models, _ = run(theirs, adding_app(), 4, initial=record(initial))
    assert ours.round_log(4)[C.LOG_CLIENTS_RECEIVED] == 3
    for t in (1, 2, 3, 4):
        np.testing.assert_allclose(ours_models[t]["w"], theirs_models[t]["w"], rtol=1e-6)
    np.testing.assert_allclose(ours.algorithm.momentum_buffer["w"],
                               theirs.momentum_vector[0], rtol=1e-6)
    assert ours_models[4]["w"].dtype == W0["w"].dtype  # the engine keeps the model's dtype


# ---------------------------------------------------------------- the engine's options
FLEET = TraceFleet({p: DeviceProfile(speed, 8.0, 8.0)
                    for p, speed in enumerate((1.0, 0.8, 0.5, 0.3, 0.2, 0.1))})


def clocked(**kwargs) -> FedAvg:
    """Six clients on the clock; a deadline the slowest miss, two of four planned
    aggregated (over-commitment 1.0), Oort choosing."""
    return FedAvg(**QUIET, min_available_nodes=6, fraction_train=0.34, seed=2,
                  clock=SimClock(FLEET, seconds_per_example=0.01), round_deadline=1.0,
                  over_commitment=1.0, selection=OortSelection(2), **kwargs)


def six_client_app() -> ClientApp:
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({C.METRICS: MetricRecord(
            {C.PARTITION_ID: pid, C.NUM_EXAMPLES: 10 * (pid + 1)})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content[C.CONFIG][C.SERVER_ROUND])
        return Message(RecordDict({
            C.ARRAYS: record(hand_made(server_round, pid)),
            C.METRICS: MetricRecord({C.NUM_EXAMPLES: 10 * (pid + 1),
                                     C.TRAIN_LOSS: 1.0 + pid / 10})}), reply_to=msg)

    return app


def test_composes_with_clock_deadline_over_commitment_and_selection():
    """The same clients take part as in plain FedAvg (nothing they do depends on the model),
    so the momentum run is plain FedAvg's averages of the same rounds through the paper's
    step."""
    beta, eta = 0.8, 0.6
    plain, momentum = clocked(), clocked(server_momentum=beta, server_lr=eta)
    averages, _ = run(plain, six_client_app(), 4, nodes=6)  # replies independent of w
    models, _ = run(momentum, six_client_app(), 4, nodes=6)
    w, v = W0["w"].astype(np.float64), 0.0
    for t in (1, 2, 3, 4):
        v = beta * v + (w - averages[t]["w"].astype(np.float64))
        w = w - eta * v
        np.testing.assert_allclose(models[t]["w"], w, rtol=2e-6, atol=2e-6)
        plain_log, momentum_log = plain.round_log(t), momentum.round_log(t)
        for key in (C.LOG_CLIENTS_SAMPLED, C.LOG_CLIENTS_RECEIVED, C.LOG_SIM_SECONDS,
                    C.LOG_SIM_ELAPSED):
            assert momentum_log[key] == plain_log[key], (t, key)
    received = [plain.round_log(t)[C.LOG_CLIENTS_RECEIVED] for t in (1, 2, 3, 4)]
    sampled = [plain.round_log(t)[C.LOG_CLIENTS_SAMPLED] for t in (1, 2, 3, 4)]
    assert all(r < s for r, s in zip(received, sampled)), (received, sampled)


def test_a_robust_rule_takes_the_averages_place():
    beta = 0.5
    strategy = FedAvg(**QUIET, min_available_nodes=3, server_momentum=beta, robust="median")
    models, _ = run(strategy, scripted_app(), 2)
    w, v = W0["w"].astype(np.float64), 0.0
    for t in (1, 2):
        median = np.median([hand_made(t, p)["w"].astype(np.float64) for p in range(3)], axis=0)
        v = beta * v + (w - median)
        w = w - v
        np.testing.assert_allclose(models[t]["w"], w, rtol=2e-6, atol=2e-6)


# ---------------------------------------------------------------- checkpoint / resume
def test_resumed_from_a_checkpoint_file_equals_the_uninterrupted_run(tmp_path):
    def strategy():
        return clocked(server_momentum=0.9, server_lr=0.8)

    app = six_client_app()
    full_models, full = run(strategy(), app, 4, nodes=6)
    first = strategy()
    _, half = run(first, app, 2, nodes=6)
    payload = make_payload(2, half.arrays, first, [], 0.0, {"strategy": "fedavg"})
    save_checkpoint(tmp_path, payload)
    loaded = load_checkpoint(tmp_path)
    assert loaded["strategy"]["algorithm"]["momentum-buffer"]["w"].dtype == np.float64
    resumed = strategy()
    restore_strategy(resumed, loaded)
    resumed_models, _ = run(resumed, app, 4, nodes=6,
                            initial=record(loaded["arrays"]), first_round=3)
    for t in (3, 4):
        for key, value in full_models[t].items():
            assert resumed_models[t][key].tobytes() == value.tobytes(), (t, key)
    for key, value in full.arrays.items():
        assert resumed_models[4][key].tobytes() == value.numpy().tobytes()


def test_a_buffer_that_does_not_fit_is_refused_with_the_fix():
    algorithm = ServerMomentum(0.9)
    with pytest.raises(ValueError, match="float64 arrays; start the run afresh"):
        algorithm.load_state_dict({"momentum-buffer": {"w": np.zeros(3, np.float32)}})
    with pytest.raises(ValueError, match="NaN or Inf in 'w'"):
        algorithm.load_state_dict({"momentum-buffer": {"w": np.array([np.nan, 0.0, 0.0])}})
    strategy = FedAvg(**QUIET, min_available_nodes=3, server_momentum=0.9)
    strategy.load_state_dict({**strategy.state_dict(),
                              "algorithm": {"momentum-buffer": {"w": np.zeros(4),
                                                                "b": np.zeros((2, 2))}}})
    with pytest.raises(ValueError, match=r"'w' has shape \[4\], the model's is \[3\]"):
        run(strategy, scripted_app(), 1)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("beta", [1.0, 1.5, -0.1, math.nan, math.inf, True, "0.9", None])
def test_a_bad_beta_is_refused_naming_the_argument(beta):
    with pytest.raises(ValueError, match=r"FedAvg: server_momentum=.* is not a number in "
                                         r"\[0, 1\).*run config: server-momentum"):
        FedAvg(server_momentum=beta)


def test_momentum_and_another_algorithm_are_not_both_taken():
    with pytest.raises(TypeError, match="both algorithm= and server_momentum=0.9"):
        FedAvg(algorithm=Algorithm(), server_momentum=0.9)
    assert FedAvg(algorithm=Algorithm(), server_momentum=0.0).algorithm is not None
