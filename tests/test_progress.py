"""Live progress (simulation.progress): rows of the real per-round table, ETA arithmetic,
plain lines off a terminal, rich bars on one, and the sweep / run tools wired to it."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from fedapp.run_log import table_header, table_row
from simulation import progress as P
from simulation import sweep
from simulation.run import planned_rounds
from strategies import contract as C


@pytest.fixture(autouse=True)
def known_commit(monkeypatch):
    """The sweep asks git for the code's state before each run (a process): fixed here."""
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})

INFO = "\x1b[92mINFO \x1b[0m:      "  # how flwr run --stream shows a ServerApp log line


def row(server_round: int, accuracy: float | None = 0.5) -> str:
    """A streamed per-round row, as the ServerApp logs it (fedapp.run_log.table_row)."""
    record = {C.LOG_ROUND: server_round, C.LOG_LOSS: 1.0, C.LOG_WALL_SECONDS: 2.0}
    if accuracy is not None:
        record[C.LOG_ACCURACY] = accuracy
    return INFO + table_row(record) + "\n"


class Clock:
    """A settable time.monotonic for the ETA arithmetic."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(P.time, "monotonic", fake)
    return fake


def test_rows_of_the_real_table_are_read_and_nothing_else():
    assert P.read_row(row(6, 0.8334)) == (6, 0.8334)
    assert P.read_row(row(12, None)) == (12, None)  # a round without evaluation
    assert P.read_row(INFO + table_header() + "\n") is None
    assert P.read_row("configure_train: sampled 10 of 10 nodes\n") is None
    assert P.read_row("    3 |  0.7000 |  0.9 |\n") is None  # the final table: no INFO prefix


def test_eta_is_the_mean_pace_times_the_rounds_left():
    assert P.eta_seconds(30.0, 3, 7) == pytest.approx(70.0)
    assert P.eta_seconds(30.0, 0, 7) is None
    assert P.eta_seconds(30.0, 3, 0) == 0.0
    assert [P.format_seconds(s) for s in (None, 0, 59.6, 61, 3600 + 62)] == [
        "?", "0:00:00", "0:01:00", "0:01:01", "1:01:02"]


def test_a_resumed_run_times_only_the_rounds_it_runs():
    state = P.RunRounds(rounds=10)
    assert state.feed("INFO :      Resuming /runs/x after round 3 (run log continues in ...)",
                      0.0) is None
    for server_round in range(4):  # the restored rows arrive at once
        state.feed(row(server_round), 1.0)
    assert (state.done, state.timed, state.clock_start) == (3, 0, 1.0)
    assert state.eta(1.0) is None
    assert state.feed(row(4), 11.0) == 1 and state.feed(row(5), 21.0) == 1
    assert state.feed(row(5), 22.0) == 0  # a row seen before
    assert state.timed == 2 and state.eta(21.0) == pytest.approx(20.0 / 2 * 5)


def test_sweep_prints_one_plain_line_per_round_with_the_sweep_eta(clock, capsys):
    with P.SweepProgress(total_rounds=6, live=False) as progress:
        progress.skip(2)  # a finished run of 2 rounds
        on_line = progress.start_run("[2/3] a seed 1", 2)
        clock.now = 110.0
        on_line(row(0, 0.1))  # round 0: no line
        on_line("configure_train: sampled 2 of 2 nodes\n")
        clock.now = 130.0
        on_line(row(1, 0.5))
        clock.now = 150.0
        on_line(row(2, None))
        progress.end_run()
        on_line = progress.start_run("[3/3] b seed 1", 2)
        clock.now = 155.0
        on_line(row(0, 0.1))
        clock.now = 160.0
        on_line(row(1, 0.25))
        progress.end_run()  # failed after round 1: its last round leaves the total
        assert (progress.total, progress.completed, progress.timed) == (5, 5, 3)
    assert capsys.readouterr().out.splitlines() == [
        "[2/3] a seed 1: round 1/2, accuracy 0.5000 (sweep 3/6 rounds, ETA 0:01:30)",
        "[2/3] a seed 1: round 2/2 (sweep 4/6 rounds, ETA 0:00:50)",
        "[3/3] b seed 1: round 1/2, accuracy 0.2500 (sweep 5/6 rounds, ETA 0:00:20)",
    ]


def test_round_progress_plain_lines(capsys):
    progress = P.RoundProgress("[1/2] fedavg seed 0", 20)
    progress(row(6, 0.8334))
    progress(INFO + table_header() + "\n")
    assert capsys.readouterr().out == "[1/2] fedavg seed 0: round 6/20, accuracy 0.8334\n"


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120, color_system=None), out


def test_run_bar_on_a_terminal_shows_rounds_accuracy_and_eta(clock):
    console, out = terminal()
    with P.RunProgress(3, live=True, console=console) as progress:
        clock.now = 110.0
        progress(row(0, 0.1))
        clock.now = 120.0
        progress(row(1, 0.6))
        task = progress.bars.tasks[0]
        assert (task.completed, task.fields["note"], task.fields["finish"]) == (
            1, "acc 0.6000", pytest.approx(140.0))
        assert "ETA 0:00:20" in str(P.EtaColumn().render(task))
        progress(row(3, 0.8125))
    shown = out.getvalue()
    assert "3/3" in shown and "acc 0.8125" in shown and "done" in shown


def test_sweep_bars_on_a_terminal_and_log_lines_above_them(clock):
    console, out = terminal()
    with P.SweepProgress(4, live=True, console=console) as progress:
        on_line = progress.start_run("[1/2] a seed 0", 2)
        on_line(row(0))
        print("a message printed while the bars are shown")
        clock.now = 110.0
        on_line(row(1, 0.75))
        sweep_task, run_task = progress.bars.tasks
        assert (sweep_task.completed, sweep_task.total, run_task.completed) == (1, 4, 1)
        assert sweep_task.fields["finish"] == pytest.approx(110.0 + 10 * 3)
        progress.end_run()
    shown = out.getvalue()
    assert "a message printed while the bars are shown" in shown
    assert "sweep" in shown and "[1/2] a seed 0" in shown and "acc 0.7500" in shown


def test_the_sweep_feeds_each_runs_stream_to_the_progress(tmp_path, monkeypatch, capsys):
    spec = {"seeds": [0], "base": {"num-server-rounds": 2}, "variants": {"a": {}, "b": {}}}

    def fake_run_app(run_config, federation, on_line, **kwargs):
        directory = Path(run_config["output-dir"]) / "run1"
        directory.mkdir(parents=True)
        records = [{C.LOG_ROUND: r, C.LOG_ACCURACY: 0.5 + r / 10} for r in range(3)]
        for record in records:
            on_line(INFO + table_row(record) + "\n")
        (directory / "rounds.jsonl").write_text(
            "".join(f'{{"round": {r[C.LOG_ROUND]}, "accuracy": {r[C.LOG_ACCURACY]}}}\n'
                    for r in records))
        (directory / "final_model.pt").write_bytes(b"")
        return SimpleNamespace(returncode=0, status="finished:completed", output="")

    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    done = sweep.execute(spec, tmp_path)
    assert len(done) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if "round 2/2" in line]
    assert [line.split(" (sweep")[0] for line in lines] == [
        "[1/2] a seed 0: round 2/2, accuracy 0.7000", "[2/2] b seed 0: round 2/2, accuracy 0.7000"]
    assert "(sweep 2/4 rounds, ETA" in lines[0] and "(sweep 4/4 rounds, ETA 0:00:00)" in lines[1]


def test_run_plans_the_rounds_from_the_override_or_the_app_default():
    assert planned_rounds({"num-server-rounds": 3}) == 3
    default = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                                  .read_text())["tool"]["flwr"]["app"]["config"]
    assert planned_rounds({}) == default["num-server-rounds"]
    assert planned_rounds({"num-server-rounds": "x"}) == default["num-server-rounds"]
