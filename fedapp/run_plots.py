"""Plots of one run: test accuracy and loss against the round, the data transferred and the
simulated time (PNG, matplotlib's Agg canvas, no pyplot state; each written atomically).

Each figure has two panels, accuracy (%) and loss (test loss, and the clients' mean training
loss where logged); the loss axis is logarithmic, and labelled so, when the losses span more
than a factor of :data:`LOG_SPAN`. Axis units follow the scale: B / KB / MB / GB of data
(10^3 steps), s / min / h of simulated time. Non-finite values are not drawn.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from strategies import contract as C

from .atomic_file import write_bytes_atomically
from .run_outputs import (ACCURACY_AXIS, accuracy_percent, cumulative_megabytes, has_clock,
                          number, sim_elapsed, time_unit)

ROUND_PLOT = "accuracy_loss_vs_round.png"
BYTES_PLOT = "accuracy_loss_vs_bytes.png"
SIM_TIME_PLOT = "accuracy_loss_vs_sim_time.png"
LOG_SPAN = 10.0  # max / min of the losses above which their axis is logarithmic
MARKERS_UP_TO = 40  # points per line drawn with markers
Records = Sequence[Mapping[str, object]]


def byte_unit(megabytes: float) -> tuple[float, str]:
    """(factor from MB, unit) that shows ``megabytes`` as a number of a readable size."""
    for factor, unit in ((1e6, "B"), (1e3, "KB"), (1.0, "MB")):
        if megabytes * factor < 1000:
            return factor, unit
    return 1e-3, "GB"


def series(records: Records, xs: Sequence[float], key: str,
           scale: float = 1.0) -> tuple[list[float], list[float]]:
    """(x, value * scale) of the rounds whose ``key`` is a finite number."""
    points = [(x, number(r, key)) for x, r in zip(xs, records)]
    kept = [(x, v * scale) for x, v in points if v is not None and math.isfinite(v)]
    return [x for x, _ in kept], [v for _, v in kept]


def draw(ax, xy: tuple[list[float], list[float]], label: str, **style) -> None:
    """One line, with markers when it has few points."""
    xs, ys = xy
    if xs:
        ax.plot(xs, ys, label=label, marker="o" if len(xs) <= MARKERS_UP_TO else None,
                markersize=3, **style)


def plot_against(records: Records, xs: Sequence[float], path: Path, title: str, xlabel: str,
                 integer_x: bool = False) -> Path:
    """Accuracy and loss panels against ``xs`` (one x per record), saved as ``path``."""
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    acc_ax, loss_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    draw(acc_ax, series(records, xs, C.LOG_ACCURACY, accuracy_percent(1.0)), "test accuracy",
         color="C0")
    acc_ax.set_ylabel(ACCURACY_AXIS)
    acc_ax.set_title("test accuracy")
    test_loss = series(records, xs, C.LOG_LOSS)
    train_loss = series(records, xs, C.LOG_TRAIN_LOSS)
    draw(loss_ax, test_loss, "test loss", color="C3")
    draw(loss_ax, train_loss, "training loss (clients' mean)", color="C1", linestyle="--")
    losses = [v for v in test_loss[1] + train_loss[1] if v > 0]
    log_axis = bool(losses) and len(losses) == len(test_loss[1] + train_loss[1]) \
        and max(losses) > LOG_SPAN * min(losses)
    if log_axis:
        loss_ax.set_yscale("log")
    loss_ax.set_ylabel("loss (log scale)" if log_axis else "loss")
    loss_ax.set_title("loss")
    for ax in (acc_ax, loss_ax):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.85, wspace=0.22)  # fixed:
    # tight_layout would cost as much as the drawing itself
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    return write_bytes_atomically(path, png.getvalue())  # no half-written picture on a full disk


def plot_vs_round(records: Records, path: Path, title: str) -> Path:
    """Accuracy and loss against the round."""
    rounds = [float(number(r, C.LOG_ROUND) or 0) for r in records]
    return plot_against(records, rounds, path, title, "round", integer_x=True)


def plot_vs_bytes(records: Records, path: Path, title: str) -> Path:
    """Accuracy and loss against the data transferred so far (up + down)."""
    megabytes = cumulative_megabytes(records)
    factor, unit = byte_unit(max(megabytes, default=0.0))
    return plot_against(records, [m * factor for m in megabytes], path, title,
                        f"data transferred, up + down ({unit})")


def plot_vs_sim_time(records: Records, path: Path, title: str) -> Path:
    """Accuracy and loss against the simulated time since the start."""
    seconds = sim_elapsed(records)
    divisor, unit = time_unit(max(seconds, default=0.0))
    return plot_against(records, [s / divisor for s in seconds], path, title,
                        f"simulated time ({unit})")


def plots_for(records: Records) -> list[tuple[str, Callable[[Records, Path, str], Path]]]:
    """(file name, plot) of every plot the run's records allow."""
    plots = [(ROUND_PLOT, plot_vs_round), (BYTES_PLOT, plot_vs_bytes)]
    return plots + ([(SIM_TIME_PLOT, plot_vs_sim_time)] if has_clock(records) else [])
