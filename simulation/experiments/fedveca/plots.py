"""``python -m simulation fedveca-plots OUT``: tables and figures of ``fedveca-fig3``.

Reads ``OUT/<variant>/seed<k>/<run>/rounds.jsonl`` and writes into ``--to`` (default OUT):

* ``fig3_loss_accuracy.png``: test loss and accuracy per round for FedVeca, FedAvg,
  FedNova and centralized SGD (mean over seeds, min-max band); centralized SGD's final
  value (mean over seeds) as a dashed flat line, as in the paper;
* ``first_reach.md`` / ``first_reach.csv``: per seed, the first round each method reaches
  centralized SGD's final accuracy (and final loss) of the same seed; mean over the seeds
  that reach it; again with a tolerance (default 0.5 accuracy points, 5 % of the loss);
* ``final.md``: final and best accuracy and final loss per method (mean ± std);
* ``fairness.md``: tau_all, E_avg and the baselines' tau_i per seed;
* ``fig6_tau.png``: FedVeca's tau per client per round (heatmap), tau_k, and A_(k,i) (log
  scale) for one run (the first seed).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import numpy as np

from simulation.metrics import evaluated
from simulation.report import collect
from strategies import contract as C
from task.figure_png import save_png

from .fairness import first_reach

ORDER = ("fedveca", "fedavg", "fednova", "centralized")
LABELS = {
    "fedveca": "FedVeca",
    "fedavg": "FedAvg",
    "fednova": "FedNova",
    "centralized": "Centralized SGD",
}


def _ordered(runs: dict) -> list[str]:
    return [v for v in ORDER if v in runs] + sorted(v for v in runs if v not in ORDER)


def by_seed(runs: dict) -> dict[str, dict[str, list[dict]]]:
    """variant -> seed name -> records (the last finished run of each seed)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for variant, items in runs.items():
        for run_dir, records in items:
            out.setdefault(variant, {})[run_dir.parent.name] = records
    return out


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def first_reach_rows(
    seeds: dict[str, dict[str, list[dict]]], acc_tolerance: float = 0.0, loss_tolerance: float = 0.0
) -> list[dict]:
    """One row per (variant, seed): first round at centralized SGD's final accuracy / loss
    (of the same seed), less ``acc_tolerance`` (absolute) / plus ``loss_tolerance`` (relative)."""
    rows = []
    central = seeds.get("centralized", {})
    for variant in _ordered(seeds):
        for seed, records in sorted(seeds[variant].items()):
            ref = central.get(seed)
            if ref is None:
                continue
            target_acc = ref[-1][C.LOG_ACCURACY] - acc_tolerance
            target_loss = ref[-1][C.LOG_LOSS] * (1 + loss_tolerance)
            rows.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "rounds": len(records) - 1,
                    "target-accuracy": target_acc,
                    "first-round-accuracy": first_reach(records, target_acc),
                    "target-loss": target_loss,
                    "first-round-loss": first_reach(
                        records, target_loss, key=C.LOG_LOSS, lower_is_better=True
                    ),
                    "final-accuracy": records[-1][C.LOG_ACCURACY],
                    "final-loss": records[-1][C.LOG_LOSS],
                }
            )
    return rows


def _cell(value) -> str:
    return "not reached" if value is None else str(value)


def _mean_reached(values: list[int | None]) -> str:
    got = [v for v in values if v is not None]
    return (
        f"{statistics.mean(got):.1f} ({len(got)}/{len(values)})"
        if got
        else f"not reached (0/{len(values)})"
    )


def first_reach_markdown(
    rows: list[dict], acc_tolerance: float = 0.0, loss_tolerance: float = 0.0
) -> str:
    seeds = sorted({r["seed"] for r in rows})
    variants = [v for v in ORDER if any(r["variant"] == v for r in rows)]
    lines = []
    acc_what = "accuracy >= centralized SGD's final accuracy" + (
        f" - {100 * acc_tolerance:g} points" if acc_tolerance else ""
    )
    loss_what = "loss <= centralized SGD's final loss" + (
        f" x {1 + loss_tolerance:g}" if loss_tolerance else ""
    )
    for key, what in ((C.LOG_ACCURACY, acc_what), (C.LOG_LOSS, loss_what)):
        lines += [
            f"First round with test {what} (same seed):",
            "",
            "| method |" + "".join(f" {s} |" for s in seeds) + " mean (seeds reached) |",
            "|---|" + "---|" * (len(seeds) + 1),
        ]
        for variant in variants:
            cells = {r["seed"]: r[f"first-round-{key}"] for r in rows if r["variant"] == variant}
            lines.append(
                f"| {LABELS.get(variant, variant)} |"
                + "".join(f" {_cell(cells.get(s))} |" for s in seeds)
                + f" {_mean_reached([cells.get(s) for s in seeds])} |"
            )
        targets = {r["seed"]: r[f"target-{key}"] for r in rows if r["variant"] == "centralized"}
        lines += [
            "",
            "Targets: " + ", ".join(f"{s}: {targets[s]:.4f}" for s in seeds if s in targets),
            "",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def final_markdown(seeds: dict[str, dict[str, list[dict]]]) -> str:
    lines = [
        "| method | seeds | rounds | final accuracy | best accuracy | final loss | min loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in _ordered(seeds):
        runs = list(seeds[variant].values())
        lines.append(
            f"| {LABELS.get(variant, variant)} | {len(runs)} | {len(runs[0]) - 1} "
            f"| {_mean_std([r[-1]['accuracy'] for r in runs])} "
            f"| {_mean_std([max(x['accuracy'] for x in r) for r in runs])} "
            f"| {_mean_std([r[-1]['loss'] for r in runs])} "
            f"| {_mean_std([min(x['loss'] for x in r) for r in runs])} |"
        )
    return "\n".join(lines) + "\n"


def fairness_markdown(folder: Path) -> str:
    files = sorted(
        folder.glob("fairness_seed*.json"), key=lambda p: int(p.stem.removeprefix("fairness_seed"))
    )
    if not files:
        return ""
    lines = [
        "| seed | K | tau_all | FedVeca steps/round | D_i | E_avg | FedAvg/FedNova tau_i | their "
        "steps/round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in files:
        f = json.loads(path.read_text())
        lines.append(
            f"| {f['seed']} | {f['rounds']} | {f['tau_all']} | {f['tau_all'] / f['rounds']:.2f} "
            f"| {f['sizes']} | {f['e_avg']:.6f} | {f['baseline_taus']} | "
            f"{f['baseline-steps-per-round']} |"
        )
    return "\n".join(lines) + "\n"


def _figure(width: float, height: float, panels: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def plot_curves(seeds: dict[str, dict[str, list[dict]]], path: Path, title: str = "") -> None:
    fig, axes = _figure(17, 4.5, 3)
    colors = {"fedveca": "C3", "fedavg": "C0", "fednova": "C2", "centralized": "k"}
    zoom: list[float] = []
    for ax, key in zip(axes, (C.LOG_LOSS, C.LOG_ACCURACY, C.LOG_ACCURACY)):
        for variant in _ordered(seeds):
            runs = [evaluated(r) for r in seeds[variant].values()]  # eval-every may skip rounds
            length = min(len(r) for r in runs)
            values = np.array([[x[key] for x in r[:length]] for r in runs], dtype=float)
            rounds = np.array([x[C.LOG_ROUND] for x in runs[0][:length]])
            color = colors.get(variant)
            style = ":" if variant == "centralized" else "-"
            ax.plot(
                rounds,
                values.mean(axis=0),
                style,
                color=color,
                label=f"{LABELS.get(variant, variant)} ({len(runs)} seeds)",
            )
            ax.fill_between(rounds, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
            if ax is axes[2]:
                zoom += list(values.mean(axis=0)[len(rounds) // 5 :])
            if variant == "centralized":
                ax.axhline(
                    values[:, -1].mean(),
                    color="k",
                    linestyle="--",
                    linewidth=1,
                    label="Centralized SGD, final (mean)",
                )
        ax.set_xlabel("round")
        ax.set_ylabel(f"test {key}")
        ax.grid(alpha=0.3)
        if key == C.LOG_LOSS:
            ax.set_yscale("log")
    if zoom:
        low, high = min(zoom), max(zoom)
        margin = max(0.2 * (high - low), 0.002)
        axes[2].set_ylim(low - margin, high + margin)
        axes[2].set_title(
            f"accuracy, zoom on rounds >= {len(rounds) // 5} (means)", fontsize="medium"
        )
    axes[1].legend(fontsize="small", loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, dpi=100)


def plot_tau(records: list[dict], path: Path, title: str = "") -> bool:
    """Fig. 6: tau_(k,i) per client and round (heatmap), tau_k, and A_(k,i) (log)."""
    rows = [r for r in records if r.get(C.LOG_FEDVECA_TAU)]
    if not rows:
        return False
    fig, axes = _figure(17, 4.5, 3)
    rounds = [r[C.LOG_ROUND] - 1 for r in rows]  # the paper's k = server round - 1
    clients = sorted({c for r in rows for c in r[C.LOG_FEDVECA_TAU]}, key=int)
    grid = np.array(
        [[r[C.LOG_FEDVECA_TAU].get(c, np.nan) for r in rows] for c in clients], dtype=float
    )
    image = axes[0].imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(clients) + 0.5, 0.5),
    )
    fig.colorbar(image, ax=axes[0], label="tau_(k,i)")
    axes[0].set_yticks(range(1, len(clients) + 1))
    axes[0].set_ylabel("node")
    axes[0].set_xlabel("round k")
    axes[0].set_title("local steps tau_(k,i)", fontsize="medium")
    axes[1].plot(
        rounds,
        [r.get(C.LOG_FEDVECA_TAU_K, np.nan) for r in rows],
        "k-",
        label="tau_k = sum p_i tau_(k,i)",
    )
    axes[1].plot(rounds, np.nanmax(grid, axis=0), "C3:", label="max_i tau_(k,i)")
    axes[1].plot(rounds, np.nanmin(grid, axis=0), "C0:", label="min_i tau_(k,i)")
    axes[1].set_xlabel("round k")
    axes[1].set_ylabel("local steps")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize="small")
    est = [r for r in rows if r.get(C.LOG_FEDVECA_A)]
    for c in clients:
        xs = [r[C.LOG_ROUND] - 1 for r in est if r[C.LOG_FEDVECA_A].get(c) is not None]
        ys = [r[C.LOG_FEDVECA_A][c] for r in est if r[C.LOG_FEDVECA_A].get(c) is not None]
        if xs:
            axes[2].plot(xs, ys, marker=".", linewidth=1, label=f"node {int(c) + 1}")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("round k")
    axes[2].set_ylabel("A_(k,i) = eta beta^2 delta")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, dpi=100)
    return True


def build(
    folder: Path,
    out: Path,
    title: str = "",
    acc_tolerance: float = 0.005,
    loss_tolerance: float = 0.05,
) -> str:
    """Write the tables and figures for ``folder`` into ``out``; returns the Markdown.

    The first-reach table is written twice: strict (the target itself) and with a
    tolerance (accuracy within ``acc_tolerance`` absolute, loss within ``loss_tolerance``
    relative), because at CPU scale the curves may sit just below the strict target."""
    runs = collect(folder)
    if not runs:
        raise SystemExit(f"no finished runs under {folder}")
    out.mkdir(parents=True, exist_ok=True)
    seeds = by_seed(runs)
    rows = first_reach_rows(seeds)
    if rows:
        with (out / "first_reach.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    parts = ["## Final values\n\n" + final_markdown(seeds)]
    loose = first_reach_rows(seeds, acc_tolerance, loss_tolerance)
    if rows:
        parts.append(
            "## First round at centralized SGD's final value\n\n" + first_reach_markdown(rows)
        )
        parts.append(
            "## The same with a tolerance\n\n"
            + first_reach_markdown(loose, acc_tolerance, loss_tolerance)
        )
    fairness = fairness_markdown(folder)
    if fairness:
        parts.append("## Fairness protocol (local work)\n\n" + fairness)
    text = "\n".join(parts)
    (out / "final.md").write_text(final_markdown(seeds))
    if rows:
        (out / "first_reach.md").write_text(
            first_reach_markdown(rows)
            + "\n## With a tolerance\n\n"
            + first_reach_markdown(loose, acc_tolerance, loss_tolerance)
        )
    if fairness:
        (out / "fairness.md").write_text(fairness)
    (out / "tables.md").write_text(text)
    plot_curves(seeds, out / "fig3_loss_accuracy.png", title)
    if "fedveca" in seeds:
        seed, records = sorted(seeds["fedveca"].items())[0]
        plot_tau(
            records,
            out / "fig6_tau.png",
            f"FedVeca tau per client ({seed}){': ' + title if title else ''}",
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The fedveca-plots options."""
    parser.add_argument(
        "folder", type=Path, help="the output folder of python -m simulation fedveca-fig3"
    )
    parser.add_argument(
        "--to", type=Path, default=None, help="where to write (default: the folder)"
    )
    parser.add_argument("--title", default="")
    parser.add_argument(
        "--acc-tolerance",
        type=float,
        default=0.005,
        help="second first-reach table: accuracy >= target - this (default 0.005 = 0.5 points)",
    )
    parser.add_argument(
        "--loss-tolerance",
        type=float,
        default=0.05,
        help="second first-reach table: loss <= target x (1 + this) (default 0.05)",
    )


def run(args: argparse.Namespace) -> int:
    """Write and print the tables."""
    print(
        build(
            args.folder.resolve(),
            (args.to or args.folder).resolve(),
            args.title,
            args.acc_tolerance,
            args.loss_tolerance,
        )
    )
    return 0
