"""Runs of the app on a real local deployment (one SuperLink, N SuperNodes on loopback), and
the app in process with one torch thread: what the "same bits everywhere" tests compare.

Every process started is stopped by PID (``LocalDeployment.stop``) and checked gone.
"""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import Context, RecordDict

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.client_app import app as client_app
from fedapp.server_app import app as server_app
from simulation.runtime import descendants, is_alive
from tests.inprocess import InProcessGrid


def run_in_process(run_config: dict, num_nodes: int) -> Path:
    """The ServerApp against ``num_nodes`` in-process ClientApps on one torch thread (as each
    Ray actor and SuperNode of these tests: the same float sums); its run directory."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        server_app(InProcessGrid(client_app, num_nodes, run_config),
                   Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                           run_config=run_config))
    finally:
        torch.set_num_threads(threads)
    (run_dir,) = Path(run_config["output-dir"]).iterdir()
    return run_dir


def run_deployed(root: Path, num_supernodes: int, run_configs: list[dict]) -> list:
    """Each run config through ``flwr run`` on one fresh local deployment of
    ``num_supernodes`` SuperNodes (one torch thread each); the ``run_on_connection`` results,
    in order. The deployment is stopped and its processes checked gone."""
    deployment = LocalDeployment(DeploySpec(num_supernodes=num_supernodes, num_threads=1),
                                 Layout(root / "deploy"), start_timeout=120)
    pids: list[int] = []
    results = []
    try:
        deployment.start()
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        for run_config in run_configs:
            results.append(run_on_connection(deployment.spec.connection, deployment.cli_env,
                                             run_config, timeout=900, capture=True))
    finally:
        deployment.stop()
    assert not [pid for pid in pids if is_alive(pid)], "processes left running after stop()"
    return results
