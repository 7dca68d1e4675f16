"""Real ``flwr run . --stream`` on Flower's simulation engine (Ray), tiny configs: FedDyn and
MOON, whose client state (the linear term; the previous local model) must persist per node in
Context.state across rounds in the Ray actors. Isolated FLWR_HOME and ports; the managed local
SuperLink is stopped by PID afterwards (simulation.runtime)."""

from __future__ import annotations

import pytest

from fedapp.run_log import read_rounds
from simulation.runtime import local_superlink_pids, run_app
from strategies import contract as C

pytestmark = pytest.mark.usefixtures("processes")

FEDERATION = {"num-supernodes": 2, "client-resources-num-cpus": 1}
CASES = {
    "feddyn": ({"feddyn-alpha": 0.1}, C.LOG_FEDDYN_H_NORM),
    "moon": ({"model": "cnn-small-moon", "moon-mu": 5.0}, C.LOG_MOON_CONTRASTIVE_LOSS),
}


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_flwr_run_keeps_the_client_state_in_context_state(strategy, tmp_path):
    out, home = tmp_path / "runs", tmp_path / "flwr-home"
    extra, diagnostic = CASES[strategy]
    result = run_app(
        {"num-server-rounds": 3, "strategy": strategy, "local-steps": 5, "momentum": 0.9,
         "partition": "dirichlet", "drift-diagnostics": False, "output-dir": str(out), **extra},
        FEDERATION, flwr_home=home, timeout=480, isolate_ports=True, capture=True,
    )
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(next(out.iterdir()))
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2, 3]
    # rounds 2 and 3 started from the state each node kept in Context.state (never resent),
    # and the server's copies (digests checked on every reply) agreed: no reply was rejected
    assert [r[C.LOG_CLIENT_STATE_ROUNDS] for r in rounds[1:]] == [[0, 0], [1, 1], [2, 2]]
    assert all(r[C.LOG_CLIENT_STATE_ATTACHED] == 0 and r[C.LOG_CLIENTS_RECEIVED] == 2
               for r in rounds[1:])
    values = [r[diagnostic] for r in rounds[1:]]
    if strategy == "moon":  # no previous model in round 1, then the contrastive term is on
        assert values[0] == 0.0 and all(v > 0 for v in values[1:])
    else:
        assert all(v > 0 for v in values)
    assert "rejected" not in result.output and "ClientStateLost" not in result.output
    assert local_superlink_pids(home) == []
