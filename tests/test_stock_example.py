"""fedhetero's strategies with an unchanged stock Flower ClientApp (examples/stock-pytorch).

The stock client (no query handler) runs FedAvg ('examples', 'uniform'), FedProx and FedNova;
``client_app_plus`` (the template plus ``strategies.client`` helpers and a query handler)
runs FedVeca, DynamicFL, SCAFFOLD, FedDyn, MOON and the weightings that need every
client's n_k.
"""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
from flwr.app import Context, RecordDict

from simulation.runtime import PROJECT_ROOT, local_superlink_pids, run_app
from tests.inprocess import InProcessGrid

EXAMPLE = PROJECT_ROOT / "examples" / "stock-pytorch"
sys.path.insert(0, str(EXAMPLE))

from stockapp.client_app import app as stock_client  # noqa: E402
from stockapp.client_app_plus import app as plus_client  # noqa: E402
from stockapp.server_app import app as stock_server  # noqa: E402

RUN_CONFIG = {"num-server-rounds": 2, "strategy": "fedavg", "weighting": "examples",
              "fraction-train": 1.0,
              "local-epochs": 1, "learning-rate": 0.05, "batch-size": 64, "max-examples": 600,
              "local-steps": 4, "dynamicfl-intervals": "b-c", "query-client-info": False,
              "data-dir": "/usr/share/datasets/fashion-mnist"}


def run_stock(strategy: str, weighting: str = "examples", client=stock_client,
              query: bool = False) -> InProcessGrid:
    rc = {**RUN_CONFIG, "strategy": strategy, "weighting": weighting, "query-client-info": query}
    grid = InProcessGrid(client, 3, rc)
    stock_server(grid, Context(run_id=3, node_id=0, node_config={}, state=RecordDict(),
                               run_config=rc))
    return grid


@pytest.mark.parametrize("strategy,weighting", [
    ("fedavg", "examples"), ("fedavg", "uniform"), ("fedprox", "examples"), ("fednova", "examples"),
])
@pytest.mark.usefixtures("apps")
def test_stock_client_works_unchanged(strategy, weighting, caplog):
    caplog.set_level(logging.WARNING)
    grid = run_stock(strategy, weighting)
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("train") == 6 and kinds.count("evaluate") == 6
    assert "query" not in kinds  # the query is opt-in: no Flower error for a stock client
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("query" in w and "node-id order" in w for w in warnings) == 1
    assert sum("tau_i is taken as" in w for w in warnings) == (1 if strategy == "fednova" else 0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("weighting", ["pre-erratum", "scheme-i", "scheme-ii"])
@pytest.mark.usefixtures("apps")
def test_weightings_that_need_every_n_k_with_the_query_handler(weighting, caplog):
    caplog.set_level(logging.WARNING)
    grid = run_stock("fedavg", weighting, client=plus_client, query=True)
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("query") == 3
    if weighting == "scheme-i":  # 3 draws with replacement a round: one drawn twice trains once
        assert 2 <= kinds.count("train") <= 6
    else:
        assert kinds.count("train") == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert not any("node-id order" in w for w in warnings)


@pytest.mark.parametrize("strategy", ["fedveca", "dynamicfl", "scaffold", "feddyn", "moon"])
@pytest.mark.usefixtures("apps")
def test_template_client_plus_the_task_helpers(strategy, caplog):
    caplog.set_level(logging.WARNING)
    grid = run_stock(strategy, client=plus_client, query=True)
    kinds = [kind for _, kind in grid.calls]
    assert kinds.count("query") == 3
    assert kinds.count("evaluate") == 6
    assert kinds.count("train") >= 6  # DynamicFL: one message per chunk
    # every reply accepted: the drift-correction family's client state (c_i, FedDyn's linear
    # term, MOON's previous model) kept in context.state and echoed as the server expects
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


def example_app(tmp_path, strategy: str):
    """The example as is, or (FedVeca, DynamicFL) with pyproject's clientapp pointed at
    client_app_plus."""
    if strategy not in ("fedveca", "dynamicfl"):
        return EXAMPLE
    app = tmp_path / "stock-pytorch"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    assert 'clientapp = "stockapp.client_app:app"' in text
    pyproject.write_text(text.replace("stockapp.client_app:app", "stockapp.client_app_plus:app"))
    return app


@pytest.mark.parametrize("strategy", ["dynamicfl"])  # the others: in process, above
@pytest.mark.usefixtures("processes")
def test_example_under_flwr_run(tmp_path, strategy):
    home = tmp_path / "flwr-home"
    result = run_app({"strategy": strategy, "max-examples": 600, "local-steps": 4},
                     {"num-supernodes": 2, "client-resources-num-cpus": 1},
                     flwr_home=home, timeout=420, isolate_ports=True, capture=True,
                     app_dir=example_app(tmp_path, strategy))
    assert result.status == "finished:completed", result.output[-4000:]
    assert "[ROUND 2/2]" in result.output or "round 2" in result.output.lower()
    assert "ERROR" not in result.output and "Traceback" not in result.output, result.output[-4000:]
    assert local_superlink_pids(home) == []
