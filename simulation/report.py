"""``python -m simulation report PATH...``: tables and plots of a sweep's runs, or of any runs.

A PATH is a sweep's results folder (every ``<PATH>/<variant>/seed<k>/<run>/rounds.jsonl``),
one run directory (``<PATH>/rounds.jsonl``), or a folder of run directories (an
``output-dir``); several may be mixed (:func:`collect_paths`). The report goes into the one
PATH given (a run directory: its ``report/``), or ``--out``, which several PATHs need. A
sweep folder that keeps its sweep file (``sweep.toml``, :mod:`simulation.sweep`) gives the
report its title, targets (unless ``--target``), baselines, variant order and published
numbers. Each variant is labelled by its strategy and the run-config keys that tell it
apart from the others (:mod:`simulation.report_labels`); accuracy is in % in every table
and plot (report.csv keeps fractions), simulated time in s, min or h by its magnitude
(report.csv keeps seconds). The report holds:

* ``report.csv`` and ``report.md``: per variant, final and best test accuracy (mean ± std
  over seeds), rounds-to-target and bytes-to-target (best-so-far curve, linear
  interpolation, McMahan et al.; mean over the seeds that reach it, "n/k" reached), and
  where the runs carry the simulated clock (``device-profiles``) the simulated time to
  each target (``sim-seconds-to-<target>``); where asynchronous and synchronous strategies
  are compared, a note that an asynchronous "round" is one server update
  (:mod:`simulation.report_async`);
* ``accuracy_vs_round.png`` and ``accuracy_vs_bytes.png``: mean over seeds with the
  min-max band, one line per variant; with the clock also ``accuracy_vs_sim_time.png``;
* ``label_distribution_<setting>.png``: the clients' label counts, one picture per
  partition setting among the runs (:mod:`simulation.report_partitions`);
* with ``baselines`` (variant-name prefix -> baseline variant, e.g. FedSGD), the speedup
  in rounds to target against the baseline (McMahan et al. Tables 1, 2, 4);
* communication per run: MB up + down (mean over seeds) and, where the run logs carry
  them (DynamicFL), the mean cost kappa-hat, sync events and high-group size per round;
* where the run logs carry client-drift diagnostics, the per-layer mean pairwise cosine
  similarity of client updates averaged over rounds and seeds (IID->non-IID study, Fig. 13);
* with ``published`` (variant -> a paper's accuracy), each variant's final accuracy next to
  the published number and a verdict: agrees within ``tolerance``, or above / below by how
  many points (report.csv gains ``published``, ``final-minus-published`` and ``verdict``).

``python -m simulation results`` (:mod:`simulation.results`) runs this for every
experiment with runs.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import textwrap
import tomllib
from pathlib import Path

import numpy as np

from fedapp.run_log import has_round_log, read_rounds, run_directories, run_finished
from fedapp.run_outputs import ACCURACY_AXIS, accuracy_percent, time_unit
from strategies import contract as C
from task.figure_png import save_png

from .metrics import (bytes_to_target, cumulative_bytes, evaluated, evaluated_bytes, has_clock,
                      last_mean, percent_over_seeds, rounds_to_target, sim_elapsed,
                      sim_seconds_to_target, updates_to_target)
from .protocol import Claim, claims_of
from .report_async import ROUND_MARK, caveat, mixes_async, round_axis
from .report_labels import variant_configs, variant_labels
from .report_partitions import write_pictures
from .report_protocol import protocol_section
from .report_splits import refuse_published, split_note
from .runtime import fraction
from .stats import mean_interval
from .tuning import read_chosen

SWEEP_COPY = "sweep.toml"  # a sweep folder's copy of its sweep file (simulation.sweep)
DEFAULT_TARGETS = [0.6, 0.7]
LEGEND_INSIDE = (8, 40)  # a legend of at most this many labels of at most this many characters
# sits in its panel; a longer one goes below it, each label wrapped at LEGEND_WIDTH characters
LEGEND_WIDTH = 60
Runs = dict[str, list[tuple[Path, list[dict]]]]


def collect(folder: Path) -> dict[str, list[tuple[Path, list[dict]]]]:
    """variant -> [(run directory, round records)] for every finished run under folder."""
    runs: dict[str, list[tuple[Path, list[dict]]]] = {}
    for run_dir in run_directories(folder, "*/seed*/*"):  # rounds.jsonl or rounds.jsonl.xz
        variant = run_dir.parent.parent.name
        if run_finished(run_dir):
            runs.setdefault(variant, []).append((run_dir, read_rounds(run_dir)))
    return runs


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is one run directory (it has a round log)."""
    return has_round_log(path)


def is_sweep_folder(path: Path) -> bool:
    """Whether ``path`` holds runs in a sweep's ``<variant>/seed<k>/<run>/`` layout."""
    return bool(run_directories(path, "*/seed*/*"))


def run_label(run_dir: Path) -> str:
    """A run directory's variant: its sweep variant when it sits in a sweep's layout (so
    that the seeds of a variant are averaged), else its own name (the tables print
    :func:`simulation.report_labels.variant_labels` instead, where the run has a config)."""
    return run_dir.parent.parent.name if run_dir.parent.name.startswith("seed") else run_dir.name


def records_to_report(run_dir: Path) -> list[dict] | None:
    """A named run directory's records: all of a finished run; of an unfinished one, those
    up to its last evaluated round (with a note); None (with a note) when none was evaluated."""
    records = read_rounds(run_dir)
    if run_finished(run_dir):
        return records
    scored = [i for i, r in enumerate(records) if r.get(C.LOG_ACCURACY) is not None]
    if not scored:
        print(f"note: {run_dir} has no evaluated round yet; left out")
        return None
    print(f"note: {run_dir} is not finished; its rounds up to {records[scored[-1]][C.LOG_ROUND]} "
          "are reported")
    return records[:scored[-1] + 1]


def collect_paths(paths: list[Path]) -> tuple[Runs, list[dict]]:
    """label -> [(run directory, round records)] of every run the PATHs name, and the sweep
    files kept in the sweep folders among them (in PATH order).

    A sweep folder's runs are labelled by their variant, prefixed with ``<folder name>/``
    when several sweep folders are given; a run directory by :func:`run_label`. A run
    directory named twice counts once."""
    sweeps = [p for p in paths if not is_run_dir(p) and is_sweep_folder(p)]
    runs: Runs = {}
    seen: set[Path] = set()
    for path in paths:
        if path in sweeps:
            prefix = f"{path.name}/" if len(sweeps) > 1 else ""
            found = [(f"{prefix}{variant}", run_dir, records)
                     for variant, items in collect(path).items() for run_dir, records in items]
        else:
            named = [path] if is_run_dir(path) else run_directories(path)
            if not named:
                raise SystemExit(f"{path}: neither a run directory (rounds.jsonl), a folder of "
                                 "run directories, nor a sweep folder (<variant>/seed<k>/<run>/)")
            found = [(run_label(d), d, r) for d in named
                     for r in [records_to_report(d)] if r is not None]
        for label, run_dir, records in found:
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                runs.setdefault(label, []).append((run_dir, records))
    specs = [tomllib.loads((p / SWEEP_COPY).read_text()) for p in sweeps
             if (p / SWEEP_COPY).is_file()]
    return runs, specs


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def any_clock(runs: dict[str, list[tuple[Path, list[dict]]]]) -> bool:
    """Whether any run carries the simulated clock."""
    return any(has_clock(r) for items in runs.values() for _, r in items)


def sim_unit(runs: Runs) -> tuple[float, str]:
    """(divisor of seconds, unit) of the report's simulated run times: s, min or h by the
    longest clocked run (:func:`fedapp.run_outputs.time_unit`), one unit for the time per
    run in the tables and the x-axis of accuracy_vs_sim_time.png."""
    longest = max((float(sim_elapsed(r)[-1]) for items in runs.values() for _, r in items
                   if has_clock(r)), default=0.0)
    return time_unit(longest)


def target_time_unit(rows: list[dict]) -> tuple[float, str]:
    """(divisor of seconds, unit) of the simulated times to the targets: s or min (h) by
    the largest of them, one unit for all the table's "sim ... to" columns."""
    return time_unit(max((v for row in rows for k, v in row.items()
                          if k.startswith("sim-seconds-to-") and v is not None), default=0.0))


def table_rows(runs: dict[str, list[tuple[Path, list[dict]]]], targets: list[float],
               labels: dict[str, str] | None = None) -> list[dict]:
    """One row per variant (report.csv: accuracy as a fraction, simulated time in seconds);
    ``label`` is what the tables print (:func:`simulation.report_labels.variant_labels`)."""
    clock = any_clock(runs)
    rows = []
    for variant, items in runs.items():
        records = [r for _, r in items]
        final_m, final_s = _mean_std([r[-1][C.LOG_ACCURACY] for r in records])
        best_m, best_s = _mean_std([max(x[C.LOG_ACCURACY] for x in evaluated(r))
                                    for r in records])
        row = {"variant": variant, "seeds": len(records), "rounds": len(records[0]) - 1,
               "final-mean": final_m, "final-std": final_s, "best-mean": best_m, "best-std": best_s}
        last = mean_interval([last_mean(r) for r in records])
        row.update({"last10-mean": last.mean, "last10-low": last.low, "last10-high": last.high})
        for target in targets:
            reached = [rounds_to_target(r, target) for r in records]
            got = [x for x in reached if x is not None]
            megabytes = [
                b / 1e6 for b in (bytes_to_target(r, target) for r in records) if b is not None
            ]
            row[f"rounds-to-{target:g}"] = statistics.mean(got) if got else None
            row[f"MB-to-{target:g}"] = statistics.mean(megabytes) if megabytes else None
            if clock:
                seconds = [s for s in (sim_seconds_to_target(r, target) for r in records)
                           if s is not None]
                row[f"sim-seconds-to-{target:g}"] = (statistics.mean(seconds) if seconds
                                                     else None)
            row[f"reached-{target:g}"] = f"{len(got)}/{len(records)}"
        if clock:
            row["sim-seconds-total"] = statistics.mean(float(sim_elapsed(r)[-1]) for r in records)
        row["label"] = (labels or {}).get(variant, variant)
        rows.append(row)
    return rows


def label(row: dict) -> str:
    """What the tables call a row's variant."""
    return row.get("label", row["variant"])


def markdown(rows: list[dict], targets: list[float], sim: tuple[float, str] = (1.0, "s"),
             round_mark: str = "", protocol: bool = False) -> str:
    """The main table: accuracy in % (final and best; under the comparison ``protocol`` the
    one metric, the mean of the last 10 evaluations with its 95 % interval), rounds
    (``round_mark`` on their header where an asynchronous round is a server update), MB and
    simulated time (``sim``: divisor of seconds, unit) to each target."""
    clock = bool(rows) and any(k.startswith("sim-seconds-to-") for k in rows[0])
    divisor, unit = sim
    head = ("| variant | seeds | last-10 mean accuracy (%) |" if protocol else
            "| variant | seeds | final accuracy (%) | best accuracy (%) |")
    rule = "|---|---|---|" if protocol else "|---|---|---|---|"
    for target in targets:
        head += (f" rounds{round_mark} to {accuracy_percent(target):g}% | MB to "
                 f"{accuracy_percent(target):g}% |")
        rule += "---|---|"
        if clock:
            head += f" sim {unit} to {accuracy_percent(target):g}% |"
            rule += "---|"
    lines = [head, rule]
    for row in rows:
        line = (
            f"| {label(row)} | {row['seeds']} | {interval_cell(row)} |" if protocol else
            f"| {label(row)} | {row['seeds']} | {percent_over_seeds(row, 'final')} "
            f"| {percent_over_seeds(row, 'best')} |"
        )
        for target in targets:
            rounds, mb, reached = (
                row[f"rounds-to-{target:g}"],
                row[f"MB-to-{target:g}"],
                row[f"reached-{target:g}"],
            )
            line += (
                f" {rounds:.1f} ({reached}) | {mb:.1f} |"
                if rounds is not None
                else f" not reached ({reached}) | - |"
            )
            if clock:
                seconds = row[f"sim-seconds-to-{target:g}"]
                line += f" {seconds / divisor:.4g} |" if seconds is not None else " - |"
        lines.append(line)
    return "\n".join(lines)


def interval_cell(row: dict) -> str:
    """A row's last-10 mean in % with its 95 % interval ("83.12 [82.40, 83.84]")."""
    mean, low, high = (100 * row[f"last10-{k}"] for k in ("mean", "low", "high"))
    return f"{mean:.2f}" if int(row["seeds"]) < 2 else f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def baseline_of(variant: str, baselines: dict[str, str]) -> str | None:
    """The baseline variant for ``variant``: the one named for its longest matching prefix."""
    matches = [prefix for prefix in baselines if variant.startswith(prefix)]
    return baselines[max(matches, key=len)] if matches else None


def speedup_markdown(rows: list[dict], targets: list[float], baselines: dict[str, str],
                     metric: str = "rounds") -> str:
    """Rounds-to-target (``metric="sim-seconds"``: simulated-time-to-target) speedup against
    each row's baseline ("≥" where the baseline never reached the target within its run:
    its rounds, or its simulated seconds, are a lower bound)."""
    budget = "rounds" if metric == "rounds" else "sim-seconds-total"
    by_name = {row["variant"]: row for row in rows}
    head = "| variant | baseline |" + "".join(f" speedup to {accuracy_percent(t):g}% |"
                                              for t in targets)
    lines = [head, "|---|---|" + "---|" * len(targets)]
    for row in rows:
        base = by_name.get(baseline_of(row["variant"], baselines) or "")
        if base is None or base is row:
            continue
        cells = []
        for target in targets:
            ours, theirs = row.get(f"{metric}-to-{target:g}"), base.get(f"{metric}-to-{target:g}")
            if ours is None or ours <= 0:
                cells.append("-")
            elif theirs is None:
                cells.append(f"≥ {base[budget] / ours:.1f}×")
            else:
                cells.append(f"{theirs / ours:.1f}×")
        lines.append(f"| {label(row)} | {label(base)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def compare_published(rows: list[dict], published: dict[str, float], tolerance: float) -> None:
    """Add ``published``, ``final-minus-published`` and ``verdict`` to every row (in place).

    The verdict compares the mean final accuracy with the published number: "agrees" when
    they differ by at most ``tolerance``, else "above" / "below" by so many points; a
    variant without a published number gets "no published number".
    """
    for row in rows:
        paper = published.get(row["variant"])
        if paper is None:
            row.update({"published": None, "final-minus-published": None,
                        "verdict": "no published number"})
            continue
        diff = row["final-mean"] - float(paper)
        if abs(diff) <= tolerance + 1e-12:
            verdict = f"agrees (within {100 * tolerance:g} points)"
        else:
            verdict = f"{'above' if diff > 0 else 'below'} by {100 * abs(diff):.1f} points"
        row.update({"published": float(paper), "final-minus-published": diff, "verdict": verdict})


def published_markdown(rows: list[dict]) -> str:
    """Measured final / best accuracy against the published numbers, with the verdicts."""
    lines = ["| variant | seeds | final (%) | best (%) | published (%) | final − published "
             "(points) | verdict |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        paper, diff = row["published"], row["final-minus-published"]
        lines.append(
            f"| {label(row)} | {row['seeds']} | {percent_over_seeds(row, 'final')} | "
            f"{percent_over_seeds(row, 'best')} | "
            f"{'-' if paper is None else f'{accuracy_percent(paper):.1f}'} | "
            f"{'-' if diff is None else f'{100 * diff:+.1f}'} | {row['verdict']} |")
    return "\n".join(lines)


def drift_markdown(runs: dict[str, list[tuple[Path, list[dict]]]],
                   labels: dict[str, str] | None = None) -> str:
    """Per variant and layer, the mean pairwise cosine of client updates over rounds and seeds."""
    table: dict[str, dict[str, float]] = {}
    layers: list[str] = []
    for variant, items in runs.items():
        values: dict[str, list[float]] = {}
        for _, records in items:
            for record in records:
                for layer, cosine in (record.get(C.LOG_DRIFT_COSINE) or {}).items():
                    values.setdefault(layer, []).append(cosine)
                    if layer not in layers:
                        layers.append(layer)
        if values:
            table[variant] = {layer: statistics.mean(v) for layer, v in values.items()}
    if not table:
        return ""
    lines = [
        "| variant |" + "".join(f" {layer} |" for layer in layers),
        "|---|" + "---|" * len(layers),
    ]
    for variant, means in table.items():
        lines.append(
            f"| {(labels or {}).get(variant, variant)} |"
            + "".join(f" {means[layer]:.3f} |" if layer in means else " - |" for layer in layers)
        )
    return "\n".join(lines)


def communication_markdown(runs: dict[str, list[tuple[Path, list[dict]]]],
                           labels: dict[str, str] | None = None) -> str:
    """Per variant: MB up + down over the whole run, and DynamicFL's per-round kappa-hat,
    sync events and |z| (means over rounds and seeds; "-" where a run does not log them)."""
    keys = {
        C.LOG_KAPPA_HAT: "mean kappa-hat",
        C.LOG_SYNC_EVENTS: "sync events / round",
        C.LOG_DYNAMICFL_GROUP_SIZE: "mean high-group size |z|",
    }
    logged = [
        k for k in keys if any(k in x for items in runs.values() for _, r in items for x in r)
    ]
    lines = [
        "| variant | MB up + down per run |" + "".join(f" {keys[k]} |" for k in logged),
        "|---|---|" + "---|" * len(logged),
    ]
    for variant, items in runs.items():
        total = statistics.mean(cumulative_bytes(r)[-1] for _, r in items) / 1e6
        cells = []
        for key in logged:
            values = [x[key] for _, r in items for x in r if x.get(key) is not None]
            cells.append(f" {statistics.mean(values):.4g} |" if values else " - |")
        lines.append(f"| {(labels or {}).get(variant, variant)} | {total:.1f} |"
                     + "".join(cells))
    return "\n".join(lines)


def updates_markdown(runs: dict[str, list[tuple[Path, list[dict]]]], targets: list[float],
                     labels: dict[str, str] | None = None) -> str:
    """Per variant, the client updates aggregated until each target (mean over the seeds
    that reach it, "n/k" reached), and in all."""
    head = "| variant |" + "".join(f" updates to {accuracy_percent(t):g}% |"
                                   for t in targets) + " updates |"
    lines = [head, "|---|" + "---|" * (len(targets) + 1)]
    for variant, items in runs.items():
        records = [r for _, r in items]
        cells = []
        for target in targets:
            got = [u for u in (updates_to_target(r, target) for r in records) if u is not None]
            cells.append(f"{statistics.mean(got):.0f} ({len(got)}/{len(records)})" if got
                         else f"not reached (0/{len(records)})")
        total = statistics.mean(sum(float(x.get(C.LOG_CLIENTS_RECEIVED, 0) or 0) for x in r)
                                for r in records)
        lines.append(f"| {(labels or {}).get(variant, variant)} | " + " | ".join(cells)
                     + f" | {total:.0f} |")
    return "\n".join(lines)


def clock_markdown(runs: dict[str, list[tuple[Path, list[dict]]]],
                   labels: dict[str, str] | None = None) -> str:
    """Per variant: simulated time of the whole run (in the report's unit, :func:`sim_unit`),
    simulated time per round (s or min, by its own magnitude), and per round the clients cut
    by the deadline (partial work or dropped), dropped, and offline."""
    clocked = {v: items for v, items in runs.items() if all(has_clock(r) for _, r in items)}
    divisor, unit = sim_unit(clocked)
    per_round = {v: [x[C.LOG_SIM_SECONDS] for _, r in items for x in r[1:]
                     if x.get(C.LOG_SIM_SECONDS) is not None] for v, items in clocked.items()}
    round_divisor, round_unit = time_unit(max((statistics.mean(v) for v in per_round.values()
                                               if v), default=0.0))
    keys = {C.LOG_CLIENTS_STRAGGLERS: "cut / round", C.LOG_CLIENTS_DROPPED: "dropped / round",
            C.LOG_CLIENTS_UNAVAILABLE: "offline / round"}
    lines = [f"| variant | simulated time per run ({unit}) | sim {round_unit} / round |"
             + "".join(f" {t} |" for t in keys.values()),
             "|---|---|---|" + "---|" * len(keys)]
    for variant, items in clocked.items():
        total = statistics.mean(float(sim_elapsed(r)[-1]) for _, r in items) / divisor
        seconds = per_round[variant]
        cells = [f" {statistics.mean(seconds) / round_divisor:.4g} |" if seconds else " - |"]
        for key in keys:
            values = [x[key] for _, r in items for x in r[1:] if x.get(key) is not None]
            cells.append(f" {statistics.mean(values):.4g} |" if values else " - |")
        lines.append(f"| {(labels or {}).get(variant, variant)} | {total:.3g} |" + "".join(cells))
    return "\n".join(lines)


def panels_of(variants: list[str], baselines: dict[str, str]) -> dict[str, list[str]]:
    """Variants grouped by the baseline prefix they match (one plot panel per setting, e.g.
    'c2-' and 'dir0.1-'); variants matching no prefix share one panel."""
    groups: dict[str, list[str]] = {}
    for variant in variants:
        matches = [prefix for prefix in baselines if variant.startswith(prefix)]
        groups.setdefault(max(matches, key=len) if matches else "", []).append(variant)
    return groups


def plot_curves(
    runs: dict[str, list[tuple[Path, list[dict]]]],
    path: Path,
    by_bytes: bool,
    baselines: dict[str, str] | None = None,
    by_sim_time: bool = False,
    labels: dict[str, str] | None = None,
    round_label: tuple[str, str] = ("round", ""),
) -> None:
    """Mean test accuracy (%) over seeds with a min-max band, per variant (legend: its
    label); one panel per setting. x: the round (``round_label``: its label and the figure's
    title), the communicated MB (``by_bytes``) or the simulated time in the report's unit
    (``by_sim_time``, :func:`sim_unit`), each averaged over the seeds at every round."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    groups = panels_of(list(runs), baselines or {})
    divisor, unit = sim_unit(runs)
    fig = Figure(figsize=(7.5 * len(groups), 4.5))
    FigureCanvasAgg(fig)
    for index, (prefix, variants) in enumerate(groups.items()):
        ax = fig.add_subplot(1, len(groups), index + 1)
        for number, variant in enumerate(variants):
            items = runs[variant]
            length = min(len(evaluated(r)) for _, r in items)
            acc = accuracy_percent(np.array([[x[C.LOG_ACCURACY] for x in evaluated(r)[:length]]
                                             for _, r in items]))
            if by_sim_time:
                xs = np.mean([sim_elapsed(evaluated(r)[:length]) for _, r in items],
                             axis=0) / divisor
            elif by_bytes:
                xs = np.mean([evaluated_bytes(r)[:length] for _, r in items], axis=0) / 1e6
            else:
                xs = np.array([x[C.LOG_ROUND] for x in evaluated(items[0][1])[:length]])
            style = {"color": f"C{number % 10}", "linestyle": "-" if number < 10 else "--"}
            seeds = f"{len(items)} seed" + ("s" if len(items) > 1 else "")
            name = f"{(labels or {}).get(variant, variant)} ({seeds})"
            ax.plot(xs, acc.mean(axis=0), **style,
                    label=textwrap.fill(name, LEGEND_WIDTH, break_on_hyphens=False))
            ax.fill_between(xs, acc.min(axis=0), acc.max(axis=0), alpha=0.15, color=style["color"])
        if by_bytes and not by_sim_time:
            ax.set_xscale("symlog", linthresh=10.0)
        ax.set_xlabel(f"simulated time ({unit}, device profiles)" if by_sim_time else
                      "communicated MB (up + down)" if by_bytes else round_label[0])
        ax.set_ylabel(ACCURACY_AXIS)
        if prefix:
            ax.set_title(prefix.rstrip("-_"))
        ax.grid(alpha=0.3)
        place_legend(ax)
    if round_label[1] and not (by_bytes or by_sim_time):
        fig.suptitle(textwrap.fill(round_label[1], 85 * len(groups)), fontsize="medium")
    fig.tight_layout()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    save_png(fig, path, dpi=100, bbox_inches="tight", bbox_extra_artists=legends)  # a legend
    # below its panel included


def place_legend(ax) -> None:
    """The legend in the panel when it is short (:data:`LEGEND_INSIDE`), else below it."""
    _, names = ax.get_legend_handles_labels()
    count, width = LEGEND_INSIDE
    if len(names) <= count and all(len(n) <= width for n in names):
        ax.legend(fontsize="small")
    else:  # outside tight_layout's reckoning; savefig's bbox_extra_artists takes it in
        ax.legend(fontsize="small", loc="upper center",
                  bbox_to_anchor=(0.5, -0.14)).set_in_layout(False)


def build_report(
    folder: Path,
    out: Path,
    targets: list[float],
    baselines: dict[str, str] | None = None,
    header: str = "",
    order: list[str] | None = None,
    published: dict[str, float] | None = None,
    published_source: str = "",
    tolerance: float = 0.015,
    claims: list[Claim] | None = None,
) -> str:
    """Write report.csv, report.md and plots for the sweep in ``folder``; returns the tables.

    Variants appear in ``order`` (e.g. the sweep file's), then any others by name. With
    ``published`` (variant -> accuracy from ``published_source``), a verdict per variant
    (:func:`compare_published`); with ``claims``, the protocol section
    (:mod:`simulation.report_protocol`, with the folder's tuning choices)."""
    runs = collect(folder)
    if not runs:
        raise SystemExit(
            f"no finished runs under {folder} (expected <variant>/seed<k>/<run>/rounds.jsonl)"
        )
    return write_report(runs, out, targets, baselines, header, order, published,
                        published_source, tolerance, claims, read_chosen(folder))


def write_report(
    runs: Runs,
    out: Path,
    targets: list[float],
    baselines: dict[str, str] | None = None,
    header: str = "",
    order: list[str] | None = None,
    published: dict[str, float] | None = None,
    published_source: str = "",
    tolerance: float = 0.015,
    claims: list[Claim] | None = None,
    chosen: dict | None = None,
) -> str:
    """:func:`build_report` of runs already collected (label -> runs, not empty)."""
    rank = {name: i for i, name in enumerate(order or [])}
    runs = dict(sorted(runs.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))
    out.mkdir(parents=True, exist_ok=True)
    configs = variant_configs(runs)
    # a protocol page names each variant as its sweep file and claims do; elsewhere the label
    # is what sets a variant apart (simulation.report_labels)
    labels = {v: v for v in runs} if claims else variant_labels(runs)
    rows = table_rows(runs, targets, labels)
    if published:
        refuse_published(runs, published)  # never a tuning run's accuracy against a paper's
        compare_published(rows, published, tolerance)
    with (out / "report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    mixed = mixes_async(configs)
    table = split_note(runs) + caveat(configs, any_clock(runs)) + markdown(
        rows, targets, target_time_unit(rows), ROUND_MARK if mixed else "", bool(claims))
    if claims:
        table = protocol_section(claims, runs, labels, out, chosen) + table
    if published:
        table = (f"Against the published numbers ({published_source or 'published'}; final "
                 f"accuracy, mean over seeds; agreement means within {100 * tolerance:g} "
                 "points):\n\n" + published_markdown(rows) + "\n\n" + table)
    speedups = speedup_markdown(rows, targets, baselines or {})
    if speedups:
        table += (f"\n\nSpeedup in rounds{ROUND_MARK if mixed else ''} to target against the "
                  "baseline:\n\n" + speedups)
    sim_speedups = speedup_markdown(rows, targets, baselines or {}, metric="sim-seconds")
    if any_clock(runs) and sim_speedups:
        table += ("\n\nSpeedup in simulated time to target against the baseline:\n\n"
                  + sim_speedups)
    if any(C.LOG_CLIENTS_RECEIVED in x for items in runs.values() for _, r in items for x in r):
        table += ("\n\nClient updates aggregated until the target (\"client trips\", FedBuff's "
                  "measure):\n\n" + updates_markdown(runs, targets, labels))
    table += "\n\nCommunication (means over seeds):\n\n" + communication_markdown(runs, labels)
    if any_clock(runs):
        table += ("\n\nSimulated time (device profiles; means over rounds and seeds):\n\n"
                  + clock_markdown(runs, labels))
    drift = drift_markdown(runs, labels)
    if drift:
        table += (
            "\n\nClient drift: mean pairwise cosine similarity of the client updates per layer, "
            "averaged over rounds and seeds:\n\n" + drift
        )
    pictures = write_pictures(runs, labels, out)
    if pictures:
        table += ("\n\nLabel distributions of the clients, one picture per partition setting:"
                  "\n\n" + pictures)
    (out / "report.md").write_text(header + table + "\n")
    plot_curves(runs, out / "accuracy_vs_round.png", by_bytes=False, baselines=baselines,
                labels=labels, round_label=round_axis(configs))
    plot_curves(runs, out / "accuracy_vs_bytes.png", by_bytes=True, baselines=baselines,
                labels=labels)
    if any_clock(runs):
        plot_curves({v: items for v, items in runs.items() if all(has_clock(r) for _, r in items)},
                    out / "accuracy_vs_sim_time.png", by_bytes=False, baselines=baselines,
                    by_sim_time=True, labels=labels)
    return table


def build_report_for(paths: list[Path], out: Path | None,
                     targets: list[float] | None = None) -> str:
    """The report of any mix of sweep folders and run directories (:func:`collect_paths`),
    with the first kept sweep file's title, targets (where ``targets`` is None), and, when
    one sweep folder is given, its baselines, variant order and published numbers."""
    runs, specs = collect_paths(paths)
    if not runs:
        raise SystemExit(f"no finished runs in {', '.join(map(str, paths))} (a sweep folder "
                         "holds <variant>/seed<k>/<run>/rounds.jsonl, a run directory "
                         "rounds.jsonl)")
    if out is None:
        if len(paths) > 1:
            raise SystemExit("several PATHs: say where the report goes with --out FOLDER")
        out = paths[0] / "report" if is_run_dir(paths[0]) else paths[0]
    titled = next((spec for spec in specs if "title" in spec), None)
    header = "" if titled is None else \
        f"# {titled['title']}\n\n{str(titled.get('claim', '')).strip()}\n\n"
    if targets is None:
        targets = next((list(spec["targets"]) for spec in specs if "targets" in spec),
                       DEFAULT_TARGETS)
    sweeps = [p for p in paths if not is_run_dir(p) and is_sweep_folder(p)]
    spec = specs[0] if len(sweeps) == 1 and specs else {}
    return write_report(runs, out, targets, spec.get("baselines"), header,
                        order=list(spec.get("variants", {})), published=spec.get("published"),
                        published_source=spec.get("published-source", ""),
                        tolerance=float(spec.get("tolerance", 0.015)),
                        claims=claims_of(spec) or None,
                        chosen=read_chosen(sweeps[0]) if spec else None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report options."""
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="a sweep's results folder, a run directory or a folder of run "
                        "directories (several may be mixed; then --out is needed)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="where to write (default: the one PATH; a run directory: its report/)"
    )
    parser.add_argument(
        "--target",
        type=fraction,
        action="append",
        default=None,
        help="target accuracy in [0, 1], repeatable (default: the sweep file's targets, "
        "else 0.6 and 0.7)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the report and print its tables."""
    table = build_report_for([p.resolve() for p in args.paths],
                             args.out.resolve() if args.out else None, args.target)
    print(table)
    return 0
