"""``python -m simulation fedscale-trace``: FedScale's published device traces -> a fedhetero
device trace (:func:`strategies.engine.devices.write_trace`, read by ``device-profiles``).

FedScale (Lai et al., ICML 2022; ``benchmark/dataset/data/device_info/README.md`` and
``fedscale/cloud/internal/client_metadata.py`` of SymbioticLab/FedScale) ships two pickles:

* device capacity (``client_device_capacity``): client id -> ``{'computation': ms per
  sample of inference, 'communication': kbit/s}``. FedScale charges 3 x computation per
  trained sample (backward ~ 2x forward) and moves the model both ways at that bandwidth;
* availability (``client_behave_trace``): client id -> ``{'duration': s, 'inactive': [s],
  'finish_time': s, 'active': [s], 'model': str}``: the client is online in
  [active[j], inactive[j]], the pattern repeating every ``finish_time`` seconds.

Conversion, partition p taking the (p mod N)-th client of each file in its order (as
FedScale maps client ids onto traces):

* ``speed`` = reference ms per sample / the client's (``--reference-ms``; default the
  trace's median, so the median device is the reference device of eq. 1's c);
* ``downlink-mbps`` = ``uplink-mbps`` = kbit/s / 1000;
* ``windows``: the active intervals within the first ``finish_time`` seconds, folded onto
  fedhetero's 24-hour simulated day (split at midnight, overlaps merged): fedhetero's
  windows repeat daily, FedScale's every ``finish_time``; ``availability`` 1.

These files are pickles. They are read with :class:`PlainUnpickler`, which refuses every
global (class, function) a pickle names, so only dicts, lists, tuples, strings, numbers,
booleans and None load and nothing in the file is run; files over ``--max-bytes`` are
refused before reading, and every field is type-checked (errors name the file, the client
id and the field).
"""

from __future__ import annotations

import argparse
import io
import math
import pickle
import statistics
from collections.abc import Mapping
from pathlib import Path

from strategies.engine.devices import DAY, DeviceProfile, write_trace

HELP = "convert FedScale's device-capacity / availability pickles to a device trace"
MAX_BYTES = 256 * 2**20  # FedScale's own traces are ~ 20 MB
MAX_INTERVALS = 100_000  # per client


class TraceError(ValueError):
    """A trace file that cannot be converted (the message names file, client and field)."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that loads plain containers and numbers only: every global is refused."""

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle's hook
        raise pickle.UnpicklingError(f"the pickle names the global {module}.{name}: only plain "
                                     f"dicts, lists, numbers and strings are accepted")


def load_plain_pickle(path: str | Path, max_bytes: int = MAX_BYTES) -> object:
    """The plain data of a pickle file (:class:`PlainUnpickler`), at most ``max_bytes``."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(f"{path}: {size} bytes, more than the {max_bytes} allowed "
                         f"(--max-bytes)")
    data = path.read_bytes()
    try:
        return PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, MemoryError, RecursionError) as exc:
        raise TraceError(f"{path}: not a plain-data pickle ({type(exc).__name__}: {exc})") \
            from None


def _number(path: Path, client: object, field: str, value: object, positive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise TraceError(f"{path}: client {client!r}: field {field!r} must be {need}, "
                         f"got {value!r}")
    return float(value)


def _table(path: Path, data: object) -> Mapping:
    if not isinstance(data, dict) or not data:
        raise TraceError(f"{path}: expected a non-empty dict client id -> record, got "
                         f"{type(data).__name__}")
    for client, record in data.items():
        if not isinstance(client, (int, str)) or isinstance(client, bool):
            raise TraceError(f"{path}: client id {client!r} is neither an int nor a string")
        if not isinstance(record, dict):
            raise TraceError(f"{path}: client {client!r}: expected a dict, got "
                             f"{type(record).__name__}")
    return data


def capacity(path: Path, data: object) -> list[tuple[float, float]]:
    """(ms per sample, kbit/s) per client, in the file's order."""
    rows = []
    for client, record in _table(path, data).items():
        for field in ("computation", "communication"):
            if field not in record:
                raise TraceError(f"{path}: client {client!r}: field {field!r} is missing")
        rows.append((_number(path, client, "computation", record["computation"], True),
                     _number(path, client, "communication", record["communication"], True)))
    return rows


def availability(path: Path, data: object) -> list[tuple[tuple[float, float], ...]]:
    """Each client's online windows folded onto the 24-hour day, in the file's order."""
    out = []
    for client, record in _table(path, data).items():
        for field in ("active", "inactive", "finish_time"):
            if field not in record:
                raise TraceError(f"{path}: client {client!r}: field {field!r} is missing")
        period = _number(path, client, "finish_time", record["finish_time"], True)
        active, inactive = record["active"], record["inactive"]
        for field, values in (("active", active), ("inactive", inactive)):
            if not isinstance(values, list) or len(values) > MAX_INTERVALS:
                raise TraceError(f"{path}: client {client!r}: field {field!r} must be a list "
                                 f"of at most {MAX_INTERVALS} times")
        if len(active) != len(inactive):
            raise TraceError(f"{path}: client {client!r}: fields 'active' and 'inactive' have "
                             f"{len(active)} and {len(inactive)} entries")
        spans = []
        for j, (a, b) in enumerate(zip(active, inactive)):
            a = _number(path, client, f"active[{j}]", a, False)
            b = _number(path, client, f"inactive[{j}]", b, False)
            if b < a:
                raise TraceError(f"{path}: client {client!r}: inactive[{j}] = {b} is before "
                                 f"active[{j}] = {a}")
            spans.append((a, min(b, period)))
        out.append(fold_onto_day(spans))
    return out


def fold_onto_day(spans: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Intervals of seconds folded onto [0, 86400), split at midnight, merged; a span of a
    day or more (or none at all) means always online: ()."""
    pieces = []
    for a, b in spans:
        if b - a >= DAY:
            return ()
        if b <= a:
            continue
        start, end = a % DAY, a % DAY + (b - a)
        pieces += [(start, min(end, DAY))] + ([(0.0, end - DAY)] if end > DAY else [])
    merged: list[list[float]] = []
    for a, b in sorted(pieces):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if merged == [[0.0, DAY]]:
        return ()
    return tuple((a, b) for a, b in merged)


def convert(capacity_file: str | Path | None, behave_file: str | Path | None,
            num_partitions: int, reference_ms: float | None = None,
            max_bytes: int = MAX_BYTES) -> dict[int, DeviceProfile]:
    """Partition id -> device profile from FedScale's files (module docstring)."""
    if capacity_file is None and behave_file is None:
        raise TraceError("give a device-capacity file, an availability file, or both")
    caps = windows = None
    if capacity_file is not None:
        caps = capacity(Path(capacity_file), load_plain_pickle(capacity_file, max_bytes))
    if behave_file is not None:
        windows = availability(Path(behave_file), load_plain_pickle(behave_file, max_bytes))
    ref = reference_ms or (statistics.median(c for c, _ in caps) if caps else 1.0)
    devices = {}
    for p in range(num_partitions):
        profile = DeviceProfile()
        if caps is not None:
            ms, kbps = caps[p % len(caps)]
            profile = DeviceProfile(ref / ms, kbps / 1000.0, kbps / 1000.0)
        if windows is not None:
            profile = DeviceProfile(profile.speed, profile.downlink_mbps, profile.uplink_mbps,
                                    1.0, windows[p % len(windows)])
        devices[p] = profile
    return devices


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capacity", help="FedScale's device-capacity pickle "
                   "(client_device_capacity)")
    p.add_argument("--behavior", help="FedScale's availability pickle (client_behave_trace)")
    p.add_argument("--num-partitions", type=int, required=True,
                   help="partitions to give a profile (partition p: the (p mod N)-th client)")
    p.add_argument("--reference-ms", type=float, default=None,
                   help="ms per sample of the speed-1 device (default: the trace's median)")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest file accepted")
    p.add_argument("--output", required=True, help="the device trace to write (.csv)")


def run(args: argparse.Namespace) -> int:
    if args.num_partitions < 1:
        raise SystemExit("--num-partitions must be >= 1")
    try:
        devices = convert(args.capacity, args.behavior, args.num_partitions, args.reference_ms,
                          args.max_bytes)
    except TraceError as exc:
        raise SystemExit(f"fedscale-trace: {exc}") from None
    path = write_trace(args.output, devices)
    print(f"wrote {len(devices)} device profiles to {path.resolve()} (use it with -c "
          f"device-profiles='{path.resolve()}')")
    return 0
