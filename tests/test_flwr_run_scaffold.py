"""Real ``flwr run . --stream`` on Flower's simulation engine (Ray), tiny configs: SCAFFOLD,
whose c_i must persist per node in Context.state across rounds in the Ray actors, and one of
Flower's own server optimisers by name. Isolated FLWR_HOME and ports; the managed local
SuperLink is stopped by PID afterwards (simulation.runtime)."""

from __future__ import annotations

import math

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")

FEDERATION = {"num-supernodes": 2, "client-resources-num-cpus": 1}


def test_flwr_run_scaffold_carries_c_i_in_context_state(tmp_path):
    out, home = tmp_path / "runs", tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 3, "strategy": "scaffold", "local-steps": 5, "momentum": 0.9,
         "partition": "dirichlet", "drift-diagnostics": False, "output-dir": str(out)},
        FEDERATION, flwr_home=home, timeout=480, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2, 3]
    # rounds 2 and 3 started from the c_i each node kept in Context.state (never resent), and
    # the server's copies (digests checked on every reply) agreed: no reply was rejected
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0, 0], [1, 1], [2, 2]]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 and r[C.LOG_CLIENTS_RECEIVED] == 2
               for r in rounds[1:])
    assert all(r[C.LOG_SCAFFOLD_C_NORM] > 0 for r in rounds[1:])
    assert "rejected" not in result.output and "ClientStateLost" not in result.output
    assert local_superlink_pids(home) == []


def test_flwr_run_flowers_fedadam_by_name(tmp_path):
    out, home = tmp_path / "runs", tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 2, "strategy": "fedadam", "server-lr": 0.01, "local-steps": 5,
         "partition": "iid", "output-dir": str(out)},
        FEDERATION, flwr_home=home, timeout=480, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    assert all(math.isfinite(r[C.LOG_LOSS]) for r in rounds)
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]
    assert "FedOpt settings" in result.output  # Flower's own class logged its summary
    assert local_superlink_pids(home) == []
