"""``python -m simulation report FOLDER``: tables and plots of a sweep's runs.

Reads every ``<FOLDER>/<variant>/seed<k>/<run>/rounds.jsonl`` and writes into FOLDER
(or ``--out``):

* ``report.csv`` and ``report.md``: per variant, final and best test accuracy (mean ± std
  over seeds), rounds-to-target and bytes-to-target (best-so-far curve, linear
  interpolation, McMahan et al.; mean over the seeds that reach it, "n/k" reached);
* ``accuracy_vs_round.png`` and ``accuracy_vs_bytes.png``: mean over seeds with the
  min-max band, one line per variant;
* ``label_distribution_seed<k>.png``: the clients' label counts of each seed (the
  partition depends on the seed only).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
from pathlib import Path

import numpy as np

from fedapp.run_log import read_rounds

from .metrics import bytes_to_target, cumulative_bytes, rounds_to_target


def collect(folder: Path) -> dict[str, list[tuple[Path, list[dict]]]]:
    """variant -> [(run directory, round records)] for every finished run under folder."""
    runs: dict[str, list[tuple[Path, list[dict]]]] = {}
    for path in sorted(folder.glob("*/seed*/*/rounds.jsonl")):
        variant = path.parent.parent.parent.name
        if (path.parent / "final_model.pt").is_file():
            runs.setdefault(variant, []).append((path.parent, read_rounds(path.parent)))
    return runs


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table_rows(runs: dict[str, list[tuple[Path, list[dict]]]], targets: list[float]) -> list[dict]:
    rows = []
    for variant, items in runs.items():
        records = [r for _, r in items]
        final_m, final_s = _mean_std([r[-1]["accuracy"] for r in records])
        best_m, best_s = _mean_std([max(x["accuracy"] for x in r) for r in records])
        row = {"variant": variant, "seeds": len(records), "rounds": len(records[0]) - 1,
               "final-mean": final_m, "final-std": final_s, "best-mean": best_m, "best-std": best_s}
        for target in targets:
            reached = [rounds_to_target(r, target) for r in records]
            got = [x for x in reached if x is not None]
            megabytes = [b / 1e6 for b in (bytes_to_target(r, target) for r in records) if b is not None]
            row[f"rounds-to-{target:g}"] = statistics.mean(got) if got else None
            row[f"MB-to-{target:g}"] = statistics.mean(megabytes) if megabytes else None
            row[f"reached-{target:g}"] = f"{len(got)}/{len(records)}"
        rows.append(row)
    return rows


def markdown(rows: list[dict], targets: list[float]) -> str:
    head = "| variant | seeds | final accuracy (%) | best accuracy (%) |"
    rule = "|---|---|---|---|"
    for target in targets:
        head += f" rounds to {100 * target:g}% | MB to {100 * target:g}% |"
        rule += "---|---|"
    lines = [head, rule]
    for row in rows:
        line = (f"| {row['variant']} | {row['seeds']} | {100 * row['final-mean']:.2f} ± {100 * row['final-std']:.2f} "
                f"| {100 * row['best-mean']:.2f} ± {100 * row['best-std']:.2f} |")
        for target in targets:
            rounds, mb, reached = row[f"rounds-to-{target:g}"], row[f"MB-to-{target:g}"], row[f"reached-{target:g}"]
            line += (f" {rounds:.1f} ({reached}) | {mb:.1f} |" if rounds is not None else f" not reached ({reached}) | - |")
        lines.append(line)
    return "\n".join(lines)


def plot_curves(runs: dict[str, list[tuple[Path, list[dict]]]], path: Path, by_bytes: bool) -> None:
    """Mean accuracy over seeds with a min-max band, per variant."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for variant, items in runs.items():
        length = min(len(r) for _, r in items)
        acc = np.array([[x["accuracy"] for x in r[:length]] for _, r in items])
        if by_bytes:
            xs = np.mean([cumulative_bytes(r[:length]) for _, r in items], axis=0) / 1e6
        else:
            xs = np.array([x["round"] for x in items[0][1][:length]])
        ax.plot(xs, acc.mean(axis=0), label=f"{variant} ({len(items)} seeds)")
        ax.fill_between(xs, acc.min(axis=0), acc.max(axis=0), alpha=0.15)
    ax.set_xlabel("communicated MB (up + down)" if by_bytes else "round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def build_report(folder: Path, out: Path, targets: list[float]) -> str:
    runs = collect(folder)
    if not runs:
        raise SystemExit(f"no finished runs under {folder} (expected <variant>/seed<k>/<run>/rounds.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(runs, targets)
    with (out / "report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows, targets)
    (out / "report.md").write_text(table + "\n")
    plot_curves(runs, out / "accuracy_vs_round.png", by_bytes=False)
    plot_curves(runs, out / "accuracy_vs_bytes.png", by_bytes=True)
    first = next(iter(runs.values()))  # partitions depend on the seed, not on the variant
    for run_dir, _ in first:
        picture = run_dir / "label_distribution.png"
        if picture.is_file():
            shutil.copyfile(picture, out / f"label_distribution_{run_dir.parent.name}.png")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a sweep's results folder")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: the folder)")
    parser.add_argument("--target", type=float, action="append", default=None,
                        help="target accuracy in [0, 1], repeatable (default 0.6 and 0.7)")
    args = parser.parse_args(argv)
    targets = args.target or [0.6, 0.7]
    table = build_report(args.folder.resolve(), (args.out or args.folder).resolve(), targets)
    print(table)
    return 0
