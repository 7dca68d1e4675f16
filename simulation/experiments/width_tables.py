"""``python -m simulation.experiments.width_tables RUNS [VARIANT ...]``: the model-width
experiment's own table (docs/results/width_fmnist.md), from a sweep folder's run logs.

Per variant, over its seeds that ran all rounds: final, best and late accuracy (the mean of
the last 10 evaluations: one round's accuracy swings by points when few clients train each
entry), simulated seconds per round, each width's static sub-model's late accuracy
(``width-accuracy``), and the ceiling's accuracy when the simulated clock reaches
``--at-sim-seconds`` (the width methods' whole run)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedapp.run_log import read_rounds, run_directories
from strategies import contract as C

LATE = 10  # evaluations averaged for the late accuracy


def mean_std(values: list[float]) -> str:
    """``mean ± std`` in percent (std over seeds; none for one seed)."""
    text = f"{100 * statistics.mean(values):.2f}"
    return text + (f" ± {100 * statistics.stdev(values):.2f}" if len(values) > 1 else "")


def variant_row(runs: Path, variant: str, at_sim_seconds: float | None) -> str | None:
    """The Markdown row of one variant (None: no finished run)."""
    final, best, late, per_round, at_time = [], [], [], [], []
    widths: dict[str, list[float]] = {}
    for run_dir in run_directories(runs, f"{variant}/seed*/*"):
        rounds = read_rounds(run_dir)
        evaluated = [r for r in rounds if r.get(C.LOG_ACCURACY) is not None and r[C.LOG_ROUND]]
        if not evaluated:
            continue
        accuracy = [r[C.LOG_ACCURACY] for r in evaluated]
        final.append(accuracy[-1])
        best.append(max(accuracy))
        late.append(statistics.mean(accuracy[-LATE:]))
        per_round.append(rounds[-1].get(C.LOG_SIM_ELAPSED, 0.0) / rounds[-1][C.LOG_ROUND])
        if at_sim_seconds is not None:
            within = [r[C.LOG_ACCURACY] for r in evaluated
                      if r.get(C.LOG_SIM_ELAPSED, 0.0) <= at_sim_seconds]
            at_time.append(max(within, default=0.0))
        by_width = [r[C.LOG_WIDTH_ACCURACY] for r in evaluated[-LATE:]
                    if r.get(C.LOG_WIDTH_ACCURACY)]
        for width in (by_width[0] if by_width else {}):
            widths.setdefault(width, []).append(statistics.mean(w[width] for w in by_width))
    if not final:
        return None
    sub = " · ".join(f"{w}: {mean_std(a)}" for w, a in
                     sorted(widths.items(), key=lambda item: -float(item[0]))) or "-"
    cells = [variant, str(len(final)), mean_std(final), mean_std(best), mean_std(late),
             f"{statistics.mean(per_round):.2f}",
             mean_std(at_time) if at_time else "-", sub]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="a sweep's results folder")
    parser.add_argument("variants", nargs="*", help="variants, in order (default: all)")
    parser.add_argument("--at-sim-seconds", type=float, default=None,
                        help="also the best accuracy reached by this simulated time")
    args = parser.parse_args(argv)
    variants = args.variants or sorted(p.name for p in args.runs.iterdir()
                                       if p.is_dir() and not p.name.startswith("."))
    print("| variant | seeds | final (%) | best (%) | late: last 10 evaluations (%) | sim s / "
          "round | best by the sim time (%) | each width's sub-model, late (%) |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in variants:
        row = variant_row(args.runs, variant, args.at_sim_seconds)
        if row:
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
