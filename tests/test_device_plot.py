"""task.device_plot draws the ServerApp's fleet (strategies.engine.devices profiles) without importing
strategies: it reads the four attributes of its PlottedDevice protocol."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

pytest.importorskip("matplotlib")

from strategies.engine.devices import GeneratedFleet  # noqa: E402
from task.device_plot import plot_device_profiles  # noqa: E402


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_a_generated_fleet_is_drawn_as_a_12_by_3_2_inch_figure(tmp_path):
    devices = GeneratedFleet("two-tier", seed=3).profiles(range(8))
    path = plot_device_profiles(devices, tmp_path / "fleet.png", title="8 clients")
    assert path == tmp_path / "fleet.png"
    assert png_size(path.read_bytes()) == (1200, 320)  # figsize (12, 3.2) at 100 dpi


def test_a_device_without_an_attribute_the_figure_reads_is_named(tmp_path):
    @dataclass
    class NoAvailability:
        speed: float = 1.0
        downlink_mbps: float = 20.0
        uplink_mbps: float = 5.0

    with pytest.raises(AttributeError, match="availability"):
        plot_device_profiles({0: NoAvailability()}, tmp_path / "x.png", title="broken")
    assert not (tmp_path / "x.png").exists()
