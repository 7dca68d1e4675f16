"""The validation split for tuning (run-config ``evaluation-split = "validation"``): a fixed,
label-stratified share of the training set held out before partitioning (task.data), the
same wherever client data is computed (in memory, the node cache, the preflight), the same
for every seed, and what the ServerApp evaluates on instead of the test split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedapp import client_app
from fedapp.config import ConfigError
from fedapp.registry import check_run_config
from fedapp.run_log import read_rounds
from simulation.preflight import PreflightError, data_source, partition_sizes
from strategies import contract as C
from task.cache import ArrayCache
from task.data import (MIN_VALIDATION_EXAMPLES, DataSource, PartitionSpec, client_data,
                       load_dataset, source_files, train_labels, training_rows,
                       validation_indices)
from task.models import build_model
from task.node_data import cached_entries
from tests.test_data import write_tiny_fashion_mnist
from tests.test_data_cache import fresh_caches  # noqa: F401 - autouse: empty caches per test

N_TRAIN = 1000  # tiny Fashion-MNIST: labels 0..9 in turn, 100 each


@pytest.fixture
def tiny(tmp_path):
    """(the data folder, its arrays) of a tiny Fashion-MNIST with N_TRAIN training images."""
    folder = tmp_path / "data"
    return folder, write_tiny_fashion_mnist(folder, n_train=N_TRAIN, n_test=50)


def config(folder, **keys) -> dict:
    return {"data-dir": str(folder), "allow-download": False,
            "evaluation-split": "validation", **keys}


def node_context(run_config: dict, pid: int, partitions: int, cache) -> Context:
    return Context(run_id=1, node_id=pid, state=RecordDict(), run_config=run_config,
                   node_config={"partition-id": pid, "num-partitions": partitions,
                                "data-cache-dir": str(cache)})


# ----------------------------------------------------------------- the held-out rows
def test_the_held_out_rows_are_stratified_by_label():
    labels = np.repeat(np.arange(4), [1000, 500, 45, 1])
    held = validation_indices(labels, 0.1)
    assert held.dtype == np.int64 and np.all(np.diff(held) > 0)
    # round(0.1 n_c) per label; a label of one example keeps it for training
    assert np.bincount(labels[held], minlength=4).tolist() == [100, 50, 5, 0]
    assert np.array_equal(training_rows(labels, 0.1), np.setdiff1d(np.arange(1546), held))


def test_the_held_out_rows_depend_on_the_labels_and_fraction_alone():
    labels = np.random.default_rng(5).integers(0, 10, 5000)
    held = validation_indices(labels, 0.2)
    assert np.array_equal(held, validation_indices(labels.copy(), 0.2))
    np.random.seed(99)  # no global random state is read
    torch.manual_seed(99)
    assert np.array_equal(held, validation_indices(labels, 0.2))
    assert not np.array_equal(held[:100], validation_indices(labels, 0.1)[:100])


def test_every_seed_holds_out_the_same_examples_and_partitions_the_rest(tiny, tmp_path):
    folder, arrays = tiny
    held = validation_indices(arrays["y_train"], 0.1)
    seen = []
    for seed, partition_seed in ((0, -1), (1, -1), (7, 3)):
        cfg = check_run_config(config(folder, seed=seed, **{"partition-seed": partition_seed}))
        loaded = cfg.data_source(cfg.data_dir).load()
        seen.append(loaded.x_validation)
        assert torch.equal(loaded.y_validation, torch.from_numpy(arrays["y_train"][held]).long())
        assert len(loaded.y_train) == N_TRAIN - len(held) == 900
    assert all(torch.equal(x, seen[0]) for x in seen[1:])


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_no_client_partition_holds_a_held_out_example(tiny, tmp_path, scheme):
    """The node cache's partition rows (rows of the whole training file) cover exactly the
    rows the clients train on; the ClientApp's partitions have the in-memory bytes."""
    folder, arrays = tiny
    source = DataSource("fashion-mnist", str(folder), False, validation_fraction=0.1)
    spec = PartitionSpec(scheme, seed=3, min_size=1)
    _, index = cached_entries(ArrayCache(tmp_path / "cache"), source,
                              source_files(source), spec, 4)
    rows = np.asarray(index.arrays["indices"])
    held = validation_indices(arrays["y_train"], 0.1)
    assert len(np.intersect1d(rows, held)) == 0 and len(np.unique(rows)) == len(rows)
    assert np.array_equal(np.sort(rows), training_rows(arrays["y_train"], 0.1))
    reduced = source.load()
    run_config = config(folder, partition=scheme, **{"partition-seed": 3,
                                                     "min-partition-size": 1})
    for pid in range(4):
        part, _ = client_app.node_partition(node_context(run_config, pid, 4, tmp_path / "cache"))
        x, y = client_data(reduced, spec, pid, 4)
        assert part.x.tobytes() == x.numpy().tobytes() and np.array_equal(part.y, y.numpy())


def test_the_validation_examples_are_training_images_never_test_images(tiny):
    folder, arrays = tiny
    full = load_dataset("fashion-mnist", str(folder), False)
    held = validation_indices(arrays["y_train"], 0.1)
    carved = load_dataset("fashion-mnist", str(folder), False, validation_fraction=0.1)
    assert torch.equal(carved.x_validation, full.x_train[torch.from_numpy(held)])
    assert torch.equal(carved.x_test, full.x_test) and torch.equal(carved.y_test, full.y_test)
    test_images = {image.tobytes() for image in arrays["x_test"]}
    assert not any(arrays["x_train"][row].tobytes() in test_images for row in held)
    server = load_dataset("fashion-mnist", str(folder), False, with_train=False,
                          validation_fraction=0.1)  # what the evaluation process loads
    assert len(server.y_train) == 0 and torch.equal(server.x_validation, carved.x_validation)


def test_the_preflight_counts_the_clients_partitions(tiny, tmp_path):
    folder, arrays = tiny
    cfg = check_run_config(config(folder, partition="iid"))
    labels, _ = train_labels(data_source(cfg, cfg.data_dir))
    assert np.array_equal(labels, arrays["y_train"][training_rows(arrays["y_train"], 0.1)])
    sizes = partition_sizes(cfg, data_source(cfg, cfg.data_dir), 3)
    clients = [len(client_app.node_partition(
        node_context(config(folder, partition="iid"), pid, 3, tmp_path / "cache"))[0].y)
        for pid in range(3)]
    assert sizes == clients and sum(sizes) == 900


def test_synthetic_natural_groups_follow_the_kept_examples():
    full = load_dataset("synthetic")
    carved = load_dataset("synthetic", validation_fraction=0.1)
    kept = training_rows(full.y_train.numpy(), 0.1)
    assert np.array_equal(carved.natural_ids, full.natural_ids[kept])
    labels, groups = train_labels(DataSource("synthetic", validation_fraction=0.1))
    assert np.array_equal(labels, carved.y_train.numpy())
    assert np.array_equal(groups, carved.natural_ids)


# ----------------------------------------------------------------- the default is unchanged
def test_the_default_run_holds_nothing_out(tiny, tmp_path):
    folder, _ = tiny
    cfg = check_run_config({"data-dir": str(folder), "allow-download": False})
    assert cfg.evaluation_split == "test" and cfg.held_out_fraction == 0.0
    assert cfg.data_source(cfg.data_dir) == DataSource("fashion-mnist", str(folder), False)
    loaded = cfg.data_source(cfg.data_dir).load()
    assert loaded.x_validation is None and len(loaded.y_train) == N_TRAIN
    # a test run's partition entry has the key it had before the split existed
    source = cfg.data_source(cfg.data_dir)
    _, index = cached_entries(ArrayCache(tmp_path / "cache"), source,
                              source_files(source), PartitionSpec("iid"), 2)
    request = json.loads((index.path / "manifest.json").read_text())["request"]
    assert set(request) == {"kind", "dataset", "partition", "num-partitions"}


# ----------------------------------------------------------------- bad values
@pytest.mark.parametrize("value", [0.0, 0.51, 1.0])
def test_a_fraction_outside_its_interval_is_refused_with_the_fix(value):
    with pytest.raises(ConfigError) as info:
        check_run_config({"evaluation-split": "validation", "validation-fraction": value})
    message = str(info.value)
    assert f"validation-fraction={value!r}" in message and "(0, 0.5]" in message
    assert "--run-config \"validation-fraction=0.1\"" in message


def test_an_unknown_split_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"evaluation-split='valid' is not allowed.*"
                                          r"one of test, validation"):
        check_run_config({"evaluation-split": "valid"})


def test_too_few_held_out_examples_name_the_keys_the_value_and_the_fix():
    with pytest.raises(ValueError) as info:
        validation_indices(np.arange(500) % 10, 0.1, "fashion-mnist")
    message = str(info.value)
    assert ("evaluation-split='validation' with validation-fraction=0.1 holds out 50 of the "
            "500 training examples of dataset='fashion-mnist'") in message
    assert message.endswith("Fix: validation-fraction=0.19 (or more, at most 0.5), or "
                            "evaluation-split='test'")  # round(9.5) = 10 of each label's 50
    assert len(validation_indices(np.arange(500) % 10, 0.19)) == 100
    with pytest.raises(ValueError, match=r"Fix: evaluation-split='test' \(this training split "
                                         r"is too small to hold out 100 examples\)"):
        validation_indices(np.arange(150) % 10, 0.5)  # 8 of each label's 15 at most
    assert len(validation_indices(np.arange(2 * MIN_VALIDATION_EXAMPLES) % 10, 0.5)) == 100


@pytest.mark.parametrize("fraction", [0.0, -0.1, 0.6, True])
def test_the_task_refuses_a_fraction_the_table_would_refuse(fraction):
    with pytest.raises(ValueError, match=r"validation-fraction=.* must be in \(0, 0.5\]"):
        validation_indices(np.arange(5000) % 10, fraction)


def test_the_preflight_stops_a_training_split_too_small(tmp_path):
    write_tiny_fashion_mnist(tmp_path / "data", n_train=300)
    cfg = check_run_config(config(tmp_path / "data"))
    with pytest.raises(PreflightError, match=r"validation-fraction=0.1 holds out 30 of the "
                                             r"300 training examples.*validation-fraction=0.32"):
        partition_sizes(cfg, data_source(cfg, cfg.data_dir), 3)


# ----------------------------------------------------------------- the ServerApp
@pytest.mark.usefixtures("processes", "one_torch_thread")
def test_the_logged_accuracy_is_the_models_on_the_held_out_examples(tmp_path):
    from fedapp.server_app import app as server_app  # noqa: PLC0415
    from tests.inprocess import InProcessGrid  # noqa: PLC0415

    run_config = {"dataset": "synthetic", "model": "mlp-2nn", "partition": "iid",
                  "num-server-rounds": 2, "local-steps": 2, "batch-size": 16,
                  "evaluation-split": "validation", "validation-fraction": 0.2,
                  "output-dir": str(tmp_path), "run-plots": False, "eval-overlap": False}
    grid = InProcessGrid(client_app.app, 3, run_config)
    server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(run_config)))
    run_dir = next(tmp_path.iterdir())
    last = read_rounds(run_dir)[-1]

    full = load_dataset("synthetic")
    held = torch.from_numpy(validation_indices(full.y_train.numpy(), 0.2))
    x, y = full.x_train[held], full.y_train[held]
    model = build_model("mlp-2nn", full.input_shape, full.num_classes)
    model.load_state_dict(torch.load(run_dir / "final_model.pt"))
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).double().mean().item()
    assert last[C.LOG_ROUND] == 2 and last[C.LOG_ACCURACY] == pytest.approx(accuracy, abs=1e-12)
    test_accuracy = (model(full.x_test).argmax(dim=1) == full.y_test).double().mean().item()
    assert test_accuracy != pytest.approx(accuracy, abs=1e-12)  # not the test split's

    facts = json.loads((run_dir / "config.json").read_text())
    assert facts["evaluation"] == {"split": "validation", "examples": len(held),
                                   "validation-fraction": 0.2}
    assert json.loads((run_dir / "summary.json").read_text())["evaluation-split"] == "validation"
    partitions = json.loads((run_dir / "partitions.json").read_text())
    assert sum(map(sum, partitions.values())) == len(full.y_train) - len(held)


# ----------------------------------------------------------------- the report
def tuning_run(folder, variant: str, split: str | None) -> None:
    """A finished fake run whose config.json has ``evaluation-split`` = ``split`` (None: a
    run from before the key)."""
    run = folder / variant / "seed0" / f"2026-{variant}"
    run.mkdir(parents=True)
    records = [{"round": 0, "accuracy": 0.1, "loss": 2.0}, {"round": 1, "accuracy": 0.8,
                                                           "loss": 1.0}]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "final_model.pt").write_bytes(b"x")
    run_config = {"strategy": "fedavg", "num-server-rounds": 1}
    if split is not None:
        run_config["evaluation-split"] = split
    (run / "config.json").write_text(json.dumps({"run-config": run_config}))


def test_a_report_marks_validation_accuracies_and_refuses_them_as_published(tmp_path):
    from simulation.report import build_report  # noqa: PLC0415 - matplotlib

    tuning_run(tmp_path / "runs", "lr-0.1", "validation")
    tuning_run(tmp_path / "runs", "old", None)
    tuning_run(tmp_path / "runs", "final", "test")
    table = build_report(tmp_path / "runs", tmp_path / "out", [0.6])
    assert table.startswith("Validation accuracy: lr-0.1 was evaluated on the validation split")
    assert "old" not in table.splitlines()[0] and "final" not in table.splitlines()[0]
    with pytest.raises(SystemExit, match=r"lr-0.1: evaluated on the validation split .* Fix: "
                                         r"run it with evaluation-split = \"test\""):
        build_report(tmp_path / "runs", tmp_path / "out", [0.6], published={"lr-0.1": 0.8})
    build_report(tmp_path / "runs", tmp_path / "out", [0.6], published={"final": 0.8})
