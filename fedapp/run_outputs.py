"""A run directory's results for a researcher: metrics.csv, summary.json and plots.

Written from ``rounds.jsonl`` and ``config.json`` after every round (:class:`LiveOutputs`:
metrics.csv and summary.json each round, the plots when redrawing them costs at most a
twentieth of the time since they were last drawn: they are drawn between rounds, so that
time adds to the run's) and when a run ends, also with an error;
so Ctrl-C, a crash or SIGKILL loses at most the round in flight. docs/outputs.md says what
each file holds.

* ``metrics.csv``: one row per round; the columns are the round log's numeric keys
  (:func:`csv_columns`): ``round``, ``accuracy``, ``loss``, then the others sorted. A bool is
  0 / 1; lists, dicts and strings are left out (they stay in rounds.jsonl); an empty cell is
  a round without that key (e.g. accuracy on a round that was not evaluated).
* ``summary.json``: the run in one object (:func:`summarize`).
* ``accuracy_loss_vs_round.png``, ``accuracy_loss_vs_bytes.png`` and, with the simulated
  clock, ``accuracy_loss_vs_sim_time.png`` (:mod:`fedapp.run_plots`).

Writing them never fails the run: a file that cannot be written is one WARNING naming it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

from strategies import contract as C

from .atomic_file import write_bytes_atomically
from .divergence import DivergenceWatch
from .run_log import CONFIG_FILE, read_json, read_rounds

METRICS_CSV = "metrics.csv"
SUMMARY_JSON = "summary.json"
PLOT_SHARE = 0.05  # at most this share of a run's time goes into redrawing its plots
TARGETS = (0.7, 0.75, 0.8)  # summary.json: the first round reaching each test accuracy
FIRST_COLUMNS = (C.LOG_ROUND, C.LOG_ACCURACY, C.LOG_LOSS)


ACCURACY_AXIS = "test accuracy (%)"  # the accuracy axis of every plot (run and report)
RUN_DIRECTORY = re.compile(r"(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})(\d{2})-")  # its date-time


def accuracy_percent(fraction: float) -> float:
    """A test accuracy as logged (a fraction) in percent: the one unit of accuracy in every
    plot and table (metrics.csv, summary.json and report.csv keep the fraction)."""
    return 100.0 * fraction


def time_unit(seconds: float) -> tuple[float, str]:
    """(divisor of seconds, unit) for simulated times up to ``seconds``: s up to 2 min, min
    up to 2 h, then h (so a number is never a small fraction of its unit)."""
    if seconds <= 120:
        return 1.0, "s"
    return (60.0, "min") if seconds <= 7200 else (3600.0, "h")


def started_at(directory_name: str, seconds: bool = False) -> str | None:
    """"2026-11-29 07:18" (``seconds``: "2026-11-29 07:18:28") of a run directory named
    ``20261129-071828-<strategy>-run<id>``; None for any other name."""
    match = RUN_DIRECTORY.match(directory_name)
    if match is None:
        return None
    year, month, day, hour, minute, second = match.groups()
    return f"{year}-{month}-{day} {hour}:{minute}" + (f":{second}" if seconds else "")


def run_title(strategy: object, seed: object, directory_name: str) -> str:
    """A run's plot title: strategy, seed and when it started, never its 19-digit run id:
    "fedavg (seed 0), 2026-11-29 07:18"."""
    title = f"{strategy or 'run'}" + ("" if seed is None else f" (seed {seed})")
    when = started_at(directory_name)
    if when is None:  # not a run directory's name: keep it, less any run id
        when = re.sub(r"-?run\d{6,}$", "", directory_name)
    return f"{title}, {when}" if when else title


def is_number(value: object) -> bool:
    """int, float or bool (a bool is 0 / 1 in metrics.csv)."""
    return isinstance(value, (bool, int, float))


def csv_columns(records: Sequence[Mapping[str, object]]) -> list[str]:
    """round, accuracy, loss, then every other key with a number in some round, sorted."""
    numeric = {key for record in records for key, value in record.items() if is_number(value)}
    first = [key for key in FIRST_COLUMNS if key in numeric or key == C.LOG_ROUND]
    return first + sorted(numeric - set(first))


def csv_cell(value: object) -> str:
    """A number as metrics.csv writes it (bool as 0 / 1, full float precision); anything
    else (absent, None, a list) as an empty cell."""
    if isinstance(value, bool):
        return str(int(value))
    return repr(value) if is_number(value) else ""


def metrics_csv(records: Sequence[Mapping[str, object]]) -> str:
    """The text of metrics.csv."""
    columns = csv_columns(records)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([csv_cell(record.get(key)) for key in columns])
    return text.getvalue()


def number(record: Mapping[str, object], key: str) -> float | None:
    """``record[key]`` as a float when it is a number (not a bool), else None."""
    value = record.get(key)
    return None if isinstance(value, bool) or not is_number(value) else float(value)


def cumulative_megabytes(records: Sequence[Mapping[str, object]]) -> list[float]:
    """MB (10^6 bytes) up + down so far at each round, a Power-of-Choice loss query's model
    downloads included (as ``python -m simulation report`` counts them)."""
    total, out = 0.0, []
    for record in records:
        total += sum(number(record, key) or 0.0
                     for key in (C.LOG_BYTES_UP, C.LOG_BYTES_DOWN, C.LOG_POC_QUERY_BYTES))
        out.append(total / 1e6)
    return out


def has_clock(records: Sequence[Mapping[str, object]]) -> bool:
    """Whether the run had a simulated clock (``sim-elapsed`` in some round)."""
    return any(number(record, C.LOG_SIM_ELAPSED) is not None for record in records)


def sim_elapsed(records: Sequence[Mapping[str, object]]) -> list[float]:
    """Simulated seconds since the start at each round (0 where a round has none: round 0)."""
    return [number(record, C.LOG_SIM_ELAPSED) or 0.0 for record in records]


def first_reaching(records: Sequence[Mapping[str, object]], target: float) -> dict:
    """The first evaluated round whose test accuracy is at least ``target``, with the MB so
    far and (with the clock) the simulated seconds so far then; round None if none does."""
    megabytes, clock, seconds = cumulative_megabytes(records), has_clock(records), \
        sim_elapsed(records)
    for index, record in enumerate(records):
        accuracy = number(record, C.LOG_ACCURACY)
        if accuracy is not None and accuracy >= target:
            return {"accuracy": target, "round": record.get(C.LOG_ROUND),
                    "mb": megabytes[index], "sim-seconds": seconds[index] if clock else None}
    return {"accuracy": target, "round": None, "mb": None, "sim-seconds": None}


def summarize(records: Sequence[Mapping[str, object]], config: Mapping[str, object],
              name: str = "") -> dict:
    """summary.json of a run: its config's strategy and seed, the split its accuracy was
    measured on (``evaluation-split``: ``test``, or ``validation`` for a tuning run; runs
    from before the key are ``test``), rounds done, final and best accuracy, MB up / down,
    simulated and wall seconds, the first round reaching each of :data:`TARGETS`, and the
    divergence warning if the loss diverged (else None)."""
    run_config = config.get("run-config", {}) if isinstance(config, Mapping) else {}
    scored = [r for r in records if number(r, C.LOG_ACCURACY) is not None]
    final = scored[-1] if scored else {}
    best = max(scored, key=lambda r: number(r, C.LOG_ACCURACY)) if scored else {}
    clock = has_clock(records)
    watch = DivergenceWatch()
    for record in records:
        watch.check(record)
    return {
        "run": name,
        "strategy": run_config.get("strategy"),
        "seed": run_config.get("seed"),
        "evaluation-split": run_config.get("evaluation-split", "test"),
        "rounds-planned": run_config.get("num-server-rounds"),
        "rounds-done": records[-1].get(C.LOG_ROUND) if records else None,
        "final-round": final.get(C.LOG_ROUND),
        "final-accuracy": number(final, C.LOG_ACCURACY),
        "final-loss": number(final, C.LOG_LOSS),
        "best-accuracy": number(best, C.LOG_ACCURACY),
        "best-accuracy-round": best.get(C.LOG_ROUND),
        "mb-up": sum(number(r, C.LOG_BYTES_UP) or 0.0 for r in records) / 1e6,
        "mb-down": sum(number(r, C.LOG_BYTES_DOWN) or 0.0 for r in records) / 1e6,
        "mb-total": cumulative_megabytes(records)[-1] if records else 0.0,
        "sim-seconds": sim_elapsed(records)[-1] if clock else None,
        "wall-seconds": number(records[-1], C.LOG_ELAPSED_SECONDS) if records else None,
        "targets": [first_reaching(records, target) for target in TARGETS],
        "diverged": watch.found,
    }


def json_text(payload: object) -> str:
    """JSON with non-finite numbers as null (strict JSON readers refuse NaN)."""
    def clean(value: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clean(item) for item in value]
        return value
    return json.dumps(clean(payload), indent=1) + "\n"


def valid_records(records: list) -> list[dict]:
    """The records that are objects with an integer round (others cannot be placed)."""
    return [r for r in records if isinstance(r, dict) and isinstance(r.get(C.LOG_ROUND), int)]


def read_config(directory: Path) -> dict:
    """config.json (or config.json.xz) of the run, or {} when it is missing or not JSON."""
    try:
        config = read_json(directory, CONFIG_FILE)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def write_run_outputs(directory: Path, plots: bool = True) -> list[Path]:
    """Write metrics.csv, summary.json and (with ``plots``) the plots into run directory
    ``directory``; the paths written. Never raises: each failure is one WARNING naming the
    file."""
    directory = Path(directory)
    try:
        records = valid_records(read_rounds(directory))
    except (OSError, ValueError) as exc:
        log(WARNING, "Run outputs: %s not written, %s could not be read: %s",
            ", ".join([METRICS_CSV, SUMMARY_JSON, "plots"]), directory / "rounds.jsonl", exc)
        return []
    config = read_config(directory)
    summary = summarize(records, config, directory.name)
    written = []
    for name, text in ((METRICS_CSV, lambda: metrics_csv(records)),
                       (SUMMARY_JSON, lambda: json_text(summary))):
        try:
            written.append(write_bytes_atomically(directory / name, text().encode()))
        except Exception as exc:  # noqa: BLE001 - an output is never worth the run
            log(WARNING, "Run outputs: %s not written: %s", directory / name, exc)
    if plots:
        written += plot_run(directory, records, summary)
    return written


def plot_run(directory: Path, records: list[dict], summary: Mapping[str, object]) -> list[Path]:
    """The plots (:mod:`fedapp.run_plots`, which imports matplotlib), each guarded."""
    try:
        from . import run_plots  # noqa: PLC0415 - matplotlib only once the rounds are over
    except Exception as exc:  # noqa: BLE001
        log(WARNING, "Run outputs: no plots in %s, matplotlib is unavailable: %s", directory, exc)
        return []
    title = run_title(summary.get("strategy"), summary.get("seed"), directory.name)
    written = []
    for name, plot in run_plots.plots_for(records):
        try:
            written.append(plot(records, directory / name, title))
        except Exception as exc:  # noqa: BLE001
            log(WARNING, "Run outputs: %s not written: %s", directory / name, exc)
    return written


class LiveOutputs:
    """A running run's outputs, brought up to date after each round (module docstring)."""

    def __init__(self, directory: Path, plots: bool) -> None:
        self.directory, self.plots = Path(directory), bool(plots)
        self.drawn_at = -math.inf  # perf_counter when the plots were last drawn
        self.plot_seconds = 0.0  # how long that took

    def update(self) -> None:
        """metrics.csv and summary.json now; the plots too when they are due."""
        start = time.perf_counter()
        due = self.plots and self.plot_seconds <= PLOT_SHARE * (start - self.drawn_at)
        write_run_outputs(self.directory, due)
        if due:
            self.drawn_at = time.perf_counter()
            self.plot_seconds = self.drawn_at - start
