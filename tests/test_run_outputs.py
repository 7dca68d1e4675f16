"""A run directory's metrics.csv, summary.json and plots, on hand-made round logs and on one
in-process run."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from fedapp import run_outputs
from fedapp.run_outputs import (accuracy_percent, csv_columns, run_title, summarize,
                                write_run_outputs)
from fedapp.run_plots import BYTES_PLOT, ROUND_PLOT, SIM_TIME_PLOT, byte_unit, time_unit
from strategies import contract as C

PNG = b"\x89PNG\r\n\x1a\n"
RECORDS = [
    {"round": 0, "accuracy": 0.10, "loss": 2.30, "wall-seconds": 0.5, "elapsed-seconds": 0.5,
     "model-sha256": "ab"},
    {"round": 1, "accuracy": 0.72, "loss": 1.00, "bytes-up": 1_000_000, "bytes-down": 2_000_000,
     "model-kept": False, "local-steps": [3, 3], "sim-seconds": 4.0, "sim-elapsed": 4.0,
     "drift-cosine": {"fc": 0.9}, "train-loss": 1.2, "elapsed-seconds": 2.0},
    {"round": 2, "bytes-up": 1_000_000, "bytes-down": 2_000_000, "sim-seconds": 6.0,
     "sim-elapsed": 10.0, "train-loss": 0.9, "elapsed-seconds": 3.0},
    {"round": 3, "accuracy": 0.81, "loss": 0.60, "bytes-up": 500_000, "bytes-down": 2_000_000,
     "poc-query-bytes": 500_000, "sim-seconds": 5.0, "sim-elapsed": 15.0, "train-loss": 0.7,
     "elapsed-seconds": 4.5},
    {"round": 4, "accuracy": 0.78, "loss": 0.65, "bytes-up": 1_000_000, "bytes-down": 2_000_000,
     "sim-seconds": 5.0, "sim-elapsed": 20.0, "train-loss": 0.6, "elapsed-seconds": 6.0},
]
CONFIG = {"run-config": {"strategy": "fedprox", "seed": 3, "num-server-rounds": 4}}


def run_dir(tmp_path, records=RECORDS, config=CONFIG, tail: str = ""):
    directory = tmp_path / "20260101-000000-fedprox-run7"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (directory / "rounds.jsonl").write_text(lines + tail)
    return directory


def test_csv_columns_are_round_accuracy_loss_then_the_numeric_keys_sorted():
    assert csv_columns(RECORDS) == [
        "round", "accuracy", "loss", "bytes-down", "bytes-up", "elapsed-seconds", "model-kept",
        "poc-query-bytes", "sim-elapsed", "sim-seconds", "train-loss", "wall-seconds"]


def test_metrics_csv_has_one_row_per_round_and_empty_cells_where_a_key_is_absent(tmp_path):
    directory = run_dir(tmp_path)
    write_run_outputs(directory)
    with (directory / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["round"] for row in rows] == ["0", "1", "2", "3", "4"]
    assert rows[2]["accuracy"] == "" and rows[2]["train-loss"] == "0.9"
    assert rows[1]["model-kept"] == "0" and rows[1]["bytes-up"] == "1000000"
    assert float(rows[3]["loss"]) == 0.60


def test_summary_numbers_by_hand():
    summary = summarize(RECORDS, CONFIG, "run-x")
    assert summary["strategy"] == "fedprox" and summary["seed"] == 3 and summary["run"] == "run-x"
    assert summary["rounds-planned"] == 4 and summary["rounds-done"] == 4
    assert (summary["final-round"], summary["final-accuracy"], summary["final-loss"]) == (
        4, 0.78, 0.65)
    assert (summary["best-accuracy"], summary["best-accuracy-round"]) == (0.81, 3)
    assert summary["mb-up"] == pytest.approx(3.5)  # 1 + 1 + 0.5 + 1
    assert summary["mb-down"] == pytest.approx(8.0)
    assert summary["mb-total"] == pytest.approx(12.0)  # + 0.5 MB of the loss query
    assert summary["sim-seconds"] == 20.0 and summary["wall-seconds"] == 6.0
    # 70 %: round 1 after 3 MB and 4 s; 75 % and 80 %: round 3 (3 + 3 + 3 MB; 15 s)
    assert summary["targets"] == [
        {"accuracy": 0.7, "round": 1, "mb": pytest.approx(3.0), "sim-seconds": 4.0},
        {"accuracy": 0.75, "round": 3, "mb": pytest.approx(9.0), "sim-seconds": 15.0},
        {"accuracy": 0.8, "round": 3, "mb": pytest.approx(9.0), "sim-seconds": 15.0}]
    assert summary["diverged"] is None


def test_summary_without_a_clock_or_a_reached_target():
    records = [{k: v for k, v in r.items() if not k.startswith("sim-")} for r in RECORDS[:3]]
    summary = summarize(records, {}, "x")
    assert summary["sim-seconds"] is None and summary["strategy"] is None
    assert summary["targets"][1] == {"accuracy": 0.75, "round": None, "mb": None,
                                     "sim-seconds": None}
    assert summary["targets"][0]["sim-seconds"] is None


def test_plots_are_png_files_and_the_sim_time_one_needs_the_clock(tmp_path):
    directory = run_dir(tmp_path)
    written = write_run_outputs(directory)
    names = {path.name for path in written}
    assert names == {"metrics.csv", "summary.json", ROUND_PLOT, BYTES_PLOT, SIM_TIME_PLOT}
    for name in (ROUND_PLOT, BYTES_PLOT, SIM_TIME_PLOT):
        data = (directory / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    clockless = tmp_path / "clockless"
    clockless.mkdir()
    records = [{k: v for k, v in r.items() if not k.startswith("sim-")} for r in RECORDS]
    names = {p.name for p in write_run_outputs(run_dir(clockless, records))}
    assert SIM_TIME_PLOT not in names and ROUND_PLOT in names


def test_units_follow_the_scale():
    assert byte_unit(0.0005) == (1e6, "B")
    assert byte_unit(0.5) == (1e3, "KB")
    assert byte_unit(12.0) == (1.0, "MB")
    assert byte_unit(4500.0) == (1e-3, "GB")
    assert time_unit(90) == (1.0, "s")
    assert time_unit(1800) == (60.0, "min")
    assert time_unit(36000) == (3600.0, "h")
    assert time_unit(5.04) == (1.0, "s")  # a short run in seconds, never 0.0014 h


def test_plot_titles_name_strategy_seed_and_start_not_the_run_id(tmp_path, monkeypatch):
    name = "20261129-071828-fedavg-run8650790631904722155"
    assert run_title("fedavg", 0, name) == "fedavg (seed 0), 2026-11-29 07:18"
    assert run_title(None, None, name) == "run, 2026-11-29 07:18"
    assert run_title("fedprox", 3, "my-run8650790631904722155") == "fedprox (seed 3), my"
    assert run_title("fedprox", 3, "my-run") == "fedprox (seed 3), my-run"
    from fedapp import run_plots

    titles = []
    monkeypatch.setattr(run_plots, "plots_for", lambda records: [
        (ROUND_PLOT, lambda records, path, title: titles.append(title) or path)])
    write_run_outputs(run_dir(tmp_path))  # named 20260101-000000-fedprox-run7
    assert titles == ["fedprox (seed 3), 2026-01-01 00:00"]


def test_accuracy_is_plotted_in_percent():
    from fedapp import run_plots

    assert accuracy_percent(0.785) == 78.5
    assert run_plots.ACCURACY_AXIS == "test accuracy (%)"
    xs, ys = run_plots.series(RECORDS, [0, 1, 2, 3, 4], C.LOG_ACCURACY, accuracy_percent(1.0))
    assert xs == [0, 1, 3, 4] and ys == [10.0, 72.0, 81.0, 78.0]


def test_a_truncated_last_line_is_skipped(tmp_path):
    directory = run_dir(tmp_path, tail='{"round": 5, "accu')
    with pytest.warns(RuntimeWarning, match="line 6"):
        write_run_outputs(directory)
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["rounds-done"] == 4


def test_a_damaged_log_is_one_warning_not_an_error(tmp_path, caplog):
    directory = run_dir(tmp_path)
    lines = (directory / "rounds.jsonl").read_text().splitlines()
    lines[1] = "{not json"
    (directory / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        assert write_run_outputs(directory) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "rounds.jsonl" in warnings[0]


def test_records_that_are_not_round_objects_and_odd_values_do_not_crash(tmp_path):
    records = [*RECORDS[:2], {"round": "x"}, {"round": 2, "accuracy": None, "loss": "nan"},
               {"round": 3, "accuracy": 0.5, "loss": float("nan")}]
    directory = run_dir(tmp_path, [*records, RECORDS[4]])
    names = {p.name for p in write_run_outputs(directory)}
    assert {"metrics.csv", "summary.json", ROUND_PLOT} <= names
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["rounds-done"] == 4 and "round 3: test loss is nan" in summary["diverged"]


def test_a_file_that_cannot_be_written_is_one_warning_naming_it(tmp_path, caplog, monkeypatch):
    directory = run_dir(tmp_path)

    def refuse(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(run_outputs, "write_bytes_atomically", refuse)
    with caplog.at_level(logging.WARNING):
        written = write_run_outputs(directory)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2
    assert "metrics.csv not written" in warnings[0] and "summary.json" in warnings[1]
    assert {p.name for p in written} == {ROUND_PLOT, BYTES_PLOT, SIM_TIME_PLOT}


@pytest.mark.usefixtures("processes")
def test_an_inprocess_run_leaves_its_outputs_in_the_run_directory(tmp_path, one_torch_thread):
    from simulation.reliability import run_inprocess
    from tests.reliability_common import config

    _, directory = run_inprocess(config("fedavg", tmp_path / "a", **{"num-server-rounds": 2,
                                                                     "run-plots": True}), 2)
    for name in ("metrics.csv", "summary.json", ROUND_PLOT, BYTES_PLOT):
        assert (directory / name).stat().st_size > 0, name
    assert not (directory / SIM_TIME_PLOT).exists()
    _, without = run_inprocess(config("fedavg", tmp_path / "b", **{"num-server-rounds": 2}), 2)
    assert (without / "summary.json").exists() and not (without / ROUND_PLOT).exists()
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["strategy"] == "fedavg" and summary["rounds-done"] == 2
    header = (directory / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == [C.LOG_ROUND, C.LOG_ACCURACY, C.LOG_LOSS]
    assert C.LOG_BYTES_UP in header and C.LOG_MODEL_SHA256 not in header


@pytest.mark.usefixtures("processes")
def test_a_killed_run_leaves_outputs_up_to_its_last_round(tmp_path, one_torch_thread):
    """The server dies in round 3 (SimulatedKill is a BaseException: nothing cleans up, as
    with SIGKILL): metrics.csv, summary.json and the plots already hold rounds 0..2."""
    from simulation.reliability import SimulatedKill, run_inprocess
    from tests.reliability_common import config

    rc = config("fedavg", tmp_path / "k", **{"num-server-rounds": 4, "run-plots": True})
    with pytest.raises(SimulatedKill):
        run_inprocess(rc, 2, kill_after_round=2)
    directory = next((tmp_path / "k").iterdir())
    rows = (directory / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1", "2"]
    assert json.loads((directory / "summary.json").read_text())["rounds-done"] == 2
    assert (directory / ROUND_PLOT).stat().st_size > 0


def test_live_outputs_redraw_the_plots_only_when_it_costs_a_twentieth_of_the_time(
        tmp_path, monkeypatch):
    from fedapp import run_outputs

    drawn = []
    monkeypatch.setattr(run_outputs, "write_run_outputs",
                        lambda directory, plots: drawn.append(plots) or [])
    clock = iter([0.0, 1.0, 1.5, 12.0, 21.0, 21.2, 21.3, 22.0])
    monkeypatch.setattr(run_outputs.time, "perf_counter", lambda: next(clock))
    live = run_outputs.LiveOutputs(tmp_path, plots=True)
    live.update()  # first: drawn (0 .. 1.0: one second)
    live.update()  # 1.5: 0.5 s since, 1 > 0.05 x 0.5: csv and json only
    live.update()  # 12.0: 11 s since, 1 > 0.55: not yet
    live.update()  # 21.0: 20 s since, 1 <= 1.0: drawn (21.0 .. 21.2)
    live.update()  # 21.3
    assert drawn == [True, False, False, True, False]
    assert run_outputs.LiveOutputs(tmp_path, plots=False).plots is False
