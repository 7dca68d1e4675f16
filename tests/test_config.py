"""Tests for fedapp.config (RunConfig vs. pyproject.toml, validation messages) and
the train config that fedapp.registry derives from it.

Bad values go through ``check_run_config`` (RunConfig plus the strategy constructor's
own checks); tests/test_config_boundaries.py walks every key."""

from __future__ import annotations

import dataclasses
import inspect
import math
import tomllib
from pathlib import Path

import pytest

from fedapp.config import ConfigError, RunConfig
from fedapp.registry import STRATEGIES, build_strategy, check_run_config, train_config
from strategies import WEIGHTINGS, DynamicFL, FedAvg, FedNova, FedProx, FedVeca
from strategies import contract as C
from task.data import DATASET_NAMES
from task.models import MODEL_NAMES
from task.partition import PARTITION_NAMES

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(scope="module")
def toml_config() -> dict:
    with PYPROJECT.open("rb") as handle:
        return tomllib.load(handle)["tool"]["flwr"]["app"]["config"]


def field_defaults() -> dict[str, object]:
    return {f.name.replace("_", "-"): f.default for f in dataclasses.fields(RunConfig)}


# ----------------------------------------------------------------- pyproject <-> RunConfig
def test_pyproject_keys_are_exactly_runconfig_fields(toml_config):
    fields = field_defaults()
    assert sorted(set(toml_config) - set(fields)) == [], "in pyproject.toml but not in RunConfig"
    assert sorted(set(fields) - set(toml_config)) == [], "RunConfig fields not in pyproject.toml"
    assert list(toml_config) == list(fields)  # same order, for readers of both


def test_pyproject_defaults_equal_runconfig_defaults(toml_config):
    fields = field_defaults()
    for key, value in toml_config.items():
        assert value == fields[key], key
        # Same type too: from_user_config coerces by the field default's type.
        assert type(value) is type(fields[key]), key


def test_every_field_has_a_plain_default():
    for f in dataclasses.fields(RunConfig):
        assert f.default is not dataclasses.MISSING, f.name
        assert type(f.default) in (int, float, bool, str), f.name


def test_pyproject_config_validates(toml_config):
    assert RunConfig.from_user_config(toml_config) == RunConfig()


def test_empty_user_config_gives_defaults():
    cfg = RunConfig.from_user_config({})
    assert cfg == RunConfig()
    cfg.validate()


def test_to_dict_round_trips(toml_config):
    cfg = RunConfig()
    assert cfg.to_dict() == dict(toml_config)
    assert RunConfig.from_user_config(cfg.to_dict()) == cfg
    custom = RunConfig.from_user_config({
        "strategy": "fedsgd", "lr": 0.2, "batch-size": 10, "full-batch": True,
        "dataset": "synthetic",
        "partition": "natural", "model": "mlp-2nn", "momentum": 0.9, "output-dir": "/tmp/runs",
        "device": "cuda:1", "allow-download": False, "fraction-evaluate": 0.5,
    })
    assert custom.to_dict()["lr"] == 0.2 and custom.to_dict()["full-batch"] is True
    assert RunConfig.from_user_config(custom.to_dict()) == custom


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig().lr = 1.0  # type: ignore[misc]


# ----------------------------------------------------------------- bad values
def assert_config_error(user_config: dict, *needles: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_run_config(user_config)
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


BAD_VALUES = [
    # key, bad value, what the message must name as allowed
    ("weighting", "median", list(WEIGHTINGS)),  # FedAvg's constructor lists them
    ("dataset", "foo", list(DATASET_NAMES)),
    ("dataset", "hf:", list(DATASET_NAMES)),
    ("partition", "pathological", list(PARTITION_NAMES)),
    ("model", "resnet50", list(MODEL_NAMES)),
    ("dirichlet-alpha", 0.0, ["> 0"]),
    ("dirichlet-alpha", -1.0, ["> 0"]),
    ("fraction-train", 0.0, ["(0, 1]"]),
    ("fraction-train", 1.5, ["(0, 1]"]),
    ("fraction-evaluate", -0.1, ["[0, 1]"]),
    ("fraction-evaluate", 1.01, ["[0, 1]"]),
    ("batch-size", 0, [">= 1", "full-batch"]),
    ("batch-size", -5, [">= 1"]),
    ("local-epochs", 0, [">= 1"]),
    ("local-steps", -1, [">= 0"]),
    ("lr", 0.0, ["> 0"]),
    ("lr", -0.1, ["> 0"]),
    ("lr", math.nan, ["finite"]),
    ("lr", math.inf, ["finite"]),
    ("momentum", 1.0, ["[0, 1)"]),
    ("momentum", -0.5, ["[0, 1)"]),
    ("weight-decay", -1e-4, [">= 0"]),
    ("server-lr", 0.0, ["> 0"]),
    ("num-server-rounds", 0, [">= 1"]),
    ("min-available-nodes", 0, [">= 1"]),
    ("min-partition-size", -1, [">= 0"]),
    ("classes-per-partition", 0, [">= 1"]),
    ("shards-per-partition", 0, [">= 1"]),
    ("quantity-sigma", -0.5, [">= 0"]),
    ("synthetic-alpha", -1.0, [">= 0"]),
    ("synthetic-beta", -1.0, [">= 0"]),
    ("eval-batch-size", 0, [">= 1"]),
    ("output-dir", "runs", ["absolute path"]),
    ("output-dir", "~/runs", ["absolute path"]),
    ("device", "tpu", ["auto", "cpu", "cuda", "cuda:N"]),
    ("device", "", ["auto", "cpu", "cuda", "cuda:N"]),
    ("seed", -1, ["[0, ", "negative"]),
    ("partition-seed", -2, ["-1 (the run's seed)"]),
]


@pytest.mark.parametrize("key, value, allowed", BAD_VALUES,
                         ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
def test_bad_value_message_names_key_value_and_allowed(key, value, allowed):
    msg = assert_config_error({key: value}, f"{key}={value!r}", *allowed)
    assert "--run-config" in msg  # says how to set it


@pytest.mark.parametrize("key, value", [("dirichlet-alpha", 0), ("dirichlet-alpha", -1), ("lr", 0),
                                        ("fraction-train", 2)])
def test_bad_int_for_float_key_reported_as_coerced_float(key, value):
    assert_config_error({key: value}, f"{key}={float(value)!r}")


def test_other_keys_are_fine_when_one_is_bad():
    assert_config_error({"lr": 0.1, "batch-size": 0, "model": "mlp-2nn"}, "batch-size=0")


def test_unknown_strategy_via_registry():
    cfg = RunConfig.from_user_config({"strategy": "fedfoo"})  # names are the registry's
    with pytest.raises(ConfigError) as err:
        build_strategy(cfg)
    msg = str(err.value)
    assert "strategy='fedfoo'" in msg
    for name in STRATEGIES:
        assert name in msg
    assert "--run-config" in msg


@pytest.mark.parametrize("unknown", ["learning-rate", "local_epochs", "proximal-mu-typo"])
def test_unknown_key(unknown):
    msg = assert_config_error({"lr": 0.1, unknown: 1}, unknown, "known keys")
    for key in field_defaults():
        assert key in msg


def test_unknown_keys_all_listed():
    assert_config_error({"foo": 1, "bar": 2}, "bar, foo")


@pytest.mark.parametrize("unknown, meant", [
    ("learning-rate", "lr"),  # Flower's templates' names
    ("fraction-fit", "fraction-train"),
    ("local_epochs", "local-epochs"),  # underscores
    ("dirichlet_alpha", "dirichlet-alpha"),
    ("lr-shedule", "lr-schedule"),  # a typo
])
def test_an_unknown_key_names_the_key_it_most_likely_means(unknown, meant):
    assert_config_error({unknown: 1}, f"{unknown} (did you mean {meant}?)")


def test_an_unknown_key_like_none_gets_no_guess():
    msg = assert_config_error({"max-examples": 600}, "unknown key(s) max-examples; known keys")
    assert "did you mean" not in msg


@pytest.mark.parametrize("key, value, expected_type", [
    ("lr", "fast", "float"),
    ("lr", True, "float"),
    ("batch-size", 2.5, "int"),
    ("batch-size", "32", "int"),
    ("batch-size", True, "int"),
    ("num-server-rounds", False, "int"),
    ("allow-download", "yes", "bool"),
    ("allow-download", 1, "bool"),
    ("full-batch", 0, "bool"),
    ("model", 3, "str"),
    ("output-dir", 0, "str"),
])
def test_wrong_type(key, value, expected_type):
    msg = assert_config_error({key: value}, f"{key}={value!r}", f"expected {expected_type}")
    assert f"has type {type(value).__name__}" in msg


def test_int_for_float_key_is_accepted():
    cfg = RunConfig.from_user_config({"lr": 1, "momentum": 0, "fraction-train": 1, "server-lr": 2})
    assert cfg.lr == 1.0 and type(cfg.lr) is float
    assert type(cfg.momentum) is float and cfg.momentum == 0.0
    assert type(cfg.fraction_train) is float and type(cfg.server_lr) is float


def test_integral_float_for_int_key_is_accepted():
    cfg = RunConfig.from_user_config({"batch-size": 64.0, "seed": 3.0})
    assert cfg.batch_size == 64 and type(cfg.batch_size) is int
    assert cfg.seed == 3 and type(cfg.seed) is int


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_good_devices(device):
    assert RunConfig.from_user_config({"device": device}).device == device


@pytest.mark.parametrize("device", ["cuda:", "cuda:x", "cuda:0,1"])
def test_malformed_cuda_device_rejected(device):
    assert_config_error({"device": device}, f"device={device!r}", "cuda:N")


def test_good_boundary_values():
    cfg = check_run_config({
        "fraction-train": 1.0, "fraction-evaluate": 0.0, "momentum": 0.0, "local-steps": 0,
        "min-partition-size": 0, "quantity-sigma": 0.0, "weight-decay": 0.0,
        "output-dir": "/abs/runs",
        "dataset": "hf:flwrlabs/femnist", "synthetic-alpha": 0.0,
    })
    assert cfg.output_dir == "/abs/runs"
    assert cfg.resolved_output_dir() == Path("/abs/runs")
    check_run_config({"fraction-evaluate": 1.0, "momentum": 0.99, "fraction-train": 1e-3})


def test_resolved_output_dir_default(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert RunConfig().resolved_output_dir() == tmp_path / "fedhetero" / "runs"


# ----------------------------------------------------------------- defaults agree
# constructor parameter -> the run-config key the registry passes to it unchanged
SAME_DEFAULT = {
    FedAvg: {"fraction_train": "fraction-train", "weighting": "weighting", "server_lr": "server-lr",
             "seed": "seed", "min_available_nodes": "min-available-nodes",
             "straggler_fraction": "straggler-fraction", "straggler_unit": "straggler-unit"},
    FedProx: {"proximal_mu": "proximal-mu"},
    FedNova: {"server_momentum": "server-momentum"},
    FedVeca: {"tau_init": "fedveca-tau-init", "tau_max": "fedveca-tau-max",
              "alpha": "fedveca-alpha", "beta_mode": "fedveca-beta-mode",
              "grad_subsample": "fedveca-grad-subsample"},
    DynamicFL: {"intervals": "dynamicfl-intervals", "local_steps": "dynamicfl-local-steps",
                "budget_mode": "dynamicfl-budget-mode", "beta": "dynamicfl-beta",
                "n_ens": "dynamicfl-n-ens", "x_star_mode": "dynamicfl-x-star-mode",
                "fraction_train": "fraction-train", "seed": "seed",
                "min_available_nodes": "min-available-nodes"},
}
# Deliberately different in the app (RunConfig = pyproject.toml), always passed explicitly:
# fraction-evaluate 0.0 (the app evaluates on the server; Flower's and the classes' 1.0),
# drift-diagnostics true (the run log's drift columns), lr 0.1 (FedVeca's own lr is 0.01).
APP_DIFFERS = {"fraction-evaluate": 0.0, "drift-diagnostics": True, "lr": 0.1}


@pytest.mark.parametrize("cls", list(SAME_DEFAULT), ids=lambda c: c.__name__)
def test_runconfig_defaults_equal_the_constructor_defaults(cls):
    params = inspect.signature(cls.__init__).parameters
    for param, key in SAME_DEFAULT[cls].items():
        assert params[param].default == RunConfig().to_dict()[key], (cls.__name__, param, key)


def test_flower_defaults_min_available_nodes_and_fraction_train():
    defaults = RunConfig().to_dict()
    assert defaults["min-available-nodes"] == 2 and defaults["fraction-train"] == 1.0
    assert {k: defaults[k] for k in APP_DIFFERS} == APP_DIFFERS


# ----------------------------------------------------------------- registry train config
def test_strategy_names():
    assert set(STRATEGIES) >= {"fedavg", "fedsgd"}


def test_fedsgd_forces_one_full_batch_epoch():
    cfg = RunConfig.from_user_config({
        "strategy": "fedsgd", "local-epochs": 5, "local-steps": 7, "batch-size": 64, "lr": 0.3,
        "momentum": 0.5, "weight-decay": 1e-4, "seed": 9,
    })
    strategy, config = build_strategy(cfg)
    assert isinstance(strategy, FedAvg)
    assert config[C.LOCAL_EPOCHS] == 1
    assert config[C.LOCAL_STEPS] == 0
    assert config[C.BATCH_SIZE] == 0
    assert config[C.LR] == 0.3 and config[C.MOMENTUM] == 0.5
    assert config[C.WEIGHT_DECAY] == 1e-4 and config[C.SEED] == 9


@pytest.mark.parametrize("full_batch, batch_size, expected", [(False, 32, 32), (False, 7, 7),
                                                              (True, 32, 0), (True, 7, 0)])
def test_fedavg_batch_size(full_batch, batch_size, expected):
    cfg = RunConfig.from_user_config({"strategy": "fedavg", "full-batch": full_batch,
                                      "batch-size": batch_size,
                                      "local-epochs": 3, "local-steps": 4})
    strategy, config = build_strategy(cfg)
    assert isinstance(strategy, FedAvg)
    assert config[C.BATCH_SIZE] == expected
    assert config[C.LOCAL_EPOCHS] == 3 and config[C.LOCAL_STEPS] == 4
    assert config == train_config(cfg)


def test_train_config_keys_and_types():
    config = train_config(RunConfig())
    assert set(config) == {C.LR, C.LOCAL_EPOCHS, C.LOCAL_STEPS, C.BATCH_SIZE, C.MOMENTUM,
                           C.WEIGHT_DECAY, C.SEED}
    assert config == {C.LR: 0.1, C.LOCAL_EPOCHS: 2, C.LOCAL_STEPS: 0, C.BATCH_SIZE: 32,
                      C.MOMENTUM: 0.0, C.WEIGHT_DECAY: 0.0, C.SEED: 0}
    for key in (C.LOCAL_EPOCHS, C.LOCAL_STEPS, C.BATCH_SIZE, C.SEED):
        assert type(config[key]) is int, key
    for key in (C.LR, C.MOMENTUM, C.WEIGHT_DECAY):
        assert type(config[key]) is float, key


def test_build_strategy_returns_fresh_config():
    cfg = RunConfig.from_user_config({"strategy": "fedsgd"})
    _, first = build_strategy(cfg)
    first[C.LR] = 123.0
    _, second = build_strategy(cfg)
    assert second[C.LR] == cfg.lr


def test_partition_seed_defaults_to_the_run_seed_and_can_fix_the_partition():
    assert RunConfig.from_user_config({"seed": 7}).partition_data_seed == 7
    fixed = RunConfig.from_user_config({"seed": 7, "partition-seed": 2020})
    assert fixed.partition_data_seed == 2020 and fixed.seed == 7


@pytest.mark.parametrize("user, key", [({"partition-seed": 2**32}, "partition-seed"),
                                       ({"seed": 2**32}, "seed")])
def test_dirichlet_niid_bench_names_the_seed_that_is_too_large(user, key):
    msg = assert_config_error({"partition": "dirichlet-niid-bench", **user},
                              f"{key}={2**32!r}", "below 2**32", "2020")
    assert "--run-config" in msg
