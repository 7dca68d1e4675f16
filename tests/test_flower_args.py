"""Drop-in parity with Flower's FedAvg constructor (strategies/engine/flower_args.py).

Every fedhetero strategy takes Flower's ten FedAvg arguments, positional in Flower's order,
with Flower's meaning; a user's ServerApp that builds ``flwr.serverapp.strategy.FedAvg(...)``
runs unchanged with ``from strategies import FedAvg``.
"""

from __future__ import annotations

import inspect
import json
import logging

import pytest
from flwr.app import Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
from flwr.supercore.task_identity import TaskIdentity

import strategies
from strategies import (
    DynamicFL,
    FedAsync,
    FedAvg,
    FedBuff,
    FedDyn,
    FedNova,
    FedProx,
    FedVeca,
    Moon,
    Scaffold,
)
from strategies import contract as C
from strategies.engine import flower_args, trust_gate
from strategies.engine.participation import Participation
from tests import user_project
from tests.test_trust_gate import evaluate_reply

SYNC = [FedAvg, FedProx, FedNova, Scaffold, FedDyn, Moon, FedVeca, DynamicFL]
ASYNC = [FedBuff, FedAsync]
OWN_ARGS = {DynamicFL: {"intervals": "a", "local_steps": 2}}


def test_the_ten_arguments_are_flowers_in_flowers_order():
    flower = list(inspect.signature(FlowerFedAvg.__init__).parameters)[1:]
    assert tuple(flower) == flower_args.FLOWER_ARGS
    for cls in (FedAvg, DynamicFL, strategies.engine.async_engine.AsyncEngine):
        ours = list(inspect.signature(cls.__init__).parameters)[1:11]
        assert tuple(ours) == flower_args.FLOWER_ARGS, cls.__name__


@pytest.mark.parametrize("cls", SYNC + ASYNC, ids=lambda c: c.__name__)
def test_every_strategy_takes_flowers_arguments_by_position(cls):
    fraction, min_train = (1.0, 1) if cls in ASYNC else (0.5, 3)
    s = cls(fraction, 0.25, min_train, 2, 4, "num-examples", "arrays", "config", None, None,
            **OWN_ARGS.get(cls, {}))
    assert (s.fraction_train, s.fraction_evaluate, s.min_train_nodes, s.min_evaluate_nodes,
            s.min_available_nodes) == (fraction, 0.25, min_train, 2, 4)
    assert s.participation.min_available_nodes == 4
    keyword = cls(fraction_train=fraction, fraction_evaluate=0.25, min_train_nodes=min_train,
                  min_evaluate_nodes=2, min_available_nodes=4, **OWN_ARGS.get(cls, {}))
    assert keyword.min_train_nodes == s.min_train_nodes


@pytest.mark.parametrize("cls", SYNC + ASYNC, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name, value", [("weighted_by_key", "n"), ("arrayrecord_key", "model"),
                                         ("configrecord_key", "cfg")])
def test_other_record_names_are_refused_naming_the_argument_and_the_fix(cls, name, value):
    with pytest.raises(ValueError, match=rf"{name}='{value}' is not supported.*leave {name}"):
        cls(**{name: value}, **OWN_ARGS.get(cls, {}))


def test_a_metrics_function_that_is_not_callable_is_refused():
    with pytest.raises(ValueError, match="train_metrics_aggr_fn must be a function"):
        FedAvg(train_metrics_aggr_fn="mean")


def test_fedprox_takes_mu_after_the_ten_as_flowers_fedprox_does():
    ten = [1.0, 1.0, 1, 1, 2, "num-examples", "arrays", "config", None, None]
    assert list(inspect.signature(FlowerFedProx.__init__).parameters)[11] == "proximal_mu"
    assert FedProx(*ten, 0.3).algorithm.proximal_mu == 0.3
    assert FedProx().algorithm.proximal_mu == 0.01
    with pytest.raises(TypeError, match="both by position and by name"):
        FedProx(*ten, 0.3, proximal_mu=0.2)


def test_asynchronous_strategies_name_concurrency_when_asked_to_sample_a_fraction():
    with pytest.raises(ValueError, match="set concurrency instead"):
        FedBuff(0.5)


def test_min_train_nodes_raises_m_to_at_least_that_many_online_clients():
    nodes = list(range(10))
    assert Participation(fraction_train=0.1).online_nodes(1, nodes) == (nodes, None)  # m = 1
    assert Participation(fraction_train=0.1, min_train_nodes=3).online_nodes(1, nodes)[1] == 3
    assert Participation(fraction_train=0.5, min_train_nodes=3).online_nodes(1, nodes)[1] == 5
    assert Participation(fraction_train=0.1, min_train_nodes=30).online_nodes(1, nodes)[1] == 10


def test_flower_server_optimisers_are_exported_by_name():
    from flwr.serverapp import strategy as flower
    for name in ("FedAdam", "FedYogi", "FedAdagrad", "FedAvgM"):
        assert issubclass(getattr(strategies, name), getattr(flower, name))


def _evaluate_reply(node: int, n: int, acc: float) -> Message:
    return evaluate_reply(node, **{C.NUM_EXAMPLES: n, "acc": acc})


def test_evaluate_metrics_function_gets_flowers_arguments_after_the_trust_gate(caplog):
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    seen = []

    def mine(records, key):
        seen.append((len(records), key))
        return MetricRecord({"replies": float(len(records))})

    replies = [_evaluate_reply(1, 10, 0.5), _evaluate_reply(2, 30, 0.9),
               _evaluate_reply(3, 0, 0.7)]  # num-examples 0: refused by the gate
    with caplog.at_level(logging.INFO):
        out = trust_gate.aggregate_evaluate(replies, {}, mine)
    assert seen == [(2, "num-examples")] and out == MetricRecord({"replies": 2.0})
    default = trust_gate.aggregate_evaluate(replies[:2], {})
    flower = aggregate_metricrecords([r.content for r in replies[:2]], "num-examples")
    assert default["acc"] == pytest.approx(flower["acc"])
    assert "aggregate_evaluate: Received 3 results and 0 failures" in caplog.text


def test_a_metrics_function_that_returns_no_record_is_named():
    with pytest.raises(TypeError, match="returned dict, not a MetricRecord"):
        flower_args.flower_metrics(lambda records, key: {"x": 1.0}, [RecordDict()])


# ------------------------------------------------------------- in a user's Flower project
DROP_IN_MAIN = '''
from flwr.serverapp.strategy import FedAvg  # DROP-IN LINE


def user_train_metrics(records, weighting_key):
    total = sum(r["metrics"][weighting_key] for r in records)
    return MetricRecord({"clients": float(len(records)), "examples": float(total)})


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    strategy = FedAvg(0.67, 1.0, 2, 2, 3, "num-examples", "arrays", "config",
                      user_train_metrics)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": cfg["lr"], "batch-size": cfg["batch-size"],
                                   "local-epochs": cfg["local-epochs"]}),
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=central_evaluate,
    )
    print("RESULT " + json.dumps({
        "train": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
        "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}}))
'''


def _run_drop_in(tmp_path, import_line: str) -> tuple[dict, dict]:
    main = DROP_IN_MAIN.replace("from flwr.serverapp.strategy import FedAvg  # DROP-IN LINE",
                                import_line)
    project = user_project.build(tmp_path / "userproj", train=user_project.CLIENT_SECTIONS["train"],
                                 query="", server_main=main)
    summary = user_project.run_inprocess(project, {"num-server-rounds": 2,
                                                   "query-client-info": False},
                                         num_nodes=3)  # the ServerApp waits for 3
    line = next(x for x in summary["output"].splitlines() if x.startswith("RESULT "))
    return summary, json.loads(line[len("RESULT "):])


@pytest.mark.usefixtures("processes")
def test_a_users_flower_fedavg_swapped_for_ours_with_the_same_arguments(tmp_path):
    """The ServerApp builds Flower's FedAvg with all ten arguments by position; only the
    import changes. Both sample 2 of 3 nodes (min_train_nodes 2), call the user's metrics
    function, log Flower's aggregate_train line and learn."""
    runs = {}
    for name, line in (("flower", "from flwr.serverapp.strategy import FedAvg"),
                       ("fedhetero", "from strategies import FedAvg")):
        runs[name] = _run_drop_in(tmp_path / name, line)
    for name, (summary, result) in runs.items():
        output = summary["output"]
        assert "Traceback" not in output, output[-4000:]
        assert output.count("aggregate_train: Received 2 results and 0 failures") == 2, name
        assert {r: m["clients"] for r, m in result["train"].items()} == {"1": 2.0, "2": 2.0}
        assert sorted(result["evaluate"]) == ["1", "2"]
        assert summary["calls"].count("train") == 4 and summary["calls"].count("evaluate") == 6
        history = summary["history"]
        assert history[-1]["loss"] < history[0]["loss"], (name, history)
