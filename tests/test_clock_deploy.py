"""The same simulated clock in simulation and deployment: one tiny config (2 partitions, a
log-normal fleet, a deadline that cuts one client's work to about half) through the real ``flwr run`` on the
simulation engine, a real SuperLink with two SuperNodes, and the in-process Grid; the
``sim-seconds`` of every round must be equal, and one client must have been cut.

Isolated FLWR_HOMEs, free ports, bounded timeouts; every process started here is stopped by
PID (the deployment fixture checks them gone).
"""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, Context, RecordDict

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.client_app import app as client_app
from fedapp.run_log import read_rounds
from fedapp.server_app import app as server_app
from simulation.runtime import descendants, is_alive, local_superlink_pids, run_app
from strategies import contract as C
from strategies.engine.clock import client_seconds
from strategies.engine.devices import GeneratedFleet
from task.data import load_dataset
from task.devices import seconds_per_example
from task.models import build_model
from tests.inprocess import InProcessGrid

pytestmark = pytest.mark.usefixtures("deployment")

STEPS, BATCH, SEED = 1000, 10, 0
BASE = {"num-server-rounds": 2, "dataset": "synthetic", "model": "mlp-2nn", "partition": "iid",
        "local-steps": STEPS, "batch-size": BATCH, "eval-batch-size": 2000, "seed": SEED,
        "min-available-nodes": 2, "strategy": "fedprox", "device-profiles": "lognormal",
        "device-sigma": 1.0}


def deadline_that_cuts_the_slow_client() -> float:
    """A deadline the fast partition meets and the slow one meets half-way (eq. 1): its
    transfers fit, half of its local steps do."""
    dataset = load_dataset("synthetic")
    model = build_model("mlp-2nn", dataset.input_shape, dataset.num_classes)
    size = ArrayRecord(model.state_dict()).count_bytes()
    cost = seconds_per_example(model, dataset.input_shape, 1.0)
    fleet = GeneratedFleet("lognormal", seed=SEED, sigma=1.0)
    # iid partitions of synthetic data hold more than BATCH examples each: b = BATCH
    fast, slow = sorted((fleet.profile(p) for p in (0, 1)),
                        key=lambda pr: client_seconds(pr, STEPS, BATCH, cost, size, size))
    transfers = client_seconds(slow, 0, BATCH, cost, size, size)
    deadline = max(client_seconds(fast, STEPS, BATCH, cost, size, size),
                   transfers + 0.5 * (client_seconds(slow, STEPS, BATCH, cost, size, size)
                                      - transfers)) + 0.05
    assert deadline < client_seconds(slow, STEPS, BATCH, cost, size, size) - 0.05
    return deadline


def sim_seconds(run_dir) -> list[float]:
    return [r[C.LOG_SIM_SECONDS] for r in read_rounds(run_dir)[1:]]


@pytest.mark.timeout(2400)
def test_simulation_and_deployment_keep_the_same_clock(tmp_path):
    run_config = {**BASE, "round-deadline": deadline_that_cuts_the_slow_client()}

    inprocess = tmp_path / "inprocess"
    rc = {**run_config, "output-dir": str(inprocess)}
    server_app(InProcessGrid(client_app, 2, rc),
               Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    (inprocess_dir,) = inprocess.iterdir()
    expected = sim_seconds(inprocess_dir)
    rounds = read_rounds(inprocess_dir)[1:]
    assert [r[C.LOG_CLIENTS_STRAGGLERS] for r in rounds] == [1, 1]  # the slow one is cut
    assert [r[C.LOG_CLIENTS_RECEIVED] for r in rounds] == [2, 2]  # and its part aggregated
    assert sorted(rounds[0][C.LOG_LOCAL_STEPS])[0] < STEPS

    simulated = tmp_path / "simulation"
    home = tmp_path / "flwr-home"
    result = run_app({**run_config, "output-dir": str(simulated)},
                     {"num-supernodes": 2, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=600, isolate_ports=True, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert local_superlink_pids(home) == []
    (simulated_dir,) = simulated.iterdir()
    assert sim_seconds(simulated_dir) == expected

    deployed = tmp_path / "deployment"
    deployment = LocalDeployment(DeploySpec(num_supernodes=2), Layout(tmp_path / "deploy"),
                                 start_timeout=120)
    pids: list[int] = []
    try:
        deployment.start()
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        result = run_on_connection(deployment.spec.connection, deployment.cli_env,
                                   {**run_config, "output-dir": str(deployed)}, timeout=900,
                                   capture=True)
        assert result.status == "finished:completed", result.output[-4000:]
    finally:
        deployment.stop()
    assert not [pid for pid in pids if is_alive(pid)], "processes left running after stop()"
    (deployed_dir,) = deployed.iterdir()
    assert sim_seconds(deployed_dir) == expected
    assert [r[C.LOG_SIM_ELAPSED] for r in read_rounds(deployed_dir)[1:]] == \
        [r[C.LOG_SIM_ELAPSED] for r in rounds]
    assert (deployed_dir / "device_profiles.csv").read_text() == \
        (inprocess_dir / "device_profiles.csv").read_text()
