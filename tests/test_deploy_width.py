"""HeteroFL and FjORD on Flower's deployment runtime, loopback: a real SuperLink, two real
SuperNodes (partition-id 0 and 1) and ``flwr run`` with widths 1 and 0.5 under the fixed
rule. A deployed SuperNode starts a new ClientApp process for every message, which must build
its model at the width the server sent: SuperNode 0 trains width 1, SuperNode 1 width 0.5,
no client fails, each width's accuracy is logged, and the models are the in-process run's,
bit for bit (:mod:`tests.deployed`: free ports, a private FLWR_HOME, every process stopped by
PID and checked gone)."""

from __future__ import annotations

import math

import pytest

from fedapp.run_log import read_rounds
from strategies import contract as C
from tests.deployed import run_deployed, run_in_process

pytestmark = pytest.mark.usefixtures("deployment")

STRATEGIES = ("heterofl", "fjord")
CONFIG = {"num-server-rounds": 2, "dataset": "synthetic", "model": "mlp-2nn",
          "partition": "iid", "local-steps": 2, "batch-size": 8, "eval-batch-size": 2000,
          "min-available-nodes": 2, "width-levels": "1,0.5", "width-rule": "fixed",
          "drift-diagnostics": False}


@pytest.mark.timeout(1200)
def test_each_supernode_trains_its_fixed_width(tmp_path):
    configs = [{**CONFIG, "strategy": s, "output-dir": str(tmp_path / f"deployed-{s}")}
               for s in STRATEGIES]
    results = run_deployed(tmp_path, 2, configs)
    for strategy, result in zip(STRATEGIES, results):
        assert result.status == "finished:completed", result.output[-4000:]
        (run_dir,) = list((tmp_path / f"deployed-{strategy}").iterdir())
        assert (run_dir / "final_model.pt").is_file()
        rounds = read_rounds(run_dir)
        assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2]
        for r in rounds[1:]:  # SuperNode p serves partition p: levels[p mod 2]
            assert r[C.LOG_CLIENT_WIDTHS] == {"0": 1.0, "1": 0.5}, strategy
            assert r[C.LOG_WIDTH_COUNTS] == {"1": 1, "0.5": 1} and r[C.LOG_WIDTH_RULE] == "fixed"
            assert r[C.LOG_CLIENTS_RECEIVED] == 2 and r[C.LOG_CLIENTS_FAILED] == 0
        for r in rounds:
            assert math.isfinite(r[C.LOG_ACCURACY])
            assert set(r[C.LOG_WIDTH_ACCURACY]) == {"0.5", "1"}
            assert all(math.isfinite(a) for a in r[C.LOG_WIDTH_ACCURACY].values())
        inproc = {**CONFIG, "strategy": strategy, "output-dir": str(tmp_path / f"in-{strategy}")}
        expected = read_rounds(run_in_process(inproc, 2))
        assert ([r[C.LOG_MODEL_SHA256] for r in rounds]
                == [r[C.LOG_MODEL_SHA256] for r in expected]), strategy
