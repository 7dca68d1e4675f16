"""One real ``flwr run . --stream`` of DynamicFL on Flower's simulation engine (Ray), tiny config.

Checks what the in-process tests cannot: Grid.push_messages / pull_messages of the
simulation engine's InMemoryGrid, and Context.state (the momentum) persisting per node
across chunk messages in the Ray actors. Isolated FLWR_HOME and ports; the managed local
SuperLink is stopped by PID afterwards (simulation.runtime).
"""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")


def test_flwr_run_dynamicfl_four_supernodes_one_round(tmp_path):
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {
            "num-server-rounds": 1,
            "strategy": "dynamicfl",
            "dynamicfl-intervals": "b-c",
            "dynamicfl-local-steps": 8,
            "dynamicfl-beta": 0.5,
            "fraction-train": 1.0,
            "min-available-nodes": 4,
            "partition": "dirichlet",
            "dirichlet-alpha": 0.3,
            "model": "cnn-small",
            "batch-size": 16,
            "momentum": 0.9,
            "drift-diagnostics": False,
            "output-dir": str(out),
        },
        {"num-supernodes": 4, "client-resources-num-cpus": 1},
        flwr_home=home,
        timeout=480,
        isolate_ports=True,
        capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    assert result.returncode == 0
    rounds = read_rounds(next(out.iterdir()))
    assert [r["round"] for r in rounds] == [0, 1]
    r = rounds[1]
    z = r[C.LOG_DYNAMICFL_GROUP_SIZE]
    assert 0 <= z <= 2 and r[C.LOG_CLIENTS_SAMPLED] == 4 and r[C.LOG_CLIENTS_FAILED] == 0
    syncs = 2 * z + 1 * (4 - z)  # 'b' = 4 steps: 2 syncs in L = 8; 'c' = 16 capped at 8: 1 sync
    assert r["syncs"] == syncs and abs(r[C.LOG_KAPPA_HAT] - syncs / 32) < 1e-12
    assert r[C.LOG_SYNC_EVENTS] == (2 if z else 1) and r[C.LOG_SECONDS_PER_EVENT] > 0
    assert r[C.LOG_BYTES_UP] == r[C.LOG_BYTES_DOWN] > 0 and 0 <= r["accuracy"] <= 1
    assert "DynamicFL" in result.output
    assert local_superlink_pids(home) == []
