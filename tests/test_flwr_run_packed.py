"""Packed mode through real ``flwr run`` on Flower's simulation engine: 6 virtual clients
on 2 SuperNodes give the same final model and run log (timings aside) as 6 SuperNodes,
and a SCAFFOLD run keeps each virtual client's c_i (client-state rounds 0, 1, 2 without
the server resending it)."""

from __future__ import annotations

import pytest

from fedapp.model_file import read_model
from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C
from tests.reliability_common import same_model, without_timings

pytestmark = pytest.mark.usefixtures("processes")

TINY = {"num-server-rounds": 3, "local-steps": 3, "partition": "iid", "seed": 4,
        "min-available-nodes": 6}


def flwr_run(tmp_path, name: str, supernodes: int, **overrides):
    out, home = tmp_path / name, tmp_path / f"{name}-home"
    result = run_app({**TINY, "output-dir": str(out), **overrides},
                     {"num-supernodes": supernodes, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=420, isolate_ports=True, capture=True)
    assert result.returncode == 0, result.output[-4000:]
    assert local_superlink_pids(home) == []
    (run_dir,) = list(out.iterdir())
    return run_dir, result.output


@pytest.mark.timeout(900)
def test_six_virtual_clients_on_two_supernodes_equal_six_supernodes(tmp_path):
    unpacked, _ = flwr_run(tmp_path, "unpacked", 6)
    packed, output = flwr_run(tmp_path, "packed", 2, **{"virtual-clients": 6})
    assert "Packed simulation: 6 virtual clients" in output
    rounds = read_rounds(packed)
    assert [r[C.LOG_CLIENTS_RECEIVED] for r in rounds[1:]] == [6, 6, 6]
    assert without_timings(rounds) == without_timings(read_rounds(unpacked))
    assert same_model(read_model(packed / "final_model.pt"),
                      read_model(unpacked / "final_model.pt"))


@pytest.mark.timeout(600)
def test_scaffold_c_i_follows_each_virtual_client(tmp_path):
    run_dir, _ = flwr_run(tmp_path, "scaffold", 2, strategy="scaffold",
                          **{"virtual-clients": 6, "drift-diagnostics": False})
    rounds = read_rounds(run_dir)
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0] * 6, [1] * 6, [2] * 6]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 for r in rounds[1:])
