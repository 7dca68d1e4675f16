"""fedhetero's strategies and client helpers in a user's FLAT Flower project.

The project (tests/user_project.py) has its own top-level ``task.py``, as Flower's
quickstart-pytorch does; its ClientApp calls ``strategies.client`` helpers where a
strategy needs them. Each strategy runs in-process (a fresh interpreter, so ``import task``
is the user's module) and must learn; one run goes through the real ``flwr run``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulation.runtime import (
    flwr_env,
    flwr_run_command,
    local_superlink_pids,
    submit_run,
)
from simulation.runtime.local_superlink import superlink_use
from tests import user_project

pytestmark = pytest.mark.usefixtures("processes")

# the ClientApp with every helper, for the plain path and the client-state helpers (each
# strategy's own documented client change runs in test_doc_snippets, in this same project)
STRATEGIES = ["fedavg", "scaffold", "moon"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flat_project_in_process(tmp_path, strategy):
    project = user_project.build(tmp_path / "userproj")
    summary = user_project.run_inprocess(project, {"strategy": strategy})
    assert Path(summary["task_file"]) == project / "task.py"  # the user's task, not ours
    assert "is not a package" not in summary["output"]
    assert "ClientApp error" not in summary["output"], summary["output"][-4000:]
    assert "Traceback" not in summary["output"], summary["output"][-4000:]
    calls = summary["calls"]
    nodes = user_project.QUICKSTART_SUPERNODES
    assert calls.count("query") == nodes  # the client-info query, answered by client_info_reply
    assert calls.count("train") >= 3 * nodes
    history = summary["history"]
    assert [h["round"] for h in history] == [0, 1, 2, 3]
    assert history[-1]["loss"] < history[0]["loss"]  # it learns


def test_stock_template_client_with_fedavg_in_a_flat_project(tmp_path):
    """The template's ClientApp (no helper, no query handler) still runs FedAvg and FedProx."""
    project = user_project.build(tmp_path / "userproj", train=user_project.CLIENT_SECTIONS["train"],
                                 query="")
    for strategy in ("fedavg", "fedprox"):
        summary = user_project.run_inprocess(project, {"strategy": strategy,
                                                       "query-client-info": False})
        assert "Traceback" not in summary["output"], summary["output"][-4000:]
        assert summary["history"][-1]["loss"] < summary["history"][0]["loss"]


def test_flat_project_under_flwr_run(tmp_path):
    """``flwr run .`` from the user's project folder, as a user types it.

    (From fedhetero's repository root instead, Ray puts the driver's working directory, with
    fedhetero's ``task`` package, on the workers' path before the app: that is our layout's
    hazard, not the user's.)
    """
    project = user_project.build(tmp_path / "userproj")
    out = tmp_path / "summary.json"
    home = tmp_path / "flwr-home"
    env = flwr_env(home, isolate_ports=True)
    cmd = flwr_run_command({"strategy": "fedveca", "summary-file": str(out),
                            "num-server-rounds": 2},
                           {"num-supernodes": 2, "client-resources-num-cpus": 1}, app_dir=project)
    home.mkdir()
    with superlink_use(home, env, cwd=project):  # started patiently, stopped by PID after the run
        result = submit_run(cmd, env, cwd=project, timeout=420, capture=True)
    assert result.status == "finished:completed", result.output[-4000:]
    assert "is not a package" not in result.output and "ImportError" not in result.output
    assert "rejected" not in result.output, result.output[-4000:]
    history = json.loads(out.read_text())["history"]
    assert [h["round"] for h in history] == [0, 1, 2]
    assert history[-1]["loss"] < history[0]["loss"]
    assert local_superlink_pids(home) == []
