"""The simulated clock's fleet as a figure (device_profiles.png of a run directory); no torch,
so the ServerApp draws it without importing torch.

It reads four attributes of each device, what :class:`strategies.engine.devices.DeviceProfile` has
(:class:`PlottedDevice`); ``task`` imports nothing of ``strategies`` but its contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol


class PlottedDevice(Protocol):
    """What the figure reads of one device (``strategies.engine.devices.DeviceProfile`` has it)."""

    speed: float  # compute speed relative to the reference device
    downlink_mbps: float
    uplink_mbps: float
    availability: float  # probability of being online in a round


def plot_device_profiles(devices: Mapping[int, PlottedDevice], path: Path, title: str) -> Path:
    """Per partition: compute speed, downlink and uplink (log scale), and availability."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    pids = sorted(devices)
    panels = (("speed (x reference)", [devices[p].speed for p in pids], True),
              ("downlink (Mbit/s)", [devices[p].downlink_mbps for p in pids], True),
              ("uplink (Mbit/s)", [devices[p].uplink_mbps for p in pids], True),
              ("availability", [devices[p].availability for p in pids], False))
    fig = Figure(figsize=(12, 3.2))
    FigureCanvasAgg(fig)
    for index, (label, values, log_scale) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        ax.bar(pids, values, width=1.0, color=f"C{index}")
        if log_scale:
            ax.set_yscale("log")
        ax.set_xlabel("partition id")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
