"""A bad run config through the real ``flwr run . --stream``: one clear message, no run
directory. (Runs that complete under ``flwr run`` are the rows of
``tests/test_runtime_matrix.py``.)

Isolated FLWR_HOME and ports, offline flags; the managed local SuperLink it starts is
stopped by PID afterwards (simulation.runtime.stop_local_superlink).
"""

from __future__ import annotations

import pytest

from simulation.runtime import local_superlink_pids, run_app

pytestmark = pytest.mark.usefixtures("processes")


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

