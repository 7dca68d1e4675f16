"""fedapp.config's behaviour beyond the table's bounds (tests/test_config_keys.py walks
every key): unknown keys and their did-you-mean, type coercion, derived values, and the
train config that fedapp.registry sends with every train message."""

from __future__ import annotations

import dataclasses

import pytest

from fedapp.config import ConfigError, RunConfig, cli_fix, flwr_run_fix, with_fix_as
from fedapp.config_keys import KEYS
from fedapp.registry import build_strategy, check_run_config, train_config
from strategies import FedAvg
from strategies import contract as C


def assert_config_error(user_config: dict, *needles: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_run_config(user_config)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def test_to_dict_round_trips():
    assert RunConfig.from_user_config(RunConfig().to_dict()) == RunConfig()
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


# ----------------------------------------------------------------- keys and types
@pytest.mark.parametrize("key, value", [("dirichlet-alpha", 0), ("dirichlet-alpha", -1), ("lr", 0),
                                        ("fraction-train", 2)])
def test_bad_int_for_float_key_reported_as_coerced_float(key, value):
    assert_config_error({key: value}, f"{key}={float(value)!r}")


@pytest.mark.parametrize("unknown", ["learning-rate", "local_epochs", "proximal-mu-typo"])
def test_unknown_key(unknown):
    """The message names the key, its likely meaning and where the known keys are listed,
    not all of them on one line."""
    msg = assert_config_error({"lr": 0.1, unknown: 1}, unknown,
                              f"the {len(KEYS)} known keys: fedhetero keys (docs/config.md)")
    assert "num-server-rounds" not in msg and len(msg) < 200


@pytest.mark.parametrize("config, meant", [
    ({"strategy": "fedprx"}, "fedprox"), ({"weighting": "uniforn"}, "uniform"),
    ({"partition": "dirichet"}, "dirichlet"), ({"strategy": "FedProx"}, "fedprox"),
    ({"strategy": "fed_avg"}, "fedavg"),
])
def test_a_mistyped_value_names_the_value_it_most_likely_means_and_the_fix_uses_it(config,
                                                                                  meant):
    [(key, value)] = config.items()
    with pytest.raises(ConfigError) as info:
        RunConfig.from_user_config(config)
    assert f"{key}={value!r} is not allowed (did you mean {meant!r}?)" in str(info.value)
    assert str(info.value).endswith(f"Set it with: {flwr_run_fix({key: meant})}")
    assert info.value.fix == {key: meant}


def test_a_value_like_no_choice_gets_no_guess_and_the_default_as_its_fix():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_user_config({"partition": "xyz"})
    assert "did you mean" not in str(info.value) and info.value.fix == {"partition": "dirichlet"}


def test_the_fix_in_another_syntax():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_user_config({"lr": -0.1})
    assert with_fix_as(info.value, cli_fix).endswith("Set it with: -c lr=0.1")
    assert cli_fix({"allow-download": True, "strategy": "fedprox"}) == \
        "-c allow-download=true -c strategy=fedprox"


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
    msg = assert_config_error({"max-examples": 600}, "unknown key(s) max-examples; the ")
    assert "did you mean" not in msg


def test_int_for_float_key_is_accepted():
    cfg = RunConfig.from_user_config({"lr": 1, "momentum": 0, "fraction-train": 1, "server-lr": 2})
    assert cfg.lr == 1.0 and type(cfg.lr) is float
    assert type(cfg.momentum) is float and cfg.momentum == 0.0
    assert type(cfg.fraction_train) is float and type(cfg.server_lr) is float


def test_integral_float_for_int_key_is_accepted():
    cfg = RunConfig.from_user_config({"batch-size": 64.0, "seed": 3.0})
    assert cfg.batch_size == 64 and type(cfg.batch_size) is int
    assert cfg.seed == 3 and type(cfg.seed) is int


def test_resolved_output_dir_default(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert RunConfig().resolved_output_dir() == tmp_path / "fedhetero" / "runs"


# ----------------------------------------------------------------- registry train config
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
