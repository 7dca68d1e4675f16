"""One real ``flwr run . --stream`` on Flower's simulation engine (Ray), tiny config.

Isolated FLWR_HOME and ports, offline flags; the managed local SuperLink it starts is
stopped by PID afterwards (simulation.runtime.stop_local_superlink).
"""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")


def test_flwr_run_two_supernodes_two_rounds(tmp_path):
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 2, "local-steps": 5, "partition": "iid", "output-dir": str(out)},
        {"num-supernodes": 2, "client-resources-num-cpus": 1},
        flwr_home=home, timeout=420, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    assert result.returncode == 0
    runs = list(out.iterdir())
    assert len(runs) == 1
    rounds = read_rounds(runs[0])
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r[C.LOG_CLIENTS_SAMPLED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0 for r in rounds[1:])
    assert (runs[0] / "final_model.pt").is_file()
    assert "Per-round results" in result.output
    assert local_superlink_pids(home) == []  # the managed SuperLink we started is gone


def test_flwr_run_bad_config_fails_with_one_clear_message(tmp_path):
    home = tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 1, "dirichlet-alpha": 0.0, "output-dir": str(tmp_path / "runs")},
        {"num-supernodes": 2, "client-resources-num-cpus": 1},
        flwr_home=home, timeout=300, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:failed"
    assert result.returncode == 1
    assert "dirichlet-alpha=0.0 is not allowed; it must be a number > 0" in result.output
    assert not (tmp_path / "runs").exists()
    assert local_superlink_pids(home) == []


def test_flwr_run_fednova_with_stragglers(tmp_path):
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 2, "strategy": "fednova", "straggler-fraction": 0.5, "local-steps": 6,
         "partition": "dirichlet", "output-dir": str(out)},
        {"num-supernodes": 2, "client-resources-num-cpus": 1},
        flwr_home=home, timeout=420, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert r[C.LOG_CLIENTS_STRAGGLERS] == 1 and r[C.LOG_CLIENTS_RECEIVED] == 2
        assert max(r["local-steps"]) == 6 and 1 <= min(r["local-steps"]) <= 6
        assert r[C.LOG_TAU_EFF] > 0
    assert local_superlink_pids(home) == []
