"""HeteroFL, FjORD and FedRolex through the real ``flwr run . --stream`` on Flower's simulation
engine (Ray), tiny configs with widths 1 and 0.5 under the fixed rule: every round's
client-widths are partition p -> levels[p mod 2], no client fails, the global model's and each
width's accuracy are logged, and the models are the in-process run's, bit for bit. FedRolex
runs packed (4 virtual clients on 2 SuperNodes). Isolated FLWR_HOME and ports; the managed
local SuperLink is stopped by PID afterwards (simulation.runtime)."""

from __future__ import annotations

import math

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C
from tests.deployed import run_in_process

pytestmark = pytest.mark.usefixtures("processes", "processes")

LEVELS = (1.0, 0.5)  # width-levels "1,0.5", sorted largest first
CONFIG = {"num-server-rounds": 2, "dataset": "synthetic", "model": "mlp-2nn",
          "partition": "iid", "local-steps": 2, "batch-size": 8, "eval-batch-size": 2000,
          "width-levels": "1,0.5", "width-rule": "fixed", "drift-diagnostics": False}
# strategy: (clients, SuperNodes, extra run config); fedrolex packed: 4 virtual clients
CASES = {
    "heterofl": (2, 2, {}),
    "fjord": (2, 2, {}),
    "fedrolex": (4, 2, {"virtual-clients": 4}),
}


def fixed_widths(clients: int) -> dict[str, float]:
    """The fixed rule's assignment: partition p trains levels[p mod L]."""
    return {str(p): LEVELS[p % len(LEVELS)] for p in range(clients)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", sorted(CASES))
def test_flwr_run_trains_each_partition_at_its_fixed_width(strategy, tmp_path):
    clients, supernodes, extra = CASES[strategy]
    config = {**CONFIG, "strategy": strategy, "min-available-nodes": clients}
    expected = [r[C.LOG_MODEL_SHA256] for r in read_rounds(
        run_in_process({**config, "output-dir": str(tmp_path / "inproc")}, clients))]

    out, home = tmp_path / "runs", tmp_path / "flwr-home"
    result = run_app({**config, **extra, "output-dir": str(out)},
                     {"num-supernodes": supernodes, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=480, isolate_ports=True, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert result.returncode == 0
    assert local_superlink_pids(home) == []
    if extra:
        assert f"Packed simulation: {clients} virtual clients" in result.output
    (run_dir,) = list(out.iterdir())
    assert (run_dir / "final_model.pt").is_file()
    rounds = read_rounds(run_dir)
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    widths = fixed_widths(clients)
    counts = {"1": (clients + 1) // 2, "0.5": clients // 2}
    for r in rounds[1:]:
        assert r[C.LOG_CLIENT_WIDTHS] == widths
        assert r[C.LOG_WIDTH_COUNTS] == counts and r[C.LOG_WIDTH_RULE] == "fixed"
        assert r[C.LOG_CLIENTS_SAMPLED] == r[C.LOG_CLIENTS_RECEIVED] == clients
        assert r[C.LOG_CLIENTS_FAILED] == 0
    for r in rounds:  # eval-every = 1: every round, round 0 included, is evaluated
        assert math.isfinite(r[C.LOG_ACCURACY]) and 0 <= r[C.LOG_ACCURACY] <= 1
        assert math.isfinite(r[C.LOG_LOSS])
        assert set(r[C.LOG_WIDTH_ACCURACY]) == {"0.5", "1"}
        assert all(math.isfinite(a) for a in r[C.LOG_WIDTH_ACCURACY].values())
        assert r[C.LOG_WIDTH_ACCURACY]["1"] == r[C.LOG_ACCURACY]  # width 1: the global model
    assert [r[C.LOG_MODEL_SHA256] for r in rounds] == expected
    assert "rejected" not in result.output
