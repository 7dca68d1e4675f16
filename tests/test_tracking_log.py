"""Each tracking backend says in one INFO line where it writes."""

from __future__ import annotations

import logging

import pytest

from fedapp.run_log import RunLog

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


def test_each_tracker_logs_where_it_writes(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        log = RunLog.create(tmp_path, "fedavg", 1, {"run-config": {}},
                            tracking="tensorboard,mlflow")
        log.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Tracking:")]
    assert len(lines) == 2
    assert lines[0] == (f"Tracking: TensorBoard event files in {log.directory} "
                        f"(tensorboard --logdir {log.directory})")
    store = f"sqlite:///{(log.directory / 'mlflow.db').resolve()}"
    assert lines[1].startswith(f"Tracking: MLflow run '{log.directory.name}' (experiment "
                               f"fedhetero) in {store}")
