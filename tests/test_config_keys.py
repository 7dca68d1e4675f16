"""The run-config table (fedapp.config_keys) drives these tests.

Every key through the values just inside and just outside its bounds (and wrong types),
every rule across keys, every value a strategy cannot honour; each refusal must name the
key(s) and value(s) and carry a ``--run-config`` fix that, applied, passes. And the table
against the copies it cannot generate: pyproject.toml's defaults (Flower reads them), the
README's table, the strategy constructors' own checks and the keys each strategy's wiring
in fedapp.registry reads.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args
from flwr.common.logger import FLOWER_LOGGER

from fedapp import config_docs, registry
from fedapp.config import ConfigError, RunConfig
from fedapp.config_keys import ALL, APP, BY_NAME, DYNAMICFL, FEDOPT, FLOWER, INT64_MAX, KEYS, \
    RULES, SELECTING, Key
from fedapp.registry import STRATEGIES, build_strategy, check_run_config

ROOT = Path(__file__).resolve().parents[1]
TOML = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
TRACE = str(ROOT / "examples" / "device-traces" / "fleet.csv")
CLOCK = {"device-profiles": "lognormal"}
FLASH = {"device-profiles": "flash"}
ABSOLUTE_OR_EMPTY = (["", "/abs/dir"], ["dir", "~/dir", "./dir"])

# keys a parser checks (``check``): values taken, values refused
PARSED: dict[str, tuple[list, list]] = {
    "width-levels": (["1,0.5,0.25,0.125,0.0625", "1", "0.5, 1", "0.3"],
                     ["", "0", "1,2", "1;0.5", "a", "1,,0.5", "-0.5"]),
    "device-profiles": (["none", "homogeneous", "lognormal", "two-tier", "tiers", "flash", TRACE,
                         TRACE.replace(".csv", ".json")],
                        ["fast", "", "fleet.csv", "/abs/fleet.txt"]),
    "fedveca-beta-mode": (["same-batch", "literal", "same_batch"], ["full", ""]),
    "dynamicfl-intervals": (["a-g", "a", "a*", "g", "4-300", "1-1"],
                            ["g-a", "a-h", "", "x", "0-4", "a-b-c"]),
    "dataset": (["fashion-mnist", "mnist", "cifar10", "cifar100", "synthetic",
                 "hf:flwrlabs/femnist"], ["imagenet", "hf:", ""]),
    "data-dir": ABSOLUTE_OR_EMPTY,
    "device": (["auto", "cpu", "cuda", "cuda:0", "cuda:12"],
               ["tpu", "", "cuda:", "gpu", "cuda:x", "cuda:0,1", "cuda:\u0663"]),
    "resume-from": ABSOLUTE_OR_EMPTY,
    "partition-map": ABSOLUTE_OR_EMPTY,
    "output-dir": ABSOLUTE_OR_EMPTY,
    "tracking": (["", "tensorboard", "mlflow", "tensorboard,mlflow", "mlflow, tensorboard"],
                 ["wandb", "TensorBoard", ",", "tensorboard;mlflow"]),
    "tracking-dir": ABSOLUTE_OR_EMPTY,
}
# what the other keys must be for all of a key's allowed values to pass the rules (and, for
# the generator's keys, to be read at all)
CONTEXT: dict[str, dict] = {
    "strategy": lambda value: {"model": "cnn-small-moon"} if value == "moon" else {},
    "width-rule": {**CLOCK, "round-deadline": 5.0},
    "fedveca-tau-max": {"fedveca-tau-init": 2},
    "round-deadline": CLOCK,
    "over-commitment": CLOCK,
    "selection": CLOCK,
    "dynamicfl-budget-seconds": {**CLOCK, "dynamicfl-budget-mode": "budget"},
    "vectorised-clients": {"virtual-clients": 4},
    **{k.name: CLOCK for k in KEYS if k.name.startswith("device-") and k.used_by != (APP,)},
    "device-speed-noise": FLASH,  # read by the flash fleet only
    "device-partition-correlation": FLASH,
}
# what a strategy needs of the other keys (MOON: a model with a projection head)
NEEDS: dict[str, dict] = {"moon": {"model": "cnn-small-moon"}}

# rule (its keys) -> (run configs that break it, one that keeps it)
RULE_CASES: dict[tuple[str, ...], tuple[list[dict], dict]] = {
    ("label-split", "robust-aggregation", "strategy"): (
        [{"strategy": "heterofl", "robust-aggregation": "median", "weighting": "uniform"}],
        {"strategy": "heterofl", "robust-aggregation": "median", "weighting": "uniform",
         "label-split": False}),
    ("selection", "weighting", "poc-weighting"): (
        [{"selection": "power-of-choice", "weighting": "uniform", "poc-weighting": "examples"}],
        {"selection": "power-of-choice", "weighting": "examples", "poc-weighting": "examples"}),
    ("vectorised-clients", "virtual-clients"): (
        [{"vectorised-clients": "on"}, {"vectorised-clients": "auto"}],
        {"vectorised-clients": "on", "virtual-clients": 4}),
    ("fedveca-tau-init", "fedveca-tau-max"): (
        [{"fedveca-tau-init": 30, "fedveca-tau-max": 25}, {"fedveca-tau-max": 10},
         {"strategy": "fedveca", "fedveca-tau-init": 51}],
        {"fedveca-tau-init": 25, "fedveca-tau-max": 25}),
    ("lr-schedule", "lr-decay"): (
        [{"lr-schedule": "exponential", "lr-decay": 1.5},
         {"lr-schedule": "step", "lr-decay": 2.0, "strategy": "dynamicfl"}],
        {"lr-schedule": "inverse", "lr-decay": 2.0}),
    ("over-commitment", "device-profiles"): ([{"over-commitment": 0.3}],
                                             {**CLOCK, "over-commitment": 0.3}),
    ("selection", "device-profiles"): ([{"selection": "oort"}, {"selection": "tifl"}],
                                       {**CLOCK, "selection": "tifl"}),
    ("virtual-clients", "partition-map"): (
        [{"virtual-clients": 6, "partition-map": "/keys/partitions.json"}],
        {"virtual-clients": 6}),
    ("round-deadline", "device-profiles"): ([{"round-deadline": 5.0}],
                                            {**CLOCK, "round-deadline": 5.0}),
    ("device-dropout", "device-profiles"): ([{"device-dropout": 0.2}],
                                            {**CLOCK, "device-dropout": 0.2}),
    ("device-partition-correlation", "device-profiles"): (
        [{"device-partition-correlation": 1.0}, {**CLOCK, "device-partition-correlation": 0.5}],
        {**FLASH, "device-partition-correlation": 1.0}),
    ("model-width", "model"): (
        [{"model-width": 0.5, "model": "lenet-gn"}], {"model-width": 0.5, "model": "resnet18-gn"}),
    ("width-rule", "round-deadline"): (
        [{"strategy": "heterofl", "width-rule": "deadline"}, {"width-rule": "deadline"}],
        {**CLOCK, "strategy": "fjord", "width-rule": "deadline", "round-deadline": 5.0}),
    ("round-deadline", "straggler-fraction"): (
        [{**CLOCK, "round-deadline": 5.0, "straggler-fraction": 0.5}],
        {**CLOCK, "straggler-fraction": 0.5}),
    ("dynamicfl-budget-seconds", "dynamicfl-budget-mode", "device-profiles"): (
        [{"strategy": "dynamicfl", "dynamicfl-budget-seconds": 5.0},
         {**CLOCK, "dynamicfl-budget-seconds": 5.0},
         {"dynamicfl-budget-mode": "budget", "dynamicfl-budget-seconds": 5.0}],
        {**CLOCK, "strategy": "dynamicfl", "dynamicfl-budget-mode": "budget",
         "dynamicfl-budget-seconds": 5.0}),
    ("fault-late-prob", "fault-crash-prob"): ([{"fault-crash-prob": 0.6, "fault-late-prob": 0.5}],
                                              {"fault-crash-prob": 0.6, "fault-late-prob": 0.4}),
    ("partition-seed", "seed", "partition"): (
        [{"partition": "dirichlet-niid-bench", "partition-seed": 2**32},
         {"partition": "dirichlet-niid-bench", "seed": 2**32}],
        {"partition": "dirichlet-niid-bench", "seed": 2**32, "partition-seed": 2020}),
}

# (key, strategies) whose constructor takes any value: the table is the only check there.
# Each entry is checked to still hold, so a constructor that starts checking shows up here.
LAX: dict[str, tuple[tuple[str, ...], str]] = {
    "fraction-train": (FLOWER, "Flower's FedAvg stores fraction_train as given"),
    "fraction-evaluate": (FLOWER, "Flower's FedAvg stores fraction_evaluate as given"),
    "min-available-nodes": (FLOWER, "Flower's FedAvg stores min_available_nodes"),
    "lr": (FEDOPT, "Flower's FedOpt stores eta_l as given"),
    "dynamicfl-server-budget": (DYNAMICFL, "DynamicFL stores server_budget as given"),
    # read always, checked by the policy's constructor only when `selection` names it
    "oort-preferred-duration": (SELECTING, "used only by selection='oort'"),
    "poc-candidates": (SELECTING, "used only by selection='power-of-choice'"),
    "poc-weighting": (SELECTING, "used only by selection='power-of-choice'"),
    "tifl-tiers": (SELECTING, "used only by selection='tifl'"),
}


def edges(key: Key) -> tuple[list, list]:
    """Values just inside and just outside the key's bounds, or its choices and others."""
    if key.name in PARSED:
        return PARSED[key.name]
    if key.type is bool:
        return [True, False], []
    if key.choices:
        return list(key.choices), ["", "none-such", key.choices[0].upper()]
    interval, integer = key.interval, key.type is int

    def step(value, direction):
        return value + direction if integer else math.nextafter(value, value + direction)

    low = interval.low
    inside = [step(low, 1) if interval.open_low else low]
    outside = [low if interval.open_low else step(low, -1)]
    if interval.high is None:
        inside.append(inside[0] + 1)  # well inside
    else:
        inside.append(step(interval.high, -1) if interval.open_high else interval.high)
        if interval.high != INT64_MAX:  # beyond that is a type error (tested below)
            outside.append(interval.high if interval.open_high else step(interval.high, 1))
    return inside, outside


def wrong_types(default: object) -> list:
    if isinstance(default, bool):
        return [1, "true", 1.0]
    if isinstance(default, int):
        return ["1", 1.5, True, 2**63, -(2**63) - 1]
    if isinstance(default, float):
        return ["0.5", True, math.inf, -math.inf, math.nan]
    return [1, 1.0, True]


def shown(key: str, value: object) -> str:
    """How a message shows ``value`` of ``key`` (an int given for a float key is a float)."""
    if BY_NAME[key].type is float and type(value) is int:
        value = float(value)
    return f"{key}={value!r}"


def refused(user_config: dict, keys: list[str]) -> str:
    """The ConfigError's message: it names ``keys`` with their values and carries a
    ``--run-config`` fix that names one of them (or only keys the user set) and passes."""
    with pytest.raises(ConfigError) as info:
        check_run_config(user_config)
    message = str(info.value)
    for key in keys:
        assert shown(key, user_config[key]) in message, message
    found = re.search(r'--run-config "([^"]*)"', message)
    assert found, f"no --run-config fix in {message!r}"
    fix = parse_config_args([found.group(1)])
    assert set(fix) & set(keys) or fix.keys() <= user_config.keys(), message
    check_run_config({**user_config, **fix})
    return message


# ----------------------------------------------------------------- the copies
def test_pyproject_has_the_tables_keys_in_order_with_its_defaults_and_types():
    """pyproject.toml's table is generated (python -m fedapp.config_docs --write): Flower
    passes on only the keys it lists."""
    text = (ROOT / "pyproject.toml").read_text()
    assert config_docs.with_pyproject_table(text) == text, (
        "run: python -m fedapp.config_docs --write")
    assert list(TOML) == [k.name for k in KEYS]
    for key in KEYS:
        assert TOML[key.name] == key.default and type(TOML[key.name]) is key.type, key.name
    assert check_run_config(TOML) == RunConfig() == RunConfig.from_user_config({})


def test_the_readme_table_is_the_generated_one():
    readme = (ROOT / config_docs.PAGE).read_text()
    assert config_docs.with_table(readme) == readme, (
        f"run: python -m fedapp.config_docs --write {config_docs.PAGE}")
    assert config_docs.main(["--check", str(ROOT / config_docs.PAGE)]) == 0


def test_the_table_names_only_registry_strategies_and_every_one():
    named = {s for k in KEYS for s in k.used_by} | {
        s for k in KEYS for only in k.only for s in only.strategies}
    assert named - {APP} <= set(STRATEGIES) == set(ALL)
    assert set(PARSED) == {k.name for k in KEYS if k.check}
    assert {rule.keys for rule in RULES} == set(RULE_CASES)


# ----------------------------------------------------------------- one key at a time
@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_a_key_takes_its_bounds_and_refuses_what_is_beyond_them(key):
    inside, outside = edges(key)
    context = CONTEXT.get(key.name, {})
    for value in inside:
        base = context(value) if callable(context) else context
        assert check_run_config({**base, key.name: value}).to_dict()[key.name] == value
    assert outside or key.type is bool
    base = context(None) if callable(context) else context
    for value in outside:
        message = refused({**base, key.name: value}, [key.name])
        assert key.allowed() in message
    for value in wrong_types(key.default):
        message = refused({**base, key.name: value}, [])
        assert f"{key.name}={value!r}" in message
        assert "finite" in message or "64 bits" in message or f"has type {type(value).__name__}" \
            f", expected {key.type.__name__}" in message


# ----------------------------------------------------------------- across keys
RULE_BREAKS = [(keys, user) for keys, (bad, _) in RULE_CASES.items() for user in bad]


@pytest.mark.parametrize("keys, user", RULE_BREAKS, ids=[str(u) for _, u in RULE_BREAKS])
def test_a_broken_rule_names_every_key_of_it(keys, user):
    message = refused(user, [])
    for key in keys:
        assert shown(key, {**TOML, **user}[key]) in message
    assert next(r.allowed for r in RULES if r.keys == keys) in message
    check_run_config(RULE_CASES[keys][1])


ONLY = [(key, only, strategy) for key in KEYS for only in key.only
        for strategy in only.strategies]


@pytest.mark.parametrize("key, only, strategy", ONLY,
                         ids=[f"{k.name}-{s}" for k, _, s in ONLY])
def test_a_value_a_strategy_cannot_honour_is_refused_naming_why(key, only, strategy):
    context = CONTEXT.get(key.name, {})
    if strategy in FLOWER and context == CLOCK:  # Flower's own classes take no clock
        context = {}
    base = {**context, **NEEDS.get(strategy, {}), "strategy": strategy}
    value = next(v for v in edges(key)[0] if v not in only.values)
    message = refused({**base, key.name: value}, [key.name, "strategy"])
    assert only.why in message
    for value in only.values:
        check_run_config({**base, key.name: value})


# ----------------------------------------------------------------- the constructors agree
def table_takes(user: dict) -> bool:
    try:
        RunConfig.from_user_config(user)
    except ConfigError:
        return False
    return True


def constructor_takes(user: dict) -> bool:
    """Whether the strategy's wiring and constructor take ``user`` (unchecked by the table)."""
    cfg = RunConfig(**{BY_NAME[k].field: v for k, v in user.items()})
    was_disabled, FLOWER_LOGGER.disabled = FLOWER_LOGGER.disabled, True
    try:
        STRATEGIES[cfg.strategy](cfg)
    except ValueError:
        return False
    finally:
        FLOWER_LOGGER.disabled = was_disabled
    return True


OWNED = [k for k in KEYS if set(k.used_by) - {APP}]


@pytest.mark.parametrize("key", OWNED, ids=lambda k: k.name)
def test_the_strategies_that_read_a_key_take_what_the_table_takes_and_refuse_the_rest(key):
    inside, outside = edges(key)
    lax_for, _ = LAX.get(key.name, ((), ""))
    for strategy in sorted(set(key.used_by) - {APP}):
        for value in inside + outside:
            user = {**CONTEXT.get(key.name, {}), **NEEDS.get(strategy, {}),
                    "strategy": strategy, key.name: value}
            table, constructor = table_takes(user), constructor_takes(user)
            if strategy in lax_for and not table:
                assert constructor, f"{strategy} now refuses {key.name}={value!r}: drop LAX"
                continue
            assert table == constructor, (strategy, key.name, value, table, constructor)


def test_every_lax_entry_is_a_key_the_strategy_reads():
    for name, (strategies, _) in LAX.items():
        assert set(strategies) <= set(BY_NAME[name].used_by), name


class Reads:
    """A RunConfig that records which fields are read."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.fields = cfg, set()

    def __getattr__(self, name: str) -> object:
        self.fields.add(name)
        return getattr(self.cfg, name)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_used_by_names_exactly_the_keys_a_strategys_wiring_reads(strategy, monkeypatch):
    """Beyond the train config every client gets (the app's keys)."""
    train_config = registry.train_config
    monkeypatch.setattr(registry, "train_config", lambda cfg: train_config(cfg.cfg))
    clock = {} if strategy in FLOWER else CLOCK  # the generator's keys are read for a fleet
    cfg = RunConfig.from_user_config({**clock, **NEEDS.get(strategy, {}), "strategy": strategy})
    reads = Reads(cfg)
    STRATEGIES[strategy](reads)
    assert reads.fields == {k.field for k in KEYS if strategy in k.used_by}


# ----------------------------------------------------------------- what the build adds
def test_a_device_trace_that_does_not_load_is_named_with_a_fix(tmp_path):
    refused({"device-profiles": "/nonexistent/fleet.csv"}, ["device-profiles"])
    empty = tmp_path / "fleet.json"
    empty.write_text("[]")
    message = refused({"device-profiles": str(empty)}, ["device-profiles"])
    assert "lists no device" in message


def test_a_value_the_table_misses_is_still_stopped_naming_the_strategy():
    cfg = RunConfig(strategy="fedprox", proximal_mu=-1.0)  # not validated
    with pytest.raises(ConfigError, match=r"strategy='fedprox' cannot be built from this run "
                                          r"config: proximal_mu must be >= 0"):
        build_strategy(cfg)
