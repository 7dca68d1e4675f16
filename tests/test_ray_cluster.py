"""The simulation engine on a Ray cluster: a head and a worker node on this machine.

The head has 0 CPUs, so the run completing proves its ClientApp actors ran on the
worker that joined it. Every Ray process the test starts is stopped by PID; ``ray stop``
is never called. Ray advertises the machine's own interface address (it ignores
--node-ip-address=127.0.0.1 here), so traffic stays on this machine; nothing remote is
contacted.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import free_port, local_superlink_pids, run_app
from simulation.runtime.ray_cluster import (
    active_nodes_and_cpus,
    start_head,
    start_worker,
    wait_for_nodes,
)
from strategies import contract as C

STATUS = """======== Autoscaler status ========
Node status
---------------------------------------------------------------
Active:
 1 node_dcd1d82dcb675448a38874fd170970a82b28562338639ba93c1bd879
 1 node_b926e57a6022639aa207f6977c31de45fd4d796fe7e27668ee88e1e8
Pending:
 (no pending nodes)
Resources
---------------------------------------------------------------
Total Usage:
 0.0/2.0 CPU
 0B/26.20GiB memory
"""


def test_ray_status_parsing():
    assert active_nodes_and_cpus(STATUS) == (2, 2.0)
    assert active_nodes_and_cpus("") == (0, 0.0)


@pytest.mark.usefixtures("processes")
def test_flwr_run_on_a_head_and_a_worker_node(tmp_path):
    temp_dir = Path(
        tempfile.mkdtemp(prefix="rt", dir="/tmp")
    )  # short: Ray socket paths <= 107 chars
    address = f"127.0.0.1:{free_port()}"
    head = start_head(
        int(address.split(":")[1]), num_cpus=0, temp_dir=temp_dir, log=tmp_path / "head.log"
    )
    worker = None
    home = tmp_path / "flwr-home"
    try:
        wait_for_nodes(address, 1, timeout=120)
        worker = start_worker(address, num_cpus=2, log=tmp_path / "worker.log")
        assert wait_for_nodes(address, 2, timeout=120) == (2, 2.0)
        out = tmp_path / "runs"
        result = run_app(
            {
                "num-server-rounds": 1,
                "local-steps": 3,
                "partition": "iid",
                "model": "cnn-small",
                "output-dir": str(out),
            },
            {"num-supernodes": 2, "client-resources-num-cpus": 1},
            flwr_home=home,
            timeout=420,
            isolate_ports=True,
            capture=True,
            ray_address=address,
        )
        assert result.status == "finished:completed", result.output[-4000:]
        rounds = read_rounds(next(out.iterdir()))
        assert rounds[-1]["round"] == 1 and rounds[-1][C.LOG_CLIENTS_RECEIVED] == 2
    finally:
        for node in (worker, head):
            if node is not None:
                node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert local_superlink_pids(home) == []
    assert head.process.poll() is not None and (worker is None or worker.process.poll() is not None)
