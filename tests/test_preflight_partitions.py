"""The partitions of a run are split in the driver before anything starts, as every
ClientApp splits them but from the training labels alone (simulation/preflight.py): a
split the partitioner cannot make and a batch size larger than every partition are one
error naming the keys and the fix; a batch size larger than some partitions one warning."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

import fedapp.client_app as client_app
from fedapp.registry import check_run_config
from simulation.preflight import (PreflightError, batch_size_warnings, check_before_start,
                                  data_source, partition_sizes)
from task.data import DataSource, synthetic_dataset, train_labels
from tests.test_data import IDX_FILES, write_tiny_fashion_mnist


def sizes_of(config: dict, folder, partitions: int) -> list[int] | None:
    cfg = check_run_config({"data-dir": str(folder), "allow-download": False, **config})
    return partition_sizes(cfg, data_source(cfg, cfg.data_dir), partitions)


@pytest.mark.parametrize("config", [
    {"partition": "iid"},
    {"partition": "dirichlet", "dirichlet-alpha": 0.3, "min-partition-size": 2, "seed": 3},
    {"partition": "classes", "classes-per-partition": 2},
    {"partition": "shards", "shards-per-partition": 2, "partition-seed": 7},
    {"partition": "quantity-skew", "quantity-sigma": 1.0},
])
def test_the_sizes_are_the_clientapps_partitions(tmp_path, config):
    """The ClientApp's own path (node_partition: its spec, its data source, the node cache)."""
    write_tiny_fashion_mnist(tmp_path / "data", n_train=300)
    sizes = sizes_of(config, tmp_path / "data", 5)
    run_config = {"data-dir": str(tmp_path / "data"), "allow-download": False, **config}
    clientapps = []
    for pid in range(5):
        ctx = Context(run_id=1, node_id=pid, state=RecordDict(), run_config=run_config,
                      node_config={"partition-id": pid, "num-partitions": 5,
                                   "data-cache-dir": str(tmp_path / "cache")})
        clientapps.append(len(client_app.node_partition(ctx)[0].y))
    assert sizes == clientapps and sum(sizes) == 300


def test_the_labels_are_read_without_the_images(tmp_path):
    """A training-image file that cannot be decoded does not matter: only labels are read."""
    arrays = write_tiny_fashion_mnist(tmp_path / "data", n_train=50)
    (tmp_path / "data" / f"{IDX_FILES['x_train']}.gz").write_bytes(b"not an IDX file")
    labels, natural = train_labels(DataSource(data_dir=str(tmp_path / "data")))
    assert labels.dtype == np.int64 and natural is None
    assert np.array_equal(labels, arrays["y_train"])


def test_synthetic_labels_and_groups_are_the_loaded_datasets():
    labels, natural = train_labels(DataSource(name="synthetic", synthetic_alpha=0.5))
    loaded = synthetic_dataset(0.5, 1.0)
    assert np.array_equal(labels, loaded.y_train.numpy())
    assert np.array_equal(natural, loaded.natural_ids)


def test_an_impossible_dirichlet_split_names_the_partition_keys(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=200)
    with pytest.raises(PreflightError) as info:
        sizes_of({"partition": "dirichlet", "dirichlet-alpha": 0.05, "min-partition-size": 15},
                 tmp_path / "data", 12)
    message = str(info.value)
    assert message.startswith(
        "partition='dirichlet', dirichlet-alpha=0.05, min-partition-size=15 cannot split the "
        "200 training examples of fashion-mnist into 12 partitions (one per SuperNode, "
        "--num-supernodes 12): min_size=15 could not be met")
    assert "Every ClientApp would fail on it" in message
    assert ("Fix: raise -c dirichlet-alpha (less skew), lower -c min-partition-size (0 allows "
            "empty partitions") in message and "(--num-supernodes)" in message


def test_more_minimum_examples_than_the_data_has_is_refused_at_once(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=100)
    with pytest.raises(PreflightError, match=r"min-partition-size=20 cannot split the 100 "
                                             r"training examples .* \(100 / 10 = 10\), got 20"):
        sizes_of({"partition": "dirichlet", "min-partition-size": 20}, tmp_path / "data", 10)


def test_a_split_of_other_schemes_names_their_keys(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=100)
    with pytest.raises(PreflightError) as info:
        sizes_of({"partition": "classes", "classes-per-partition": 11}, tmp_path / "data", 4)
    assert str(info.value).startswith("partition='classes', classes-per-partition=11 cannot "
                                      "split the 100 training examples")
    assert "Fix: change -c partition or -c classes-per-partition" in str(info.value)


def test_a_batch_size_larger_than_every_partition_is_an_error(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=100)
    config = {"data-dir": str(tmp_path / "data"), "allow-download": False, "partition": "iid"}
    with pytest.raises(PreflightError) as info:
        check_before_start({**config, "batch-size": 30}, 4)
    assert str(info.value) == (
        "batch-size=30 is larger than every partition: the largest of the 4 partitions "
        "(partition='iid', one per SuperNode) holds 25 training examples, so every client "
        "would train on fewer than 30 examples per step. Fix: -c batch-size=25 (or smaller), "
        "-c full-batch=true to train on whole partitions, or fewer SuperNodes "
        "(--num-supernodes)")
    assert check_before_start({**config, "batch-size": 25}, 4) == []
    # full batches on purpose: B is not used
    assert check_before_start({**config, "batch-size": 30, "full-batch": True}, 4) == []
    assert check_before_start({**config, "batch-size": 30, "strategy": "fedsgd"}, 4) == []


def test_a_batch_size_larger_than_some_partitions_is_one_warning():
    cfg = check_run_config({"partition": "dirichlet"})
    warnings = batch_size_warnings(cfg, 32, [100, 31, 5, 0, 32, 64])
    assert warnings == [
        "batch-size=32 is larger than 2 of the 6 partitions (the smallest holds 5 training "
        "examples): those clients train on batches of all their examples, fewer than 32; 1 "
        "partition(s) are empty (their clients send no update)"]
    assert batch_size_warnings(cfg, 5, [100, 31, 5, 0]) == []
    assert batch_size_warnings(cfg, 0, [1, 2]) == []  # full batch


def test_the_warning_is_printed_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    from simulation import __main__ as simulation_cli
    from simulation import run as run_tool

    started = []
    monkeypatch.setattr(run_tool, "run_app", lambda *a, **k: started.append(a) or 1 / 0)
    write_tiny_fashion_mnist(tmp_path / "data", n_train=200)
    with pytest.raises(ZeroDivisionError):
        simulation_cli.main(["run", "--num-supernodes", "4", "-c", f"data-dir='{tmp_path}/data'",
                             "-c", "allow-download=false", "-c", "batch-size=40",
                             "-c", "partition='quantity-skew'", "-c", "quantity-sigma=1.0"])
    err = capsys.readouterr().err  # sizes 45, 35, 76, 44
    assert err.count("warning: batch-size=40 is larger than 1 of the 4 partitions (the "
                     "smallest holds 35 training examples)") == 1
    assert len(started) == 1


@pytest.mark.parametrize("config", [{"partition": "dirichlet", "dirichlet-alpha": 0.1},
                                    {"partition": "iid"}])
def test_more_supernodes_than_examples_is_fixed_by_fewer_supernodes_only(tmp_path, config):
    """--num-supernodes 70000 of Fashion-MNIST's 60,000 (here 120 of 100): raising
    dirichlet-alpha cannot help, so it is not offered (#58)."""
    write_tiny_fashion_mnist(tmp_path / "data", n_train=100)
    with pytest.raises(PreflightError) as info:
        sizes_of({**config, "min-partition-size": 0}, tmp_path / "data", 120)
    message = str(info.value)
    assert message.endswith("Fix: run at most 100 SuperNodes (--num-supernodes 100): each "
                            "partition needs an example of its own, whatever the partition keys")
    assert "dirichlet-alpha (less skew)" not in message
