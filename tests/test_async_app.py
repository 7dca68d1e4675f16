"""FedBuff through the whole app: one tiny config (4 partitions, a log-normal fleet, 3 clients
training at once, K = 2) in process, through the real ``flwr run`` on the simulation engine,
and on a real SuperLink with four SuperNodes. In simulated arrival order the three give the
same model bits and the same staleness every round; a real-time-order run on the same
SuperNodes completes and says it is not reproducible. FedAsync runs under ``flwr run``.

Isolated FLWR_HOMEs, free ports, bounded timeouts; every process started here is stopped by
PID (the deployment fixture checks them gone).
"""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C
from tests.deployed import run_deployed, run_in_process

pytestmark = pytest.mark.usefixtures("deployment")

BASE = {"num-server-rounds": 3, "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid",
        "local-steps": 5, "batch-size": 10, "eval-batch-size": 2000, "seed": 1,
        "min-available-nodes": 4, "strategy": "fedbuff", "async-concurrency": 3,
        "fedbuff-buffer-size": 2, "device-profiles": "lognormal", "device-sigma": 1.0,
        "drift-diagnostics": False}


def trace(run_dir) -> list[tuple]:
    """Per round: the model's digest, the staleness of the applied updates, sim-elapsed."""
    return [(r[C.LOG_MODEL_SHA256], r.get(C.LOG_STALENESS), r.get(C.LOG_SIM_ELAPSED))
            for r in read_rounds(run_dir)]


@pytest.mark.timeout(2400)
def test_fedbuff_gives_the_same_bits_in_process_in_simulation_and_on_supernodes(tmp_path):
    inprocess_dir = run_in_process({**BASE, "output-dir": str(tmp_path / "inprocess")}, 4)
    expected = trace(inprocess_dir)
    assert len(expected) == 4 and len({t[0] for t in expected}) == 4  # a new model each round
    assert any(max(t[1]) > 0 for t in expected[1:]), "some update was stale"

    simulated = tmp_path / "simulation"
    home = tmp_path / "flwr-home"
    result = run_app({**BASE, "output-dir": str(simulated)},
                     {"num-supernodes": 4, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=600, isolate_ports=True, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert local_superlink_pids(home) == []
    (simulated_dir,) = simulated.iterdir()
    assert trace(simulated_dir) == expected

    deployed, real_time = tmp_path / "deployment", tmp_path / "real-time"
    results = run_deployed(tmp_path, 4, [
        {**BASE, "output-dir": str(deployed)},
        {**BASE, "async-arrival": "real-time", "output-dir": str(real_time)}])
    for result in results:
        assert result.status == "finished:completed", result.output[-4000:]
    assert "not reproducible" in results[1].output
    (deployed_dir,) = deployed.iterdir()
    assert trace(deployed_dir) == expected
    (real_time_dir,) = real_time.iterdir()
    rounds = read_rounds(real_time_dir)
    assert [r[C.LOG_BUFFER_FILL] for r in rounds[1:]] == [2, 2, 2]
    assert all(0 <= r["accuracy"] <= 1 for r in rounds)


def test_flwr_run_fedasync(tmp_path):
    out, home = tmp_path / "runs", tmp_path / "flwr-home"
    result = run_app({**BASE, "strategy": "fedasync", "fedasync-updates-per-round": 3,
                      "output-dir": str(out)},
                     {"num-supernodes": 4, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=600, isolate_ports=True, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert local_superlink_pids(home) == []
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_CLIENT_UPDATES] for r in rounds[1:]] == [3, 6, 9]
    assert [r[C.LOG_MODEL_VERSION] for r in rounds[1:]] == [3, 6, 9]
    assert "FedAsync" in result.output
