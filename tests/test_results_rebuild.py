"""Every sweep whose runs are archived (``docs/results/run-logs/<experiment>/``) and whose
report is committed (``docs/results/<experiment>/report.md``; the timing sweeps' runs feed
other pages) rebuilds that report from them by the command its page prints (``python -m simulation results
<experiment> --runs docs/results/run-logs``): report.md, report.csv and claims.csv as
committed, and the results index's generated verdict table from those claims.csv. A report
edited by hand, or left behind by a change to the sweep file or the report code, fails here.
The plots are not drawn (matplotlib's time); their file names are in report.md."""

from __future__ import annotations

import pytest

from simulation.claims_index import BEGIN, END, claims_table
from simulation.experiments import EXPERIMENTS_DIR
from simulation.results import rebuild_results
from tests.test_results_size import RESULTS, RUN_LOGS

ARCHIVED = sorted(p.name for p in RUN_LOGS.iterdir()
                  if p.is_dir() and (EXPERIMENTS_DIR / f"{p.name}.toml").is_file()
                  and (RESULTS / p.name / "report.md").is_file())
REBUILT = ("report.md", "report.csv", "claims.csv")


@pytest.fixture
def no_drawing(monkeypatch):
    """The report's text without its pictures."""
    monkeypatch.setattr("task.partition.plot_label_histogram", lambda *args, **kwargs: None)
    monkeypatch.setattr("simulation.report.plot_curves", lambda *args, **kwargs: None)


def test_the_archived_sweeps_are_found():
    assert {"async_protocol_flash", "selection_protocol_lognormal",
            "width_protocol_tiers"} <= set(ARCHIVED)


@pytest.mark.parametrize("name", ARCHIVED)
def test_a_committed_report_rebuilds_from_its_archived_runs(name, tmp_path, no_drawing):
    assert rebuild_results(EXPERIMENTS_DIR, RUN_LOGS, tmp_path, [name]) == [name]
    for file in REBUILT:
        committed, rebuilt = RESULTS / name / file, tmp_path / name / file
        assert committed.is_file() == rebuilt.is_file(), f"{name}/{file}"
        if rebuilt.is_file():
            assert rebuilt.read_text() == committed.read_text(), (
                f"docs/results/{name}/{file} is not what its archived runs give; rebuild it: "
                f"python -m simulation results {name} --runs docs/results/run-logs")


def test_the_index_verdict_table_is_the_committed_claims():
    text = (RESULTS / "README.md").read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block == f"\n{claims_table(RESULTS)}\n"
