"""Oort selection through the whole app: one tiny config in process, through the real
``flwr run . --stream`` on Flower's simulation engine (Ray), and on a real SuperLink with four
SuperNodes. The run log carries each round's choice; for a fixed seed the three make the same
selections and the same models, and the policy learns from the stock train replies' losses
(no warning about missing losses)."""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C
from tests.deployed import run_deployed, run_in_process

pytestmark = pytest.mark.usefixtures("deployment")

CONFIG = {"num-server-rounds": 3, "strategy": "fedavg", "selection": "oort",
          "device-profiles": "lognormal", "fraction-train": 0.5, "fraction-evaluate": 0.0,
          "min-available-nodes": 4, "dataset": "synthetic", "model": "mlp-2nn",
          "local-steps": 2, "batch-size": 8, "drift-diagnostics": False}


def selections(run_dir) -> list[tuple]:
    """Per round: the chosen clients, Oort's epsilon and T, and the model's digest."""
    return [(r.get(C.LOG_SELECTION_CHOSEN), r.get(C.LOG_OORT_EPSILON),
             r.get(C.LOG_OORT_PREFERRED_SECONDS), r[C.LOG_MODEL_SHA256])
            for r in read_rounds(run_dir)]


@pytest.mark.timeout(2400)
def test_oort_selects_the_same_clients_in_process_in_simulation_and_on_supernodes(tmp_path):
    expected = selections(run_in_process({**CONFIG, "output-dir": str(tmp_path / "inproc")}, 4))

    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app({**CONFIG, "output-dir": str(out)},
                     {"num-supernodes": 4, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=480, isolate_ports=True, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert local_superlink_pids(home) == []
    run_dir = next(out.iterdir())
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for r in rounds[1:]:
        assert r[C.LOG_SELECTION] == "oort" and len(r[C.LOG_SELECTION_CHOSEN]) == 2
        assert r[C.LOG_CLIENTS_SAMPLED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0
        assert r[C.LOG_OORT_EPSILON] > 0 and r[C.LOG_OORT_PREFERRED_SECONDS] > 0
    assert rounds[1][C.LOG_OORT_EPSILON] == 0.9
    assert "reported no training loss" not in result.output
    assert selections(run_dir) == expected

    deployed = tmp_path / "deployment"
    (result,) = run_deployed(tmp_path, 4, [{**CONFIG, "output-dir": str(deployed)}])
    assert result.status == "finished:completed", result.output[-4000:]
    assert selections(next(deployed.iterdir())) == expected
