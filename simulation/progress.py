"""Live progress of ``run`` and ``sweep``, read from the ServerApp's streamed per-round rows.

``flwr run --stream`` streams the ServerApp's log, in which every round record is one row
of the per-round table (``fedapp.run_log.table_row``, logged as ``INFO : r | acc | ...``;
round 0 is the initial model) and a resumed run says ``Resuming ... after round k``. On a
terminal, a rich progress bar with ETA over the rounds (a sweep: over runs x rounds) stays
at the bottom while the rest scrolls above it. Otherwise (CI logs, pipes, files) nothing
is redrawn: ``run`` prints the log as it is, ``sweep`` one plain line per round.

The ETA is the mean pace of the rounds timed so far times the rounds left: for ``run``
from its round-0 row (Ray and SuperLink start-up excluded), for ``sweep`` from the sweep's
start (each run's start-up included, since every run pays it). Rounds a resumed run took
from its checkpoint, and runs a sweep finds already done, count as done but are not timed.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task,
                           TextColumn, TimeElapsedColumn)
from rich.text import Text

ROUND_ROW = re.compile(r"INFO.{0,12}?:\s+(\d+) \|\s+([0-9.]+|-) \|")  # '-': no accuracy
RESUMED = re.compile(r"Resuming .* after round (\d+)")


def read_row(line: str) -> tuple[int, float | None] | None:
    """(round, accuracy or None when the row has none) of a per-round table row of the
    ServerApp log; None for any other line."""
    match = ROUND_ROW.search(line)
    if not match:
        return None
    accuracy = match.group(2)
    return int(match.group(1)), None if accuracy == "-" else float(accuracy)


def eta_seconds(elapsed: float, timed_rounds: int, rounds_left: int) -> float | None:
    """Seconds left at the mean pace so far: ``elapsed / timed_rounds * rounds_left``; None
    before the first timed round."""
    if rounds_left <= 0:
        return 0.0
    return elapsed / timed_rounds * rounds_left if timed_rounds > 0 else None


def format_seconds(seconds: float | None) -> str:
    """``h:mm:ss`` ('?' for unknown)."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def round_line(label: str, server_round: int, rounds: int, accuracy: float | None) -> str:
    """The plain progress line of one round: 'label: round r/R, accuracy a'."""
    text = f"{label}: round {server_round}/{rounds}"
    return text if accuracy is None else f"{text}, accuracy {accuracy:.4f}"


def on_terminal() -> bool:
    """True when stdout is a terminal (a live bar), False for CI logs, pipes and files."""
    return sys.stdout.isatty()


@dataclass
class RunRounds:
    """What one run's streamed log has said about its rounds 1..``rounds``."""

    rounds: int
    done: int = 0  # the last round whose row was seen
    restored: int = 0  # rounds a resumed run took from its checkpoint (not timed)
    accuracy: float | None = None  # the last accuracy a row showed
    row_accuracy: float | None = None  # the accuracy of the last row (None: not evaluated)
    clock_start: float | None = None  # when the row of round `restored` (0 if fresh) came

    @property
    def timed(self) -> int:
        """Rounds run (not restored) since the clock started."""
        return max(self.done - self.restored, 0) if self.clock_start is not None else 0

    def feed(self, line: str, now: float) -> int | None:
        """Read one log line; the number of rounds a round row completes (0 for round 0 or
        a row seen before), None for any other line."""
        resumed = RESUMED.search(line)
        if resumed:
            self.restored = int(resumed.group(1))
            return None
        row = read_row(line)
        if row is None:
            return None
        server_round, self.row_accuracy = row
        self.accuracy = self.accuracy if self.row_accuracy is None else self.row_accuracy
        if server_round == self.restored and self.clock_start is None:
            self.clock_start = now
        new = max(server_round - self.done, 0)
        self.done = max(self.done, server_round)
        return new

    def eta(self, now: float) -> float | None:
        """Seconds left in this run, from the pace of its timed rounds."""
        elapsed = now - self.clock_start if self.clock_start is not None else 0.0
        return eta_seconds(elapsed, self.timed, self.rounds - self.done)


class EtaColumn(ProgressColumn):
    """'ETA h:mm:ss', counting down between rows from the task's ``finish`` field (the
    ``time.monotonic()`` at which the task should end, or None while unknown)."""

    def render(self, task: Task) -> Text:
        finish = task.fields.get("finish")
        if task.finished:
            return Text("done", style="progress.elapsed")
        left = None if finish is None else max(finish - time.monotonic(), 0.0)
        return Text(f"ETA {format_seconds(left)}", style="progress.remaining")


def live_bars(console: Console | None = None) -> Progress:
    """The rich progress display: description, bar, r/R, accuracy, elapsed, ETA."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        EtaColumn(),
        console=console,
        refresh_per_second=2,
    )


def accuracy_note(accuracy: float | None) -> str:
    return "" if accuracy is None else f"acc {accuracy:.4f}"


class RunProgress:
    """Progress of one ``flwr run``: call it with every streamed line (``on_line``).

    On a terminal (``live``), a bar over the rounds with accuracy and ETA, the log scrolling
    above it (rich redirects stdout while the bar is shown); otherwise it prints nothing,
    the log's own table rows being the plain progress lines. Use as a context manager.
    """

    def __init__(self, rounds: int, label: str = "rounds", live: bool | None = None,
                 console: Console | None = None) -> None:
        self.state = RunRounds(rounds)
        self.live = on_terminal() if live is None else live
        self.bars = live_bars(console) if self.live else None
        self.task = None
        self.label = label

    def __enter__(self) -> RunProgress:
        if self.bars is not None:
            self.bars.start()
            self.task = self.bars.add_task(self.label, total=self.state.rounds, note="",
                                           finish=None)
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.stop()

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if self.state.feed(line, now) is not None and self.bars is not None:
            eta = self.state.eta(now)
            self.bars.update(self.task, completed=self.state.done,
                             note=accuracy_note(self.state.accuracy),
                             finish=None if eta is None else now + eta)


class SweepProgress:
    """Progress of a sweep over its runs x rounds.

    ``skip(rounds)`` counts a run found already done; ``start_run(label, rounds)`` returns
    the ``on_line`` callback of the run about to start; ``end_run()`` closes it (a failed
    run's missing rounds leave the total). On a terminal, two bars (the sweep and the
    current run) with ETA, messages printed above them; otherwise one plain line per round,
    'label: round r/R, accuracy a (sweep c/T rounds, ETA h:mm:ss)'.
    """

    def __init__(self, total_rounds: int, live: bool | None = None,
                 console: Console | None = None) -> None:
        self.total = total_rounds
        self.completed = 0  # rounds done, timed or not
        self.timed = 0  # rounds run in this sweep (restored ones excluded)
        self.started = time.monotonic()
        self.live = on_terminal() if live is None else live
        self.bars = live_bars(console) if self.live else None
        self.sweep_task = self.run_task = None
        self.run: RunRounds | None = None
        self.run_timed = 0

    def __enter__(self) -> SweepProgress:
        if self.bars is not None:
            self.bars.start()
            self.sweep_task = self.bars.add_task("sweep", total=self.total, note="rounds",
                                                 finish=None)
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.stop()

    def eta(self, now: float) -> float | None:
        """Seconds left in the sweep at its mean pace per timed round so far."""
        return eta_seconds(now - self.started, self.timed, self.total - self.completed)

    def skip(self, rounds: int) -> None:
        """A run that is already done: its rounds count as done, not timed."""
        self.completed += rounds
        self.refresh(time.monotonic())

    def start_run(self, label: str, rounds: int):
        """Track a run about to start; the callback for its streamed lines."""
        self.run, self.run_timed = RunRounds(rounds), 0
        if self.bars is not None:
            if self.run_task is not None:
                self.bars.remove_task(self.run_task)
            self.run_task = self.bars.add_task(label, total=rounds, note="", finish=None)

        def on_line(line: str) -> None:
            now = time.monotonic()
            new = self.run.feed(line, now)
            if not new:  # not a row, or no new round
                return
            self.completed += new
            self.timed += self.run.timed - self.run_timed
            self.run_timed = self.run.timed
            self.refresh(now)
            if self.bars is None:
                line = round_line(label, self.run.done, rounds, self.run.row_accuracy)
                print(f"{line} (sweep "
                      f"{self.completed}/{self.total} rounds, ETA "
                      f"{format_seconds(self.eta(now))})", flush=True)

        return on_line

    def end_run(self) -> None:
        """The current run ended; rounds it did not do leave the total."""
        if self.run is not None:
            self.total -= self.run.rounds - self.run.done
            self.run = None
        self.refresh(time.monotonic())

    def refresh(self, now: float) -> None:
        if self.bars is None:
            return
        eta = self.eta(now)
        self.bars.update(self.sweep_task, total=self.total, completed=self.completed,
                         finish=None if eta is None else now + eta)
        if self.run is not None and self.run_task is not None:
            run_eta = self.run.eta(now)
            self.bars.update(self.run_task, completed=self.run.done,
                             note=accuracy_note(self.run.accuracy),
                             finish=None if run_eta is None else now + run_eta)


class RoundProgress:
    """Prints 'label: round r/R, accuracy a' as the ServerApp's per-round rows stream by
    (one line each; overwritten in place on a terminal). For drivers without a bar."""

    def __init__(self, label: str, rounds: int) -> None:
        self.label, self.rounds = label, rounds
        self.tty = on_terminal()

    def __call__(self, line: str) -> None:
        row = read_row(line)
        if row is None:
            return
        text = round_line(self.label, row[0], self.rounds, row[1])
        print(("\r" + text) if self.tty else text, end="" if self.tty else "\n", flush=True)
