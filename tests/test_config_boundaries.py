"""Every run-config key through its boundary and invalid values.

The keys come from pyproject.toml's ``[tool.flwr.app.config]``. Boundary values pass
``check_run_config`` (RunConfig plus the strategy constructor's checks); every bad
value (wrong type, out of range, unknown choice, a cross-key conflict) raises a
ConfigError that names the key, the value and a ``--run-config`` fix, and the fix,
applied, passes.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedapp.config import ConfigError
from fedapp.registry import STRATEGIES, check_run_config
from strategies import WEIGHTINGS
from strategies.dynacomm import BUDGET_MODES
from strategies.dynamicfl_schedule import X_STAR_MODES
from strategies.schedules import SCHEDULES
from task.data import DATASET_NAMES
from task.models import MODEL_NAMES
from task.partition import PARTITION_NAMES

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
with PYPROJECT.open("rb") as _handle:
    TOML = tomllib.load(_handle)["tool"]["flwr"]["app"]["config"]

FV = {"strategy": "fedveca"}
DFL = {"strategy": "dynamicfl"}
MOON = {"strategy": "moon", "model": "cnn-small-moon"}
CLOCK = {"device-profiles": "lognormal"}
TRACE = str(Path(__file__).resolve().parents[1] / "examples" / "device-traces" / "fleet.csv")
EXP = {"lr-schedule": "exponential"}

# key -> (base config: a strategy that reads the key, boundary values, bad values)
CASES: dict[str, tuple[dict, list, list]] = {
    "num-server-rounds": ({}, [1], [0, -1]),
    "strategy": ({"model": "cnn-small-moon"}, list(STRATEGIES), ["fedfoo", "FedAvg", ""]),
    "weighting": ({}, list(WEIGHTINGS), ["median", ""]),
    "fraction-train": ({}, [1e-9, 1.0], [0.0, -0.1, 1.5]),
    "fraction-evaluate": ({}, [0.0, 1.0], [-0.1, 1.01]),
    "min-available-nodes": ({}, [1], [0, -2]),
    "server-lr": ({}, [1e-9, 10.0], [0.0, -1.0]),
    "proximal-mu": ({"strategy": "fedprox"}, [0.0, 1.0], [-0.01]),
    "server-momentum": ({"strategy": "fednova"}, [0.0, 0.99], [1.0, -0.1]),
    "server-beta1": ({"strategy": "fedadam"}, [0.0, 0.999], [1.0, -0.1]),
    "server-beta2": ({"strategy": "fedyogi"}, [0.0, 0.999], [1.0, -0.1]),
    "server-tau": ({"strategy": "fedadagrad"}, [1e-12, 1.0], [0.0, -1e-3]),
    "straggler-fraction": ({}, [0.0, 1.0], [-0.1, 1.1]),
    "straggler-policy": ({}, ["auto", "drop", "partial"], ["sometimes", ""]),
    "straggler-unit": ({}, ["steps", "epochs"], ["rounds"]),
    "round-deadline": (CLOCK, [0.0, 1e-6, 1e9], [-1.0]),
    "device-profiles": ({}, ["none", "homogeneous", "lognormal", "two-tier", TRACE],
                        ["fast", "", "fleet.csv", "/nonexistent/fleet.csv"]),
    "device-downlink-mbps": (CLOCK, [1e-6, 1e4], [0.0, -1.0]),
    "device-uplink-mbps": (CLOCK, [1e-6, 1e4], [0.0, -1.0]),
    "device-sigma": (CLOCK, [0.0, 3.0], [-0.1]),
    "device-rich-fraction": ({"device-profiles": "two-tier"}, [0.0, 1.0], [-0.1, 1.1]),
    "device-poor-factor": ({"device-profiles": "two-tier"}, [1.0, 100.0], [0.5, 0.0]),
    "device-availability": (CLOCK, [0.0, 1.0], [-0.1, 1.5]),
    "device-reference-gflops": (CLOCK, [1e-6, 1e4], [0.0, -1.0]),
    "drift-diagnostics": ({}, [True, False], []),
    "fedveca-tau-init": (FV, [2, 50], [1, 51, 0]),
    "fedveca-tau-max": ({**FV, "fedveca-tau-init": 2}, [2, 1000], [1, 0]),
    "fedveca-alpha": (FV, [1e-9, 0.95, 2.0], [0.0, -1.0]),
    "fedveca-beta-mode": (FV, ["same-batch", "literal", "same_batch"], ["full", ""]),
    "fedveca-grad-subsample": (FV, [0, 1], [-1]),
    "dynamicfl-intervals": (DFL, ["a-g", "a", "a*", "g", "4-300", "1-1"],
                            ["g-a", "a-h", "", "x", "0-4"]),
    "dynamicfl-local-steps": (DFL, [0, 1], [-1]),
    "dynamicfl-budget-mode": (DFL, list(BUDGET_MODES), ["greedy"]),
    "dynamicfl-beta": (DFL, [0.0, 1.0], [-0.1, 1.5]),
    "dynamicfl-server-budget": (DFL, [0.0, 1e9], [-1.0]),
    "dynamicfl-budget-seconds": ({**DFL, **CLOCK, "dynamicfl-budget-mode": "budget"},
                                 [0.0, 10.0], [-1.0]),
    "dynamicfl-n-ens": (DFL, [1], [0]),
    "dynamicfl-x-star-mode": (DFL, list(X_STAR_MODES), ["both"]),
    "feddyn-alpha": ({"strategy": "feddyn"}, [1e-9, 0.01, 10.0], [0.0, -0.01]),
    "moon-mu": (MOON, [0.0, 1.0, 10.0], [-0.1]),
    "moon-temperature": (MOON, [1e-9, 0.5], [0.0, -0.5]),
    "dataset": ({}, [n for n in DATASET_NAMES if n != "hf:<hub-id>"] + ["hf:flwrlabs/femnist"],
                ["imagenet", "hf:", ""]),
    "data-dir": ({}, ["", "/abs/data"], ["data", "~/data"]),
    "allow-download": ({}, [True, False], []),
    "normalize": ({}, [True, False], []),
    "synthetic-alpha": ({}, [0.0], [-1.0]),
    "synthetic-beta": ({}, [0.0], [-1.0]),
    "partition": ({}, list(PARTITION_NAMES), ["zipf", ""]),
    "dirichlet-alpha": ({}, [1e-9], [0.0, -1.0]),
    "min-partition-size": ({}, [0], [-1]),
    "classes-per-partition": ({}, [1], [0]),
    "shards-per-partition": ({}, [1], [0]),
    "quantity-sigma": ({}, [0.0], [-0.5]),
    "partition-seed": ({}, [-1, 0, 2020, 2**63 - 1], [-2]),
    "model": ({}, list(MODEL_NAMES), ["vgg99", ""]),
    "local-epochs": ({}, [1e-9, 1.0, 2.5], [0.0, -1.0]),
    "local-steps": ({}, [0, 1], [-1]),
    "batch-size": ({}, [1], [0, -5]),
    "full-batch": ({}, [True, False], []),
    "lr": ({}, [1e-9], [0.0, -0.1]),
    "lr-schedule": ({}, list(SCHEDULES), ["linear", "Exponential", ""]),
    "lr-decay": (EXP, [1e-9, 0.99, 1.0], [0.0, -0.1]),
    "lr-step-every": ({"lr-schedule": "step"}, [1, 2**63 - 1], [0, -1]),
    "lr-min": ({"lr-schedule": "cosine"}, [0.0, 0.05], [-1e-4]),
    "momentum": ({}, [0.0, 0.99], [1.0, -0.5]),
    "weight-decay": ({}, [0.0], [-1e-4]),
    "seed": ({}, [0, 2**32, 2**63 - 1], [-1]),
    "device": ({}, ["auto", "cpu", "cuda", "cuda:0", "cuda:12"], ["tpu", "", "cuda:", "gpu"]),
    "eval-batch-size": ({}, [1], [0]),
    "eval-every": ({}, [1, 2**63 - 1], [0, -1]),
    "eval-overlap": ({}, [True, False], []),
    "fault-crash-prob": ({}, [0.0, 1.0], [-0.1, 1.1]),
    "fault-late-prob": ({}, [0.0, 1.0], [-0.1, 1.1]),
    "round-timeout": ({}, [1e-3], [0.0, -1.0]),
    "checkpoint-every": ({}, [0, 1], [-1]),
    "resume-from": ({}, ["", "/abs/run"], ["runs/x", "~/run"]),
    "output-dir": ({}, ["", "/abs/runs"], ["runs", "~/runs"]),
    "tracking": ({}, ["", "tensorboard", "mlflow", "tensorboard,mlflow", "mlflow, tensorboard"],
                 ["wandb", "TensorBoard", ",", "tensorboard;mlflow"]),
    "tracking-dir": ({}, ["", "/abs/tracking"], ["tracking", "~/tracking"]),
}

# a conflict between keys: (run config, the keys the message must name)
CROSS = [
    ({**FV, "fedveca-tau-init": 30, "fedveca-tau-max": 25},
     ["fedveca-tau-init", "fedveca-tau-max"]),
    ({**FV, "fedveca-tau-max": 10}, ["fedveca-tau-max"]),
    ({"fault-crash-prob": 0.6, "fault-late-prob": 0.5}, ["fault-late-prob"]),
    ({"strategy": "fednova", "weighting": "uniform"}, ["weighting"]),
    ({**FV, "weighting": "scheme-i"}, ["weighting"]),
    ({**FV, "momentum": 0.9}, ["momentum"]),
    ({**FV, "weight-decay": 1e-4}, ["weight-decay"]),
    ({**FV, "server-lr": 0.5}, ["server-lr"]),
    ({**FV, "server-momentum": 0.5}, ["server-momentum"]),
    ({**FV, "straggler-fraction": 0.2}, ["straggler-fraction"]),
    ({**DFL, "server-lr": 0.5}, ["server-lr"]),
    ({**DFL, "weighting": "uniform"}, ["weighting"]),
    ({**DFL, "straggler-fraction": 0.2}, ["straggler-fraction"]),
    ({"strategy": "dynamicsgd", "server-momentum": 0.5}, ["server-momentum"]),
    ({"strategy": "scaffold", "weighting": "scheme-ii"}, ["weighting"]),
    ({"strategy": "scaffold", "server-momentum": 0.5}, ["server-momentum"]),
    ({"strategy": "feddyn", "server-lr": 0.5}, ["server-lr"]),
    ({"strategy": "feddyn", "weighting": "scheme-i"}, ["weighting"]),
    ({"strategy": "feddyn", "server-momentum": 0.5}, ["server-momentum"]),
    ({"strategy": "moon", "model": "cnn-small"}, ["model"]),
    ({**MOON, "server-momentum": 0.5}, ["server-momentum"]),
    ({"strategy": "fedadam", "straggler-fraction": 0.2}, ["straggler-fraction"]),
    ({"strategy": "fedyogi", "lr-schedule": "exponential"}, ["lr-schedule"]),
    ({"strategy": "fedavgm", "weighting": "uniform"}, ["weighting"]),
    ({"strategy": "fedadagrad", "server-beta1": 0.5}, ["server-beta1"]),
    ({"strategy": "fedadam", "server-momentum": 0.5}, ["server-momentum"]),
    ({"strategy": "fedyogi", "device-profiles": "lognormal"}, ["device-profiles"]),
    # d > 1 is fine for 'inverse' (a = 2), not for a decaying schedule
    ({**EXP, "lr-decay": 1.5}, ["lr-schedule", "lr-decay"]),
    ({"round-deadline": 5.0}, ["round-deadline"]),  # a deadline needs device profiles
    ({**CLOCK, "round-deadline": 5.0, "straggler-fraction": 0.5},
     ["round-deadline", "straggler-fraction"]),
    ({**DFL, **CLOCK, "round-deadline": 5.0}, ["round-deadline"]),
    ({**DFL, "dynamicfl-budget-seconds": 5.0}, ["dynamicfl-budget-seconds"]),
    ({"lr-schedule": "step", "lr-decay": 2.0}, ["lr-schedule", "lr-decay"]),
    ({**DFL, **EXP, "lr-decay": 1.5}, ["lr-schedule", "lr-decay"]),
]


def shown(value: object, key: str) -> str:
    """How a message shows ``value`` of ``key`` (ints for float keys become floats)."""
    if isinstance(TOML[key], float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return f"{key}={value!r}"


def assert_stops_with_fix(user_config: dict, keys: list[str]) -> str:
    """ConfigError naming ``keys`` with their values and a --run-config fix that passes."""
    with pytest.raises(ConfigError) as info:
        check_run_config(user_config)
    msg = str(info.value)
    for key in keys:
        assert shown(user_config[key], key) in msg, msg
    found = re.search(r'--run-config "([^"]*)"', msg)
    assert found, f"no --run-config fix in {msg!r}"
    fix = parse_config_args([found.group(1)])
    assert set(fix) & set(keys) or fix.keys() <= user_config.keys(), msg
    check_run_config({**user_config, **fix})
    return msg


def test_cases_cover_every_pyproject_key():
    assert list(CASES) == list(TOML)


def test_pyproject_defaults_pass():
    check_run_config(TOML)


BOUNDARY = [(k, v) for k, (_, good, _) in CASES.items() for v in good]


@pytest.mark.parametrize("key, value", BOUNDARY, ids=[f"{k}={v!r}" for k, v in BOUNDARY])
def test_boundary_value_passes(key, value):
    base = CASES[key][0]
    cfg = check_run_config({**base, key: value})
    assert cfg.to_dict()[key] == value


BAD = [(k, v) for k, (_, _, bad) in CASES.items() for v in bad]


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_bad_value_stops_with_key_value_and_fix(key, value):
    assert_stops_with_fix({**CASES[key][0], key: value}, [key])


def wrong_types(default: object) -> list:
    if isinstance(default, bool):
        return [1, "true", 1.0]
    if isinstance(default, int):
        return ["1", 1.5, True, 2**63, -(2**63) - 1]
    if isinstance(default, float):
        return ["0.5", True, math.inf, -math.inf, math.nan]
    return [1, 1.0, True]


WRONG = [(k, v) for k in TOML for v in wrong_types(TOML[k])]


@pytest.mark.parametrize("key, value", WRONG, ids=[f"{k}={v!r}" for k, v in WRONG])
def test_wrong_type_or_unrepresentable_stops(key, value):
    msg = assert_stops_with_fix({**CASES[key][0], key: value}, [])
    assert key in msg and repr(value) in msg


@pytest.mark.parametrize("user_config, keys", CROSS, ids=[str(c) for c, _ in CROSS])
def test_cross_key_conflict_stops_naming_every_key(user_config, keys):
    assert_stops_with_fix(user_config, keys)


@pytest.mark.parametrize("key,value", [("fedveca-tau-init", 1), ("dynamicfl-intervals", "g-a"),
                                       ("dynamicfl-beta", 1.5), ("proximal-mu", -0.01),
                                       ("lr-decay", -1.0), ("lr-min", -1.0),
                                       ("server-beta1", 1.0), ("server-tau", 0.0),
                                       ("feddyn-alpha", 0.0), ("moon-mu", -1.0),
                                       ("moon-temperature", 0.0)])
def test_a_bad_value_of_a_key_the_strategy_does_not_read_is_still_an_error(key, value):
    with pytest.raises(ConfigError) as info:
        check_run_config({"strategy": "fedavg", key: value})
    assert f"{key}={value!r}" in str(info.value) and "--run-config" in str(info.value)
    check_run_config({"strategy": "fedavg", key: TOML[key]})
