"""Run-config ``tracking``: every round record as scalars in TensorBoard event files and an
MLflow store, read back offline (TensorBoard's EventAccumulator, MLflow's client on the
SQLite store) and compared with ``rounds.jsonl``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedapp import tracking
from fedapp.client_app import app as client_app
from fedapp.run_log import RunLog, read_rounds
from fedapp.server_app import app as server_app
from strategies import contract as C
from tests.inprocess import InProcessGrid

RECORDS = [
    {C.LOG_ROUND: 0, C.LOG_ACCURACY: 0.1, C.LOG_LOSS: 2.3, C.LOG_WALL_SECONDS: 1.5},
    {C.LOG_ROUND: 1, C.LOG_ACCURACY: 0.625, C.LOG_LOSS: 1.25, C.LOG_BYTES_UP: 123_456_789,
     C.LOG_MODEL_KEPT: False, C.LOG_LOCAL_STEPS: [5, 5, 3], C.LOG_FEDVECA_L: None,
     C.LOG_DRIFT_COSINE: {"fc.weight": 0.5, "fc.bias": -0.25},
     C.LOG_FEDVECA_REASON: {"17": "grow"}, "nested": {"a": {"b": 2}}},
]


def test_the_flattening_rule():
    assert tracking.scalars_of(RECORDS[1]) == {
        C.LOG_ACCURACY: 0.625, C.LOG_LOSS: 1.25, C.LOG_BYTES_UP: 123_456_789.0,
        C.LOG_MODEL_KEPT: 0.0, f"{C.LOG_DRIFT_COSINE}/fc.weight": 0.5,
        f"{C.LOG_DRIFT_COSINE}/fc.bias": -0.25, "nested/a/b": 2.0,
    }  # no round (the step), no list, None or string


@pytest.mark.parametrize("value, names", [
    ("", ()), ("tensorboard", ("tensorboard",)), ("mlflow", ("mlflow",)),
    (" mlflow , tensorboard,mlflow", ("mlflow", "tensorboard")),
])
def test_tracker_names(value, names):
    assert tracking.tracker_names(value) == names


@pytest.mark.parametrize("value", ["wandb", "TensorBoard", ",", "tensorboard,csv"])
def test_unknown_trackers_are_refused(value):
    with pytest.raises(ValueError, match="unknown tracker"):
        tracking.tracker_names(value)


def test_a_missing_package_names_the_extra(monkeypatch):
    tracking.check_installed("tensorboard,mlflow")  # both installed here (the dev extra)
    monkeypatch.setitem(tracking.MODULES, "mlflow", "no_such_package_for_fedhetero")
    with pytest.raises(ValueError) as info:
        tracking.check_installed("tensorboard,mlflow")
    message = str(info.value)
    assert "tracking='tensorboard,mlflow'" in message and "mlflow" in message
    assert '.[tracking]' in message and "tracking=''" in message


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def mlflow_run(store_dir, run_name: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{store_dir / tracking.MLFLOW_STORE}")
    experiment = client.get_experiment_by_name(tracking.MLFLOW_EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"attributes.run_name = '{run_name}'")
    assert len(runs) == 1
    return client, runs[0]


def expected_series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(round, value)] of the round records, by the flattening rule."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in tracking.scalars_of(record).items():
            series.setdefault(tag, []).append((record[C.LOG_ROUND], value))
    return series


def assert_tracked(run_dir, tb_dir, store_dir) -> None:
    """Both trackers hold exactly the scalars of run_dir's rounds.jsonl."""
    expected = expected_series(read_rounds(run_dir))
    assert expected
    float32 = {tag: [(s, float(np.float32(v))) for s, v in points]  # TensorBoard's precision
               for tag, points in expected.items()}
    assert tensorboard_scalars(tb_dir) == float32
    client, run = mlflow_run(store_dir, run_dir.name)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) == set(expected)
    for tag, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert history == points, tag
    config = json.loads((run_dir / "config.json").read_text())["run-config"]
    assert run.data.params == {key: str(value) for key, value in config.items()}


def test_run_log_records_go_to_both_trackers(tmp_path):
    config = {"run-config": {"strategy": "fedavg", "lr": 0.1, "tracking": "tensorboard,mlflow"}}
    log = RunLog.create(tmp_path, "fedavg", 3, config, tracking="tensorboard,mlflow")
    for record in RECORDS:
        log.append_round(record)
    log.close()
    run_dir = log.directory
    assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "mlflow.db").is_file()
    assert_tracked(run_dir, run_dir, run_dir)
    assert tensorboard_scalars(run_dir)[C.LOG_BYTES_UP] == [(1, float(np.float32(123_456_789)))]


def test_a_shared_tracking_dir_holds_every_run(tmp_path):
    shared = tmp_path / "tracking"
    logs = []
    for run_id in (1, 2):
        log = RunLog.create(tmp_path / "runs", "fedavg", run_id, {"run-config": {"seed": run_id}},
                            tracking="tensorboard,mlflow", tracking_dir=str(shared))
        log.append_round({C.LOG_ROUND: 0, C.LOG_ACCURACY: 0.5 + run_id / 10})
        log.close()
        logs.append(log)
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        [tracking.MLFLOW_STORE, *(log.directory.name for log in logs)])
    for log in logs:
        assert not list(log.directory.glob("events.out.tfevents.*"))
        assert_tracked(log.directory, shared / log.directory.name, shared)


def test_tracking_off_writes_nothing_extra(tmp_path):
    log = RunLog.create(tmp_path, "fedavg", 1, {"run-config": {}})
    log.append_round(RECORDS[0])
    log.close()
    assert sorted(p.name for p in log.directory.iterdir()) == ["config.json", "rounds.jsonl",
                                                                "server.pid"]


@pytest.mark.usefixtures("processes")
def test_the_serverapp_tracks_every_round_it_logs(tmp_path):
    """The real ServerApp and ClientApp (in-process Grid) with both trackers."""
    run_config = {"num-server-rounds": 2, "local-steps": 2, "partition": "iid",
                  "model": "mlp-2nn", "output-dir": str(tmp_path),
                  "tracking": "tensorboard,mlflow"}
    grid = InProcessGrid(client_app, 2, run_config)
    server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(run_config)))
    (run_dir,) = tmp_path.iterdir()
    records = read_rounds(run_dir)
    assert [r[C.LOG_ROUND] for r in records] == [0, 1, 2]
    assert any("/" in tag for tag in tracking.scalars_of(records[1]))  # drift per layer
    assert_tracked(run_dir, run_dir, run_dir)


@pytest.mark.usefixtures("apps")
def test_the_serverapp_stops_before_training_when_a_tracker_is_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking.MODULES, "tensorboard", "no_such_package_for_fedhetero")
    run_config = {"num-server-rounds": 1, "output-dir": str(tmp_path), "tracking": "tensorboard"}
    grid = InProcessGrid(client_app, 2, run_config)
    with pytest.raises(RuntimeError, match=r"fedhetero stopped before training: .*\.\[tracking\]"):
        server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                                 run_config=dict(run_config)))
    assert not grid.calls and not list(tmp_path.iterdir())
