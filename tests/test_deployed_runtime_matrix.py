"""The deployment column of the runtime-equivalence matrix (tests/test_runtime_matrix.py):
every row on one real local deployment of four SuperNodes gives the in-process run's bits,
and FedBuff in real-time arrival order completes there. A module of its own so that a
pytest-xdist worker (``--dist loadfile``) runs it beside the simulation column; named to sort among the
other deploy modules, so loadfile hands it out early rather than last."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedapp.run_log import read_rounds
from strategies import contract as C
from tests.deployed import run_deployed
from tests.test_runtime_matrix import (  # noqa: F401
    NODES,
    ROWS,
    check_same_bits,
    in_process,
    only_run,
    row_config,
)

pytestmark = pytest.mark.usefixtures("deployment")


@pytest.fixture(scope="module")
def deployment_runs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Every row, and FedBuff in real-time arrival order, on one deployment of four
    SuperNodes."""
    root = tmp_path_factory.mktemp("deployment")
    configs = [row_config(row, root / row) for row in ROWS]
    real_time = {**row_config("async", root / "real-time"), "async-arrival": "real-time"}
    results = run_deployed(root, NODES, [*configs, real_time])
    runs = {}
    for (row, result), config in zip(zip([*ROWS, "real-time"], results), [*configs, real_time]):
        assert result.status == "finished:completed", (row, result.output[-4000:])
        runs[row] = (only_run(Path(config["output-dir"])), result.output)
    return runs


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("row", list(ROWS))
def test_same_bits_on_a_deployment(row, in_process, deployment_runs):  # noqa: F811
    check_same_bits(row, *deployment_runs[row], in_process[row])


@pytest.mark.timeout(2400)
def test_real_time_arrival_completes_and_says_it_is_not_reproducible(deployment_runs):
    run_dir, output = deployment_runs["real-time"]
    assert "not reproducible" in output
    rounds = read_rounds(run_dir)
    assert [r[C.LOG_BUFFER_FILL] for r in rounds[1:]] == [2, 2]
    assert all(0 <= r[C.LOG_ACCURACY] <= 1 for r in rounds)
