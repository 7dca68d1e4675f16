"""Device profiles of a heterogeneous fleet, keyed by partition id (pure; numpy only).

A device has a compute speed (relative to a reference device), a downlink and an uplink
bandwidth, and an availability: the probability of being online in a round, and optional
windows of the simulated day when it can be online at all. :mod:`strategies.engine.clock` turns
profiles into simulated time.

Profiles are keyed by ``partition-id`` (it survives restarts; node ids do not) and come
from the server, never from the nodes, so that simulation and deployment keep the same
clock:

* generated (:class:`GeneratedFleet`): ``homogeneous``; ``lognormal`` (speed and both
  bandwidths log-normal around the reference values, spread ``sigma``, independently,
  as measured device traces spread over orders of magnitude: Lai et al., "FedScale",
  ICML 2022); ``two-tier``, DynamicFL's rich / poor fleet (Le et al., DynamicFL,
  Sec. 4.1 "Configurations", Fix-beta: a fraction beta of the clients can afford
  high-frequency communication, the others low-frequency only): each partition is rich
  with probability ``rich_fraction``, a poor device is ``poor_factor`` times slower in
  compute and both bandwidths; ``tiers``, T compute tiers (the fleet of width-heterogeneity
  studies such as HeteroFL's, Diao et al. ICLR 2021, levels 1 .. 1/16): partition p computes
  at 2^-(p mod T) of the reference speed, with the reference bandwidths. Partition p's profile is drawn from
  ``default_rng([seed, p, FLEET_TAG])``, so it does not depend on the number of partitions;
* measured phones and networks (:class:`strategies.engine.flash_fleet.FlashFleet`,
  ``flash``: FLASH's smartphone data, with a speed and bandwidths drawn per round,
  :meth:`Fleet.round_profile`);
* a measured trace (:func:`load_trace`, CSV or JSON, :data:`TRACE_COLUMNS`);
  :func:`write_trace` writes any fleet in that format (the run directory's
  ``device_profiles.csv``).

Availability (:func:`online_mask`): inside one of its ``windows`` (seconds [start, end) of a
24-hour simulated day; none = any time) and a Bernoulli(``availability``) draw from
``default_rng([seed, round, p, ONLINE_TAG])`` per round and partition.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

DAY = 86400.0  # seconds; availability windows repeat every simulated day
FLEETS = ("homogeneous", "lognormal", "two-tier", "tiers")
FLEET_TAG = 0xDE7  # rng stream of the generated profiles
ONLINE_TAG = 0xA7A  # rng stream of the per-round availability draws
DROPOUT_TAG = 0xD07  # rng stream of the per-round mid-round dropout draws (clock.RoundTimer)
TRACE_COLUMNS = ("partition-id", "speed", "downlink-mbps", "uplink-mbps", "availability",
                 "windows")
"""Trace format, one device per row (CSV) or object (JSON list, or ``{"devices": [...]}``):
``partition-id`` (int >= 0), ``speed`` (> 0, 1 = the reference device), ``downlink-mbps`` and
``uplink-mbps`` (> 0, Mbit/s), optional ``availability`` (probability in [0, 1], default 1)
and ``windows`` (CSV: ``"0-28800 72000-86400"``, JSON: ``[[0, 28800], [72000, 86400]]``;
seconds of the simulated day, default always online)."""


@dataclass(frozen=True)
class DeviceProfile:
    """One device: compute speed factor, bandwidths, availability.

    Parameters
    ----------
    speed : float
        Compute speed relative to the reference device (> 0; 0.1 = ten times slower).
    downlink_mbps, uplink_mbps : float
        Bandwidth server -> device and device -> server, Mbit/s (> 0).
    availability : float
        Probability of being online in a round, in [0, 1].
    windows : tuple of (start, end)
        Seconds of the simulated day, 0 <= start < end <= 86400, when the device can be
        online; empty = any time.
    """

    speed: float = 1.0
    downlink_mbps: float = 20.0
    uplink_mbps: float = 5.0
    availability: float = 1.0
    windows: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("speed", "downlink_mbps", "uplink_mbps"):
            value = getattr(self, name)
            if not (_is_number(value) and math.isfinite(value) and value > 0):
                raise ValueError(f"device profile: {name} must be a finite number > 0, "
                                 f"got {value!r}")
        if not (_is_number(self.availability) and 0.0 <= self.availability <= 1.0):
            raise ValueError(f"device profile: availability must be in [0, 1], "
                             f"got {self.availability!r}")
        windows = tuple((float(s), float(e)) for s, e in self.windows)
        for start, end in windows:
            if not 0.0 <= start < end <= DAY:
                raise ValueError(f"device profile: window ({start:g}, {end:g}) must satisfy "
                                 f"0 <= start < end <= {DAY:g} (seconds of the day)")
        object.__setattr__(self, "windows", windows)


# ------------------------------------------------------------------ availability
def in_window(profile: DeviceProfile, now: float) -> bool:
    """Whether simulated time ``now`` falls in one of the device's windows (or it has none)."""
    if not profile.windows:
        return True
    t = now % DAY
    return any(start <= t < end for start, end in profile.windows)


def next_window_open(profile: DeviceProfile, now: float) -> float:
    """The earliest time >= ``now`` at which the device is inside a window."""
    if in_window(profile, now):
        return float(now)
    day = math.floor(now / DAY) * DAY
    t = now - day
    starts = [s for s, _ in profile.windows]
    later = [s for s in starts if s >= t]
    return day + (min(later) if later else DAY + min(starts))


def online_mask(profiles: Sequence[DeviceProfile], partition_ids: Sequence[int], seed: int,
                server_round: int, now: float) -> list[bool]:
    """Which devices are online for round ``server_round`` starting at ``now``: inside a
    window, and a Bernoulli(availability) draw from ``default_rng([seed, round, p,
    ONLINE_TAG])`` (no draw at availability 1)."""
    mask = []
    for profile, pid in zip(profiles, partition_ids):
        online = in_window(profile, now)
        if online and profile.availability < 1.0:
            rng = np.random.default_rng([seed, server_round, int(pid), ONLINE_TAG])
            online = bool(rng.random() < profile.availability)
        mask.append(online)
    return mask


def wait_for_window(profiles: Sequence[DeviceProfile], now: float) -> float:
    """Seconds from ``now`` until some device's window is open (0 if one is, or none given)."""
    if not profiles:
        return 0.0
    return min(next_window_open(p, now) for p in profiles) - float(now)


# ------------------------------------------------------------------ fleets
class Fleet:
    """Device profiles by partition id."""

    def profile(self, partition_id: int) -> DeviceProfile:  # pragma: no cover - abstract
        raise NotImplementedError

    def round_profile(self, partition_id: int, server_round: int) -> DeviceProfile:
        """The profile in round ``server_round``: :meth:`profile`, unless the fleet varies
        per round (:class:`strategies.engine.flash_fleet.FlashFleet`)."""
        return self.profile(partition_id)

    def profiles(self, partition_ids: Sequence[int]) -> dict[int, DeviceProfile]:
        """{partition id: profile} of the given partitions."""
        return {int(p): self.profile(int(p)) for p in partition_ids}


@dataclass(frozen=True)
class GeneratedFleet(Fleet):
    """A generated fleet (``kind`` in :data:`FLEETS`); see the module docstring.

    ``downlink_mbps`` / ``uplink_mbps`` are the reference (median) bandwidths, ``sigma``
    the log-normal spread of ``lognormal``, ``rich_fraction`` and ``poor_factor`` the
    two tiers of ``two-tier``, ``tiers`` the compute tiers of ``tiers``, ``availability``
    every device's probability to be online.
    """

    kind: str
    seed: int = 0
    downlink_mbps: float = 20.0
    uplink_mbps: float = 5.0
    sigma: float = 1.0
    rich_fraction: float = 0.3
    poor_factor: float = 10.0
    availability: float = 1.0
    tiers: int = 5

    def __post_init__(self) -> None:
        if not (isinstance(self.tiers, int) and not isinstance(self.tiers, bool)
                and self.tiers >= 1):
            raise ValueError(f"tiers (compute tiers of the 'tiers' fleet) must be an int >= 1, "
                             f"got {self.tiers!r}")
        if self.kind not in FLEETS:
            raise ValueError(f"device fleet {self.kind!r} is not known; use one of "
                             f"{', '.join(FLEETS)}, or load a trace file")
        if not (_is_number(self.sigma) and math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma (log-normal spread) must be a finite number >= 0, "
                             f"got {self.sigma!r}")
        if not (_is_number(self.rich_fraction) and 0.0 <= self.rich_fraction <= 1.0):
            raise ValueError(f"rich_fraction must be in [0, 1], got {self.rich_fraction!r}")
        if not (_is_number(self.poor_factor) and math.isfinite(self.poor_factor)
                and self.poor_factor >= 1.0):
            raise ValueError(f"poor_factor (how many times slower a poor device is) must be a "
                             f"finite number >= 1, got {self.poor_factor!r}")
        DeviceProfile(1.0, self.downlink_mbps, self.uplink_mbps, self.availability)  # checks

    def profile(self, partition_id: int) -> DeviceProfile:
        """Partition p's profile, from ``default_rng([seed, p, FLEET_TAG])``."""
        base = DeviceProfile(1.0, self.downlink_mbps, self.uplink_mbps, self.availability)
        if self.kind == "homogeneous":
            return base
        if self.kind == "tiers":
            return replace(base, speed=2.0 ** -(int(partition_id) % self.tiers))
        rng = np.random.default_rng([self.seed, int(partition_id), FLEET_TAG])
        if self.kind == "lognormal":
            z = rng.standard_normal(3)
            return replace(base, speed=float(np.exp(self.sigma * z[0])),
                           downlink_mbps=float(self.downlink_mbps * np.exp(self.sigma * z[1])),
                           uplink_mbps=float(self.uplink_mbps * np.exp(self.sigma * z[2])))
        if rng.random() < self.rich_fraction:  # two-tier
            return base
        f = self.poor_factor
        return replace(base, speed=1.0 / f, downlink_mbps=self.downlink_mbps / f,
                       uplink_mbps=self.uplink_mbps / f)


@dataclass(frozen=True)
class TraceFleet(Fleet):
    """A measured fleet: one profile per partition id (:func:`load_trace`)."""

    devices: Mapping[int, DeviceProfile]
    source: str = ""

    def profile(self, partition_id: int) -> DeviceProfile:
        if int(partition_id) not in self.devices:
            raise ValueError(f"device trace {self.source or ''} has no row for partition-id "
                             f"{partition_id}; it lists {_ranges(sorted(self.devices))}. Add one "
                             f"row per partition")
        return self.devices[int(partition_id)]


def load_trace(path: str | Path) -> TraceFleet:
    """Read a device trace (``.csv`` or ``.json``, :data:`TRACE_COLUMNS`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"device trace {str(path)!r} is not a file (give the absolute path "
                         f"of a .csv or .json trace; format: strategies.engine.devices.TRACE_COLUMNS)")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text())
        rows = data.get("devices") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a JSON trace is a list of devices or "
                             f"{{\"devices\": [...]}}")
    elif path.suffix.lower() == ".csv":
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    else:
        raise ValueError(f"device trace {str(path)!r}: use a .csv or .json file")
    devices: dict[int, DeviceProfile] = {}
    for number, row in enumerate(rows, 1):
        try:
            pid, profile = _trace_row(row)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}, device {number}: {exc} (columns: "
                             f"{', '.join(TRACE_COLUMNS)})") from None
        if pid in devices:
            raise ValueError(f"{path}: partition-id {pid} is listed twice")
        devices[pid] = profile
    if not devices:
        raise ValueError(f"{path}: the trace lists no device")
    return TraceFleet(devices, str(path))


def write_trace(path: str | Path, devices: Mapping[int, DeviceProfile]) -> Path:
    """Write ``devices`` as a CSV trace (:data:`TRACE_COLUMNS`) that :func:`load_trace` reads."""
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for pid in sorted(devices):
            p = devices[pid]
            windows = " ".join(f"{s:g}-{e:g}" for s, e in p.windows)
            writer.writerow([pid, repr(p.speed), repr(p.downlink_mbps), repr(p.uplink_mbps),
                             repr(p.availability), windows])
    return path


def _trace_row(row: Mapping) -> tuple[int, DeviceProfile]:
    pid = int(row["partition-id"])
    if pid < 0:
        raise ValueError(f"partition-id must be >= 0, got {pid}")
    windows = row.get("windows") or ()
    if isinstance(windows, str):
        windows = [tuple(float(v) for v in part.split("-")) for part in windows.split()]
    for window in windows:
        if len(window) != 2:
            raise ValueError(f"a window is start-end, got {window!r}")
    availability = row.get("availability")
    return pid, DeviceProfile(
        speed=float(row["speed"]), downlink_mbps=float(row["downlink-mbps"]),
        uplink_mbps=float(row["uplink-mbps"]),
        availability=1.0 if availability in (None, "") else float(availability),
        windows=tuple(tuple(w) for w in windows))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ranges(values: list[int]) -> str:
    if not values:
        return "none"
    return f"{values[0]}..{values[-1]} ({len(values)} rows)"
