"""Per-round learning-rate schedules (strategies/engine/schedules.py) by hand, and in a run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from strategies import DynamicFL, FedAvg, FedVeca
from strategies import contract as C
from strategies.engine import schedules as S
from tests.inprocess import InProcessGrid
from tests.messages import record


def test_hand_computed_values():
    assert S.constant_lr(7, 0.1) == 0.1
    assert S.exponential_lr(1, 0.1, 0.5) == 0.1 and S.exponential_lr(3, 0.1, 0.5) == 0.025
    assert S.exponential_lr(3, 0.1, 0.99) == pytest.approx(0.09801)  # McMahan et al.
    assert S.inverse_lr(1, 0.1, 1.0) == 0.1 and S.inverse_lr(4, 0.1, 1.0) == 0.025
    assert S.inverse_lr(3, 0.3, 0.5) == pytest.approx(0.15)  # 0.3 / (1 + 0.5 * 2)
    assert [S.step_lr(t, 0.8, 0.5, 2) for t in range(1, 6)] == [0.8, 0.8, 0.4, 0.4, 0.2]
    assert S.cosine_lr(1, 800, 0.01) == pytest.approx(0.01)
    assert S.cosine_lr(401, 800, 0.01) == pytest.approx(1e-4 + (0.01 - 1e-4) / 2)
    assert S.cosine_lr(801, 800, 0.01) == pytest.approx(1e-4)


def test_inverse_is_li_et_al_beta_over_t_plus_gamma():
    lr0, a = 0.2, 0.25
    beta, gamma = lr0 / a, 1 / a - 1
    for t in range(1, 20):
        assert S.inverse_lr(t, lr0, a) == pytest.approx(beta / (t + gamma))


@pytest.mark.parametrize("name", S.SCHEDULES)
def test_lrschedule_calls_the_pure_functions_and_starts_at_lr0(name):
    sched = S.LRSchedule(name, decay=0.5, step_every=2, lr_min=0.0, num_rounds=4)
    assert sched(1, 0.4) == 0.4
    expected = {"constant": 0.4, "exponential": 0.1, "inverse": 0.2, "step": 0.2,
                "cosine": 0.4 * (1 + math.cos(math.pi * 2 / 4)) / 2}[name]
    assert sched(3, 0.4) == pytest.approx(expected)


@pytest.mark.parametrize("kwargs", [{"name": "linear"}, {"decay": 0.0}, {"decay": math.nan},
                                    {"name": "exponential", "decay": 1.5},
                                    {"name": "step", "decay": 1.01}, {"step_every": 0},
                                    {"step_every": 1.5}, {"lr_min": -1.0}, {"num_rounds": 0}])
def test_bad_parameters_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        S.LRSchedule(**kwargs)


def test_inverse_takes_a_above_one():
    assert S.LRSchedule("inverse", decay=2.0)(2, 0.3) == pytest.approx(0.1)


def test_round_lr_rejects_non_positive():
    with pytest.raises(ValueError, match="finite number > 0"):
        S.round_lr(lambda t, lr0: 0.0, 1, 0.1)


def test_fedavg_schedule_arguments():
    assert FedAvg().lr_schedule is None
    assert FedAvg(lr_schedule="exponential").lr_schedule == S.LRSchedule("exponential")
    with pytest.raises(ValueError, match="num_rounds"):
        FedAvg(lr_schedule="cosine")
    with pytest.raises(ValueError, match="lr_schedule"):
        FedAvg(lr_schedule=3)
    with pytest.raises(ValueError, match="not both"):
        DynamicFL(intervals="a", local_steps=2, cosine_lr_min=1e-3, lr_schedule="inverse")


def _configure(strategy, server_round, config):
    arrays = record({"w": np.zeros(2, dtype=np.float32)})
    grid = InProcessGrid(client_app, 3, {})  # configure_train without the query calls no app
    return list(strategy.configure_train(server_round, arrays, config, grid))


def test_fedavg_sends_lr_t_keeps_lr0_and_logs_it():
    s = FedAvg(lr_schedule=lambda t, lr0: lr0 / t, min_available_nodes=1)
    config = ConfigRecord({C.LR: 0.3})
    for t in (1, 2, 3):
        messages = _configure(s, t, config)
        assert {m.content[C.CONFIG][C.LR] for m in messages} == {0.3 / t}
        assert s.round_log(t)[C.LOG_LR] == pytest.approx(0.3 / t)
    assert config[C.LR] == 0.3  # lr_0 stays in the caller's record


def test_fedavg_without_schedule_sends_the_config_unchanged():
    s = FedAvg(min_available_nodes=1)
    config = ConfigRecord({C.LR: 0.3})
    messages = _configure(s, 2, config)
    assert all(m.content[C.CONFIG] is config for m in messages)
    assert s.round_log(2)[C.LOG_LR] == 0.3
    with pytest.raises(ValueError, match="no 'lr'"):
        _configure(FedAvg(lr_schedule="inverse", min_available_nodes=1), 1, ConfigRecord())


def test_fedveca_eq15_eta_is_the_rounds_lr():
    """FedVeca's A_(k,i) (eq. 15) reads eta from each node's sent config: lr_t."""
    s = FedVeca(lr_schedule=S.LRSchedule("exponential", decay=0.5), min_available_nodes=1)
    _configure(s, 3, ConfigRecord({C.LR: 0.4}))
    assert {float(t.config[C.LR]) for t in s.plans[3].tasks.values()} == {0.1}
    assert s.plans[3].config[C.LR] == 0.1  # the round's eta in eq. (15) and eta tau_k L


def test_dynamicfl_round_lr():
    s = DynamicFL(intervals="a", local_steps=2, cosine_lr_min=1e-3)
    with pytest.raises(ValueError, match="num_rounds"):  # T is known once start() runs
        s.round_lr(5, 0.05)
    s.total_rounds = 10
    assert s.round_lr(5, 0.05) == S.cosine_lr(5, 10, 0.05, 1e-3)
    assert DynamicFL(intervals="a", local_steps=2).round_lr(5, 0.05) == 0.05
    s = DynamicFL(intervals="a", local_steps=2, lr_schedule="exponential")
    assert s.round_lr(3, 0.1) == pytest.approx(0.1 * 0.99**2)


# ----------------------------------------------------------------- in-process app run
class _RecordingGrid(InProcessGrid):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent_lr: list[tuple[int, float]] = []

    def deliver(self, msg, timeout=None):
        config = msg.content.config_records.get(C.CONFIG)
        if config is not None and C.LR in config and C.SERVER_ROUND in config:
            self.sent_lr.append((int(config[C.SERVER_ROUND]), float(config[C.LR])))
        return super().deliver(msg, timeout=timeout)


@pytest.mark.usefixtures("processes")
def test_app_exponential_schedule_reaches_clients_and_run_log(tmp_path):
    rc = {"num-server-rounds": 3, "dataset": "synthetic", "model": "mlp-2nn", "local-steps": 1,
          "batch-size": 10, "lr": 0.08, "lr-schedule": "exponential", "lr-decay": 0.5,
          "eval-batch-size": 2000, "output-dir": str(tmp_path)}
    grid = _RecordingGrid(client_app, 2, rc)
    server_app(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                             run_config=dict(rc)))
    expected = {t: 0.08 * 0.5 ** (t - 1) for t in (1, 2, 3)}
    assert sorted({t for t, _ in grid.sent_lr}) == [1, 2, 3]
    assert all(lr == expected[t] for t, lr in grid.sent_lr)
    (run_dir,) = list(tmp_path.iterdir())
    logged = {r[C.LOG_ROUND]: r.get(C.LOG_LR) for r in read_rounds(run_dir)}
    assert {t: logged[t] for t in (1, 2, 3)} == expected
