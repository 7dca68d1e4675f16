"""Bad input at the edges: corrupt / truncated dataset files, an empty partition, a
partition smaller than the batch size."""

from __future__ import annotations

import dataclasses
import gzip
import struct

import numpy as np
import pytest
import torch

import fedapp.client_app
import task.data
from simulation.reliability import run_inprocess
from strategies import contract as C
from task.data import IDX_FILES, load_dataset, read_idx
from tests.reliability_common import config, run, warnings_of


def write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def idx_folder(folder, n=20):
    rng = np.random.default_rng(0)
    for key, stem in IDX_FILES.items():
        shape = (n, 28, 28) if key.startswith("x") else (n,)
        write_idx(folder / stem, rng.integers(0, 10 if key.startswith("y") else 255, shape))
    return folder


def test_truncated_idx_names_the_file_and_the_fix(tmp_path):
    folder = idx_folder(tmp_path)
    path = folder / IDX_FILES["x_train"]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=f"{path}.*truncated or corrupt"):
        read_idx(path)


def test_corrupt_gzip_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + b"\x00" * 50)[:-12])
    with pytest.raises(
        ValueError, match=f"{path} cannot be read, it is corrupt or truncated.*re-download"
    ):
        read_idx(path)


def test_not_an_idx_file(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ValueError, match="is not an unsigned-byte IDX file"):
        read_idx(path)


@pytest.mark.usefixtures("processes")
def test_truncated_dataset_stops_the_run_before_training_with_one_clear_error(tmp_path):
    folder = idx_folder(tmp_path / "data", 20) if (tmp_path / "data").mkdir() is None else None
    labels = folder / IDX_FILES["y_test"]
    labels.write_bytes(labels.read_bytes()[:-3])
    task.data.load_dataset.cache_clear()
    try:
        rc = {
            "num-server-rounds": 1,
            "dataset": "fashion-mnist",
            "data-dir": str(folder),
            "allow-download": False,
            "output-dir": str(tmp_path / "out"),
        }
        with pytest.raises(RuntimeError, match=f"{labels} is truncated or corrupt"):
            run_inprocess(rc, 2)
    finally:
        task.data.load_dataset.cache_clear()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("strategy", ["fedavg", "fednova", "fedveca", "dynamicfl"])
@pytest.mark.usefixtures("processes")
def test_empty_partition_reports_zero_and_is_skipped(strategy, tmp_path, monkeypatch, caplog):
    real = fedapp.client_app.load_partition

    def with_empty_partition(source, spec, partition_id, num_partitions, cache_dir=""):
        part = real(source, spec, partition_id, num_partitions, cache_dir)
        return dataclasses.replace(part, x=part.x[:0], y=part.y[:0]) if partition_id == 1 else part

    monkeypatch.setattr(fedapp.client_app, "load_partition", with_empty_partition)
    fedapp.client_app.clear_caches()
    try:
        grid, _, rounds, final = run(strategy, tmp_path, 3, **{"num-server-rounds": 2})
    finally:
        fedapp.client_app.clear_caches()
    assert all(r[C.LOG_CLIENTS_FAILED] == 1 and r[C.LOG_MODEL_KEPT] is False for r in rounds[1:])
    node = next(n for n, c in grid.contexts.items() if c.node_config["partition-id"] == 1)
    skipped = [m for m in warnings_of(caplog) if f"{node}" in m and "empty partition" in m]
    assert len(skipped) == 2
    assert all(torch.isfinite(v).all() for v in final.values())


@pytest.mark.parametrize("strategy", ["fedavg", "fednova", "fedveca"])
@pytest.mark.usefixtures("processes")
def test_partition_smaller_than_the_batch_trains_on_its_full_batch(strategy, tmp_path):
    data = load_dataset("synthetic")
    assert len(data.y_train) // 3 < 100000
    _, _, rounds, _ = run(
        strategy, tmp_path, 3, **{"num-server-rounds": 1, "batch-size": 100000, "local-steps": 2}
    )
    assert rounds[1][C.LOG_CLIENTS_FAILED] == 0 and rounds[1][C.LOG_MODEL_KEPT] is False
    assert rounds[1]["loss"] < rounds[0]["loss"]
    assert config(strategy, tmp_path)["batch-size"] == 10  # the base config is untouched
