"""fedhetero's strategies with an unchanged stock Flower ClientApp (examples/stock-pytorch)."""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
from flwr.app import Context, RecordDict

from simulation.launcher import PROJECT_ROOT, local_superlink_pids, run_app
from tests.inprocess import InProcessGrid

EXAMPLE = PROJECT_ROOT / "examples" / "stock-pytorch"
sys.path.insert(0, str(EXAMPLE))

from stockapp.client_app import app as stock_client  # noqa: E402
from stockapp.client_app_plus import app as plus_client  # noqa: E402
from stockapp.server_app import app as stock_server  # noqa: E402

RUN_CONFIG = {"num-server-rounds": 2, "strategy": "fedavg", "weighting": "examples", "fraction-train": 1.0,
              "local-epochs": 1, "learning-rate": 0.05, "batch-size": 64, "max-examples": 600,
              "local-steps": 4, "dynamicfl-intervals": "b-c", "data-dir": "/usr/share/datasets/fashion-mnist"}


def run_stock(strategy: str, weighting: str = "examples", client=stock_client) -> InProcessGrid:
    rc = {**RUN_CONFIG, "strategy": strategy, "weighting": weighting}
    grid = InProcessGrid(client, 3, rc)
    stock_server(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    return grid


@pytest.mark.parametrize("strategy,weighting", [
    ("fedavg", "examples"), ("fedavg", "uniform"), ("fedavg", "pre-erratum"), ("fedavg", "scheme-i"),
    ("fedavg", "scheme-ii"), ("fedprox", "examples"), ("fednova", "examples"),
])
def test_stock_client_works_unchanged(strategy, weighting, caplog):
    caplog.set_level(logging.WARNING)
    grid = run_stock(strategy, weighting)
    kinds = [kind for _, kind in grid.calls]
    if weighting == "scheme-i":  # 3 draws with replacement per round: a node drawn twice trains once
        assert 2 <= kinds.count("train") <= 6
    else:
        assert kinds.count("train") == 6
    assert kinds.count("evaluate") == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("query" in w and "node-id order" in w for w in warnings) == 1
    assert sum("tau_i is derived" in w for w in warnings) == (1 if strategy == "fednova" else 0)


@pytest.mark.parametrize("strategy", ["fedveca", "dynamicfl"])
def test_template_client_plus_the_task_helpers(strategy):
    grid = run_stock(strategy, client=plus_client)
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("query") == 3
    assert kinds.count("evaluate") == (6 if strategy == "fedveca" else 0)  # DynamicFL: server-side only
    assert kinds.count("train") >= 6  # DynamicFL: one message per chunk


def example_app(tmp_path, strategy: str):
    """The example as is, or (FedVeca, DynamicFL) with pyproject's clientapp pointed at client_app_plus."""
    if strategy not in ("fedveca", "dynamicfl"):
        return EXAMPLE
    app = tmp_path / "stock-pytorch"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    assert 'clientapp = "stockapp.client_app:app"' in text
    pyproject.write_text(text.replace("stockapp.client_app:app", "stockapp.client_app_plus:app"))
    return app


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fednova", "fedveca", "dynamicfl"])
def test_example_under_flwr_run(tmp_path, strategy):
    home = tmp_path / "flwr-home"
    result = run_app({"strategy": strategy, "max-examples": 600, "local-steps": 4},
                     {"num-supernodes": 2, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=420, isolate_ports=True, capture=True,
                     app_dir=example_app(tmp_path, strategy))
    assert result.status == "finished:completed", result.output[-4000:]
    assert "[ROUND 2/2]" in result.output or "Round 2" in result.output or "round 2" in result.output.lower()
    if strategy == "fednova":
        assert "tau_i is derived as floor(E n_i / B)" in result.output
    assert local_superlink_pids(home) == []
