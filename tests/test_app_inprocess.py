"""The whole app in one process: ServerApp main + ClientApp through an in-process Grid."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import Context, RecordDict

from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from strategies import contract as C
from tests.inprocess import InProcessGrid

CNN_SMALL_LAYERS = {"features.0.0", "features.1.0", "classifier.1", "classifier.3", "classifier.5"}


def run_server(run_config: dict, num_nodes: int = 3) -> InProcessGrid:
    grid = InProcessGrid(client_app, num_nodes, run_config)
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(run_config))
    server_app(grid, context)
    return grid


def only_run_dir(output_dir):
    runs = list(output_dir.iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.usefixtures("processes")
def test_two_rounds_write_the_run_log(tmp_path):
    rc = {"num-server-rounds": 2, "local-steps": 5, "partition": "iid", "output-dir": str(tmp_path)}
    grid = run_server(rc)
    run_dir = only_run_dir(tmp_path)
    rounds = read_rounds(run_dir)
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert r[C.LOG_CLIENTS_SAMPLED] == 3 and r[C.LOG_CLIENTS_FAILED] == 0
        assert r[C.LOG_BYTES_UP] > 0 and r[C.LOG_BYTES_DOWN] == r[C.LOG_BYTES_UP]
        assert 0.0 <= r[C.LOG_ACCURACY] <= 1.0 and r[C.LOG_TRAIN_LOSS] > 0
        assert -1.0 <= r[C.LOG_DRIFT_COSINE_MEAN] <= 1.0 and r[C.LOG_UPDATE_NORM_MEAN] > 0
        assert set(r[C.LOG_DRIFT_COSINE]) == CNN_SMALL_LAYERS
    assert rounds[2][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run-config"]["num-server-rounds"] == 2
    state = torch.load(run_dir / "final_model.pt")
    assert set(state) and all(torch.isfinite(v).all() for v in state.values())
    partitions = json.loads((run_dir / "partitions.json").read_text())
    assert sorted(partitions) == ["0", "1", "2"] and sum(map(sum, partitions.values())) == 60000
    assert (run_dir / "label_distribution.png").stat().st_size > 1000
    # one client-info query per node, then 3 train messages per round
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("query") == 3 and kinds.count("train") == 6


@pytest.mark.usefixtures("processes")
def test_partial_participation_samples_by_partition(tmp_path):
    rc = {"num-server-rounds": 2, "local-steps": 2, "partition": "iid", "fraction-train": 0.5,
          "output-dir": str(tmp_path)}
    first = run_server(rc, num_nodes=4)
    second = run_server({**rc, "output-dir": str(tmp_path / "again")}, num_nodes=4)
    def sampled(grid):
        pid = {node: ctx.node_config["partition-id"] for node, ctx in grid.contexts.items()}
        return [pid[node] for node, kind in grid.calls if kind == "train"]
    assert len(sampled(first)) == 4  # 2 of 4 per round
    assert sampled(first) == sampled(second)


@pytest.mark.parametrize(
    "key,value,strategy",
    [("dirichlet-alpha", 0.0, "fedavg"), ("fraction-train", 1.5, "fedavg"),
     ("batch-size", 0, "fedavg"), ("model", "vgg99", "fedavg"), ("dataset", "imagenet", "fedavg"),
     ("partition", "zipf", "fedavg"), ("strategy", "fedfoo", "fedfoo"), ("seed", -1, "fedavg"),
     ("fedveca-tau-init", 1, "fedveca"),
     ("server-lr", 0.5, "dynamicfl"), ("dynamicfl-intervals", "g-a", "dynamicfl")],
)
@pytest.mark.usefixtures("apps")
def test_bad_config_stops_before_any_training(tmp_path, key, value, strategy):
    rc = {"num-server-rounds": 1, "output-dir": str(tmp_path), "strategy": strategy, key: value}
    grid = InProcessGrid(client_app, 2, rc)
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(RuntimeError) as info:
        server_app(grid, context)
    assert key in str(info.value) and repr(value) in str(info.value)
    assert "--run-config" in str(info.value)
    assert grid.calls == []
    assert list(tmp_path.iterdir()) == []  # no run directory either


@pytest.mark.usefixtures("processes")
def test_missing_data_stops_before_any_training(tmp_path):
    """The evaluation process finds no test split: the ServerApp stops with the data error
    (and where the data must be) before any client is asked to train."""
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = {"num-server-rounds": 1, "output-dir": str(tmp_path / "out"), "dataset": "mnist",
          "data-dir": str(empty), "allow-download": False}
    grid = InProcessGrid(client_app, 2, rc)
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(RuntimeError, match=r"mnist not found under .*docs/deployment\.md"):
        server_app(grid, context)
    assert grid.calls == []


@pytest.mark.usefixtures("processes")
def test_fedprox_with_mu_zero_equals_fedavg_end_to_end(tmp_path):
    base = {"num-server-rounds": 2, "local-steps": 4, "partition": "dirichlet", "batch-size": 16}
    run_server({**base, "strategy": "fedavg", "output-dir": str(tmp_path / "avg")})
    run_server({**base, "strategy": "fedprox", "proximal-mu": 0.0,
                "output-dir": str(tmp_path / "prox")})
    avg = torch.load(only_run_dir(tmp_path / "avg") / "final_model.pt")
    prox = torch.load(only_run_dir(tmp_path / "prox") / "final_model.pt")
    assert all(torch.equal(avg[k], prox[k]) for k in avg)


@pytest.mark.parametrize("strategy", ["fedprox", "fednova"])
@pytest.mark.usefixtures("processes")
def test_stragglers_do_partial_work(tmp_path, strategy):
    rc = {"num-server-rounds": 2, "strategy": strategy, "straggler-fraction": 0.5,
          "local-epochs": 1, "batch-size": 512, "partition": "iid", "model": "mlp-2nn",
          "output-dir": str(tmp_path)}  # the steps are what is checked: the cheapest model
    run_server(rc, num_nodes=4)
    rounds = read_rounds(only_run_dir(tmp_path))[1:]
    full = 60000 // 4 // 512  # floor(E n_i / B) for the non-stragglers
    for r in rounds:
        assert r[C.LOG_CLIENTS_STRAGGLERS] == 2 and r[C.LOG_CLIENTS_DROPPED] == 0
        assert r[C.LOG_CLIENTS_RECEIVED] == 4
        assert sorted(r[C.LOG_LOCAL_STEPS])[2:] == [full, full]
        assert all(1 <= s <= full for s in r[C.LOG_LOCAL_STEPS])
    if strategy == "fednova":
        assert all(r[C.LOG_A_NORMS] == [float(s) for s in r[C.LOG_LOCAL_STEPS]] for r in rounds)


@pytest.mark.usefixtures("processes")
def test_fedavg_drops_stragglers(tmp_path):
    rc = {"num-server-rounds": 1, "strategy": "fedavg", "straggler-fraction": 0.5, "local-steps": 2,
          "partition": "iid", "output-dir": str(tmp_path)}
    grid = run_server(rc, num_nodes=4)
    record = read_rounds(only_run_dir(tmp_path))[1]
    assert record[C.LOG_CLIENTS_DROPPED] == 2 and record[C.LOG_CLIENTS_RECEIVED] == 2
    assert [kind for _, kind in grid.calls].count("train") == 2


@pytest.mark.usefixtures("processes")
def test_epoch_granular_stragglers_do_whole_epochs(tmp_path):
    rc = {"num-server-rounds": 1, "strategy": "fednova", "straggler-fraction": 0.5,
          "straggler-unit": "epochs", "local-epochs": 2, "batch-size": 1000, "partition": "iid",
          "output-dir": str(tmp_path)}
    run_server(rc, num_nodes=4)
    record = read_rounds(only_run_dir(tmp_path))[1]
    one_epoch = 15000 // 1000
    assert sorted(record[C.LOG_LOCAL_STEPS])[2:] == [2 * one_epoch, 2 * one_epoch]
    assert all(s in (one_epoch, 2 * one_epoch) for s in record[C.LOG_LOCAL_STEPS])


@pytest.mark.usefixtures("processes")
def test_fedasync_mixes_the_asked_number_of_updates_per_round(tmp_path, caplog):
    rc = {"num-server-rounds": 3, "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid",
          "local-steps": 5, "batch-size": 10, "eval-batch-size": 2000, "seed": 1,
          "min-available-nodes": 4, "strategy": "fedasync", "async-concurrency": 3,
          "fedasync-updates-per-round": 3, "device-profiles": "lognormal",
          "drift-diagnostics": False, "output-dir": str(tmp_path)}
    with caplog.at_level("INFO"):
        run_server(rc, num_nodes=4)
    rounds = read_rounds(only_run_dir(tmp_path))
    assert [r[C.LOG_CLIENT_UPDATES] for r in rounds[1:]] == [3, 6, 9]
    assert [r[C.LOG_MODEL_VERSION] for r in rounds[1:]] == [3, 6, 9]
    assert "FedAsync" in caplog.text
