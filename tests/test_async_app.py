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
import torch
from flwr.app import Context, RecordDict

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from simulation.runtime import descendants, is_alive, local_superlink_pids, run_app
from strategies import contract as C
from tests.inprocess import InProcessGrid

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
    inprocess = tmp_path / "inprocess"
    rc = {**BASE, "output-dir": str(inprocess)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Ray actor and SuperNode here: the same float sums
    try:
        server_app(InProcessGrid(client_app, 4, rc),
                   Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                           run_config=rc))
    finally:
        torch.set_num_threads(threads)
    (inprocess_dir,) = inprocess.iterdir()
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
    deployment = LocalDeployment(DeploySpec(num_supernodes=4, num_threads=1), Layout(tmp_path / "deploy"),
                                 start_timeout=120)
    pids: list[int] = []
    try:
        deployment.start()
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        result = run_on_connection(deployment.spec.connection, deployment.cli_env,
                                   {**BASE, "output-dir": str(deployed)}, timeout=900,
                                   capture=True)
        assert result.status == "finished:completed", result.output[-4000:]
        result = run_on_connection(deployment.spec.connection, deployment.cli_env,
                                   {**BASE, "async-arrival": "real-time",
                                    "output-dir": str(real_time)}, timeout=900, capture=True)
        assert result.status == "finished:completed", result.output[-4000:]
        assert "not reproducible" in result.output
    finally:
        deployment.stop()
    assert not [pid for pid in pids if is_alive(pid)], "processes left running after stop()"
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
