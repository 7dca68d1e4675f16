"""Flower's FedAvgM, FedAdam, FedYogi and FedAdagrad by name in the app
(strategies.algorithms.flower_optimizers, fedapp.registry): built from the run config, an in-process
run each, their state through a checkpoint, and Flower's defaults."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest
from flwr.serverapp import strategy as flower

from fedapp.config import RunConfig
from fedapp.registry import FLOWER_STRATEGIES, build_strategy
from strategies import contract as C
from strategies.algorithms import flower_optimizers as opt
from tests.reliability_common import run, same_model, without_timings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLASSES = {"fedavgm": (opt.FedAvgM, flower.FedAvgM), "fedadam": (opt.FedAdam, flower.FedAdam),
           "fedyogi": (opt.FedYogi, flower.FedYogi),
           "fedadagrad": (opt.FedAdagrad, flower.FedAdagrad)}
# eta = server-lr: 1.0 is plain averaging for FedAvgM, far too large for the adaptive ones
SERVER_LR = {"fedavgm": 1.0, "fedadam": 0.01, "fedyogi": 0.01, "fedadagrad": 0.01}


@pytest.mark.parametrize("name", FLOWER_STRATEGIES)
def test_built_from_the_run_config_as_flowers_class(name):
    values = {"strategy": name, "server-lr": 0.05, "lr": 0.02, "fraction-train": 0.5}
    if name == "fedavgm":
        values["server-momentum"] = 0.9
    else:
        values["server-tau"] = 1e-4
    if name in ("fedadam", "fedyogi"):
        values.update({"server-beta1": 0.8, "server-beta2": 0.95})
    cfg = RunConfig.from_user_config(values)
    strategy, config = build_strategy(cfg)
    ours, theirs = CLASSES[name]
    assert type(strategy) is ours and isinstance(strategy, theirs)
    assert strategy.fraction_train == 0.5 and strategy.min_train_nodes == 1
    assert config[C.LR] == 0.02
    if name == "fedavgm":
        assert strategy.server_learning_rate == 0.05 and strategy.server_momentum == 0.9
        return
    assert (strategy.eta, strategy.eta_l, strategy.tau) == (0.05, 0.02, 1e-4)
    if name == "fedadagrad":
        assert (strategy.beta_1, strategy.beta_2) == (0.0, 0.0)  # Flower's: no moments
    else:
        assert (strategy.beta_1, strategy.beta_2) == (0.8, 0.95)


def test_new_keys_have_flowers_defaults():
    defaults = RunConfig()
    for cls in (flower.FedAdam, flower.FedYogi):
        params = inspect.signature(cls.__init__).parameters
        assert params["beta_1"].default == defaults.server_beta1
        assert params["beta_2"].default == defaults.server_beta2
    for cls in (flower.FedAdam, flower.FedYogi, flower.FedAdagrad):
        assert inspect.signature(cls.__init__).parameters["tau"].default == defaults.server_tau
    params = inspect.signature(flower.FedAvgM.__init__).parameters
    assert params["server_learning_rate"].default == defaults.server_lr
    assert params["server_momentum"].default == defaults.server_momentum


def test_the_default_server_lr_warns_for_the_adaptive_ones(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        build_strategy(RunConfig.from_user_config({"strategy": "fedyogi"}))
    assert any("FedYogi: eta = server-lr = 1.0" in r.getMessage() and "server-lr=0.01"
               in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cls, kwargs, says", [
    (opt.FedAdam, {"beta_1": 1.0}, "beta_1"), (opt.FedYogi, {"beta_2": -0.1}, "beta_2"),
    (opt.FedAdagrad, {"tau": 0.0}, "tau"), (opt.FedAdam, {"eta": float("nan")}, "eta"),
    (opt.FedAvgM, {"server_momentum": 1.0}, "server_momentum"),
    (opt.FedAvgM, {"server_learning_rate": 0.0}, "server_learning_rate"),
])
def test_parameters_are_checked(cls, kwargs, says):
    with pytest.raises(ValueError, match=says):
        cls(**kwargs)


@pytest.mark.parametrize("name", FLOWER_STRATEGIES)
@pytest.mark.usefixtures("processes")
def test_in_process_run_with_our_client_app_writes_our_run_log(name, tmp_path):
    _, run_dir, rounds, model = run(name, tmp_path, 3, **{"num-server-rounds": 2,
                                                          "server-lr": SERVER_LR[name]})
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    assert all(np.isfinite(r[C.LOG_LOSS]) for r in rounds)
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]
    assert (run_dir / "final_model.pt").is_file() and (run_dir / "config.json").is_file()


@pytest.mark.parametrize("name", ["fedavgm", "fedadam"])
@pytest.mark.usefixtures("processes")
def test_resume_continues_the_optimizer_state_bit_for_bit(name, tmp_path):
    """The checkpoint of round 2 holds momentum / m_t, v_t; the resumed rounds 3-4 equal an
    uninterrupted run's (in-process: fixed node ids, Python's random restored)."""
    extra = {"server-lr": SERVER_LR[name], "server-momentum": 0.5 if name == "fedavgm" else 0.0,
             "fault-crash-prob": 0.2, "seed": 1}
    _, _, full, full_model = run(name, tmp_path / "full", 3, **extra,
                                 **{"num-server-rounds": 4})
    _, half_dir, _, _ = run(name, tmp_path / "half", 3, **extra,
                            **{"num-server-rounds": 2, "checkpoint-every": 2})
    _, _, resumed, resumed_model = run(name, tmp_path / "resumed", 3, **extra,
                                       **{"num-server-rounds": 4, "resume-from": str(half_dir)})
    assert without_timings(resumed) == without_timings(full)
    assert same_model(resumed_model, full_model)


def test_state_dict_maps_flowers_attributes():
    strategy = opt.FedAdam()
    strategy.current_arrays = {"w": np.ones(2)}
    strategy.m_t, strategy.v_t = {"w": np.full(2, 0.1)}, {"w": np.full(2, 0.01)}
    state = strategy.state_dict()
    other = opt.FedAdam()
    other.load_state_dict(state)
    assert other.m_t["w"][0] == 0.1 and other.v_t["w"][0] == 0.01
    state["m_t"]["dict"]["w"][0] = 5.0
    assert strategy.m_t["w"][0] == 0.1  # copies
    with pytest.raises(ValueError, match="FedYogi"):
        opt.FedYogi().load_state_dict(state)
    momentum = opt.FedAvgM(server_momentum=0.5)
    momentum.momentum_vector = [np.ones(3)]
    restored = opt.FedAvgM(server_momentum=0.5)
    restored.load_state_dict(momentum.state_dict())
    assert restored.momentum_vector[0].tolist() == [1.0, 1.0, 1.0]
