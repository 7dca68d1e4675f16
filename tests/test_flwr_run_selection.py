"""One real ``flwr run . --stream`` with Oort selection on Flower's simulation engine (Ray),
tiny config: the run log carries each round's choice, and the policy learns from the stock
train replies' losses (no warning about missing losses)."""

from __future__ import annotations

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C


def test_flwr_run_oort_four_supernodes_three_rounds(tmp_path):
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {
            "num-server-rounds": 3,
            "strategy": "fedavg",
            "selection": "oort",
            "device-profiles": "lognormal",
            "fraction-train": 0.5,
            "fraction-evaluate": 0.0,
            "min-available-nodes": 4,
            "dataset": "synthetic",
            "model": "mlp-2nn",
            "local-steps": 2,
            "batch-size": 8,
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
    rounds = read_rounds(next(out.iterdir()))
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for r in rounds[1:]:
        assert r[C.LOG_SELECTION] == "oort" and len(r[C.LOG_SELECTION_CHOSEN]) == 2
        assert r[C.LOG_CLIENTS_SAMPLED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0
        assert r[C.LOG_OORT_EPSILON] > 0 and r[C.LOG_OORT_PREFERRED_SECONDS] > 0
    assert rounds[1][C.LOG_OORT_EPSILON] == 0.9
    assert "reported no training loss" not in result.output
    assert local_superlink_pids(home) == []
