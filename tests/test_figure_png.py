"""Committed figures are palette PNGs (task.figure_png): the same picture as matplotlib's
RGBA file, a fraction of its size."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from task.figure_png import png_bytes, save_png

pytestmark = pytest.mark.unit


def line_plot():
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    rounds = np.arange(80)
    for number in range(6):
        curve = 0.8 - 0.6 * np.exp(-rounds / (5 + number)) + 0.02 * np.sin(rounds * (number + 1))
        ax.plot(rounds, curve, color=f"C{number}", label=f"variant {number}")
        ax.fill_between(rounds, curve - 0.02, curve + 0.02, color=f"C{number}", alpha=0.15)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def test_a_palette_png_looks_the_same_at_under_half_the_size():
    fig = line_plot()
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=100)
    small = png_bytes(fig, dpi=100)
    assert len(small) < 0.5 * len(plain.getvalue())
    with Image.open(io.BytesIO(small)) as stored, Image.open(plain) as drawn:
        assert stored.mode == "P" and stored.size == drawn.size
        a = np.asarray(stored.convert("RGB"), dtype=np.int16)
        b = np.asarray(drawn.convert("RGB"), dtype=np.int16)
    difference = np.abs(a - b).max(axis=2)  # per pixel, the largest channel's, of 255
    assert difference.mean() < 1.0 and np.mean(difference <= 24) > 0.995 and difference.max() < 80


def test_save_png_makes_the_folder_and_writes_only_the_picture(tmp_path):
    path = tmp_path / "a" / "b" / "plot.png"
    assert save_png(line_plot(), path, dpi=50) == str(path)
    assert [p.name for p in path.parent.iterdir()] == ["plot.png"]
    with Image.open(path) as stored:
        assert stored.format == "PNG"
