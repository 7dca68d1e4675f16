"""One real ``flwr run`` (simulation engine, Ray) with injected client faults.

Seed 6 with fault-crash-prob = fault-late-prob = 0.3 and 2 partitions: in round 1
partition 0 crashes, in round 2 partition 1 answers only after the 45 s round timeout.
Both rounds must finish with the surviving client, and count one failure each. (At 15 s, a
CI run on a loaded machine lost the surviving client too: round 1's cold ClientApp start,
Ray actor, torch and data, took longer; both rounds then had 0 replies.)
(Fashion-MNIST, not ``synthetic``: generating Synthetic(1, 1) inside flwr-simulation's
ServerApp thread was seen to spin forever in numpy's SVD (``multivariate_normal``).)
"""

from __future__ import annotations

import pytest

from fedapp.faults import fault_of
from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")


def test_flwr_run_with_a_crash_and_a_late_client(tmp_path):
    assert [fault_of(6, 1, p, 0.3, 0.3) for p in (0, 1)] == ["crash", None]
    assert [fault_of(6, 2, p, 0.3, 0.3) for p in (0, 1)] == [None, "late"]
    out = tmp_path / "runs"
    home = tmp_path / "flwr-home"
    result = run_app(
        {
            "num-server-rounds": 2,
            "local-steps": 3,
            "partition": "iid",  # Fashion-MNIST
            "seed": 6,
            "fault-crash-prob": 0.3,
            "fault-late-prob": 0.3,
            "round-timeout": 45.0,
            "output-dir": str(out),
        },
        {"num-supernodes": 2, "client-resources-num-cpus": 1},
        flwr_home=home,
        timeout=480,
        isolate_ports=True,
        capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(
        r[C.LOG_CLIENTS_SAMPLED] == 2
        and r[C.LOG_CLIENTS_FAILED] == 1
        and r[C.LOG_CLIENTS_RECEIVED] == 1
        and r[C.LOG_MODEL_KEPT] is False
        for r in rounds[1:]
    )
    assert "injected crash" in result.output
    assert local_superlink_pids(home) == []
