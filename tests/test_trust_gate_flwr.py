"""One real ``flwr run`` (simulation engine, Ray) with one hostile ClientApp among honest ones.

Partition 1's ClientApp (simulation.reliability.hostile_client) sends, in round 1, a
1-element ``.npy`` payload declared with a layer's shape (before the trust gate it was
broadcast silently into the layer) and, in round 2, ``num-examples`` = 10^12. Both rounds
must finish with the two honest clients, the run log's models must be finite, and the log
must name the hostile reply's node, partition and field. Isolated FLWR_HOME and ports; the
managed local SuperLink is stopped at the end. (Fashion-MNIST, as test_reliability_flwr.py.)
"""

from __future__ import annotations

import math

import pytest
import torch

from fedapp.run_log import read_rounds
from simulation.reliability.hostile_client import hostile_project
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")


def test_flwr_run_with_one_hostile_clientapp(tmp_path):
    app = hostile_project(tmp_path / "app")
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {"num-server-rounds": 2, "local-steps": 2, "partition": "iid", "model": "mlp-2nn",
         "round-timeout": 120.0, "output-dir": str(out)},
        {"num-supernodes": 3, "client-resources-num-cpus": 1},
        flwr_home=home, timeout=480, isolate_ports=True, capture=True, app_dir=app,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
    assert all(r[C.LOG_CLIENTS_RECEIVED] == 2 and r[C.LOG_CLIENTS_FAILED] == 1
               and r[C.LOG_MODEL_KEPT] is False for r in rounds[1:]), rounds
    assert all(math.isfinite(r[C.LOG_LOSS]) for r in rounds)
    final = torch.load(next(out.iterdir()) / "final_model.pt")
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())
    lines = [line for line in result.output.splitlines() if "(partition 1) rejected" in line]
    assert len(lines) == 2, result.output[-4000:]
    assert "bytes hold float32(1,)" in lines[0] and "'num-examples'" in lines[1]
    assert "from node " in lines[0]
    assert local_superlink_pids(home) == []
