"""The run log: resolved config, one JSON line per round, the final model.

Layout of one run directory::

    <output-dir>/<YYYYmmdd-HHMMSS>-<strategy>-run<run_id>/
        config.json      resolved run config + versions
        rounds.jsonl     one JSON object per round (round 0 = initial model)
        final_model.pt   torch state_dict of the final global model (fedapp.model_file)
        checkpoint.json, checkpoint-round<r>-<token>.npz   with ``checkpoint-every``
        events.out.tfevents.*, mlflow.db   with run-config ``tracking`` (fedapp.tracking)

A run directory is never reused: when the name exists (two runs started in the same second
with the same run id, as the in-process tools' fixed run id gives), the new run gets the
name with ``-2``, ``-3``, ... appended. :func:`read_rounds` skips a truncated last line of
``rounds.jsonl`` (a run killed while appending) with a warning naming the file and line.

An archived run (``python -m simulation archive-logs``: ``docs/results/run-logs``) keeps its
JSON files xz-compressed (``rounds.jsonl.xz``, ``config.json.xz``, ``partitions.json.xz``);
:func:`read_rounds`, :func:`read_json`, :func:`run_finished` and :func:`run_directories` read
and find either form, so every tool reads an archive as it is. A file that many runs of an
experiment have alike (``partitions.json``: one per partition setting) is archived once, as
``shared/<sha256>.xz`` at the archive's top, and each run keeps ``partitions.json.sha256``,
the digest of its content; :func:`read_json` follows it (at most :data:`SHARED_DEPTH`
folders up) and checks the digest. xz (LZMA), not gzip: on the
archived sweeps' JSON it is 16 % smaller (width_fmnist: 493 KiB against 588 KiB with gzip -9,
from 3.5 MB), which keeps the largest experiment's logs and page within 1 MiB; it is in the
standard library and checks each file with a CRC-64, so a damaged archive is told, never
misread.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import time
import warnings
from pathlib import Path

from flwr.app import ArrayRecord

from strategies import contract as C

from .model_file import MODEL_NAME, write_model
from .tracking import Trackers

ROUNDS_LOG = "rounds.jsonl"
CONFIG_FILE = "config.json"
COMPRESSED = ".xz"  # an archived run's JSON files: rounds.jsonl.xz, config.json.xz, ...
SHARED_REFERENCE = ".sha256"  # an archived run's file kept once for the experiment: its digest
SHARED_FOLDER = "shared"  # <archive>/shared/<sha256>.xz: the files archived once
REFERENCE_BYTES = 128  # what is read of a .sha256 reference (a digest is 64 hex digits)
SHARED_DEPTH = 6  # folders above a run searched for shared/: <variant>/seed<k>/<run> is 3 deep,
# tuning/<variant>/<point>/seed<k>/<run> 5
MAX_SAME_NAME = 1000  # run directories of one name and second: -2 .. -1000

# (run-log key, column title, format) of the per-round table
TABLE_COLUMNS = (
    (C.LOG_ROUND, "round", "{:>5}"),
    (C.LOG_ACCURACY, "acc", "{:>7.4f}"),
    (C.LOG_LOSS, "loss", "{:>7.4f}"),
    (C.LOG_TRAIN_LOSS, "train", "{:>7.4f}"),
    (C.LOG_CLIENTS_SAMPLED, "smp", "{:>4}"),
    (C.LOG_CLIENTS_FAILED, "fail", "{:>4}"),
    (C.LOG_BYTES_UP, "MB up", "{:>8.2f}"),
    (C.LOG_BYTES_DOWN, "MB dn", "{:>8.2f}"),
    (C.LOG_WALL_SECONDS, "sec", "{:>6.1f}"),
)
MEGABYTE_KEYS = frozenset({C.LOG_BYTES_UP, C.LOG_BYTES_DOWN})  # shown in MB

# Fields of a round record that measure time or memory: they differ between two runs
# with the same seed (everything else must not; tests/test_reliability_resume.py).
TIMING_KEYS = C.LOG_TIMING_KEYS


SERVER_PID = "server.pid"  # the process that runs the ServerApp (simulation/run.py stops it)


class RunLog:
    """Writes one run's directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rounds_path = directory / ROUNDS_LOG
        self.trackers = Trackers([])  # run-config `tracking`: every round record as scalars

    @classmethod
    def create(cls, output_dir: Path, strategy: str, run_id: int, config: dict,
               tracking: str = "", tracking_dir: str = "") -> RunLog:
        """A new run directory; ``tracking`` / ``tracking_dir`` as the run-config keys
        (:mod:`fedapp.tracking`), with ``config["run-config"]`` as MLflow's parameters."""
        directory = new_run_directory(Path(output_dir),
                                      f"{time.strftime('%Y%m%d-%H%M%S')}-{strategy}-run{run_id}")
        log = cls(directory)
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        log.rounds_path.open("x").close()
        (directory / SERVER_PID).write_text(f"{os.getpid()}\n")  # Ctrl-C waits for this process
        log.trackers = Trackers.open(tracking, directory, tracking_dir,
                                     config.get("run-config", {}))
        return log

    def append_round(self, record: dict) -> None:
        with self.rounds_path.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        self.trackers.log(record)

    def close(self) -> None:
        """End the run's tracking (an MLflow run is marked finished)."""
        self.trackers.close()

    def write_json(self, name: str, payload: object) -> Path:
        path = self.directory / name
        path.write_text(json.dumps(payload, indent=1) + "\n")
        return path

    @property
    def model_path(self) -> Path:
        """Where the final model goes (a torch state dict: :mod:`fedapp.model_file`)."""
        return self.directory / MODEL_NAME

    def save_model(self, state_dict: dict) -> Path:
        """Write the final model (atomically, fsynced: :func:`fedapp.model_file.write_model`)."""
        return write_model(state_dict, self.model_path)


def new_run_directory(output_dir: Path, name: str) -> Path:
    """Create ``output_dir/name``, or ``name-2``, ``name-3``, ... when it exists: an existing
    run directory is never written into."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, MAX_SAME_NAME + 1):
        directory = output_dir / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        return directory
    raise FileExistsError(f"{output_dir}: {name} and {MAX_SAME_NAME - 1} numbered copies exist "
                          "already; no new run directory is made there. Give another output-dir "
                          "or move old runs away")


def model_sha256(arrays: ArrayRecord) -> str:
    """sha256 over the model's arrays in sorted key order, each as ``key|dtype|shape|``
    followed by its bytes (C order): equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        array = arrays[key].numpy()
        digest.update(f"{key}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class DamagedLogError(ValueError):
    """A run-log file that cannot be read whole: a compressed file that does not decompress
    (damaged, or cut short in copying), or a round log with a bad line before its last."""


def log_path(directory: Path, name: str) -> Path:
    """``directory/name``, or where only that is there (an archived run) its compressed form
    ``name.xz``, or its reference to a shared copy ``name.sha256``; the plain path when none
    is (reading it names the file missing)."""
    plain = Path(directory) / name
    for stored in (plain, plain.with_name(name + COMPRESSED),
                   plain.with_name(name + SHARED_REFERENCE)):
        if stored.is_file():
            return stored
    return plain


def shared_copy(reference: Path) -> tuple[Path, str]:
    """The shared file (``shared/<sha256>.xz`` in a folder above the run) that the reference
    ``reference`` (``<name>.sha256``) names, and its digest; DamagedLogError naming the
    reference when it holds no sha256 digest or no folder above has the copy."""
    with open(reference, "rb") as handle:  # a digest and a newline; more is not one
        digest = handle.read(REFERENCE_BYTES).decode(errors="replace").strip()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise DamagedLogError(f"{reference}: holds {digest[:80]!r}, not the sha256 digest (64 "
                              "hex digits) of a shared file; restore it (git checkout -- FILE)")
    for folder in list(reference.parents)[1:SHARED_DEPTH + 1]:
        copy = folder / SHARED_FOLDER / (digest + COMPRESSED)
        if copy.is_file():
            return copy, digest
    raise DamagedLogError(f"{reference}: its shared copy {SHARED_FOLDER}/{digest}{COMPRESSED} is "
                          f"in none of the {SHARED_DEPTH} folders above the run; copy the "
                          f"archive's {SHARED_FOLDER}/ folder along with its runs")


def read_log_text(path: Path) -> str:
    """The text of a plain or an ``.xz`` run-log file, or of the shared copy a ``.sha256``
    reference names (:func:`shared_copy`), undecodable bytes replaced.

    A compressed file that does not decompress, and a shared copy whose content does not
    have its digest, raise :class:`DamagedLogError` naming it."""
    path = Path(path)
    digest = None
    if path.suffix == SHARED_REFERENCE:
        path, digest = shared_copy(path)
    if path.suffix != COMPRESSED:
        return path.read_text(errors="replace")
    try:
        data = lzma.decompress(path.read_bytes(), format=lzma.FORMAT_XZ)
    except lzma.LZMAError as exc:
        raise DamagedLogError(
            f"{path}: not a whole xz file ({exc}); it was damaged or cut short in copying. "
            "Restore it (git checkout -- FILE, or copy it again), or move the run directory "
            "aside") from None
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise DamagedLogError(f"{path}: its content does not have the sha256 digest its name "
                              "gives; restore it (git checkout -- FILE)")
    return data.decode(errors="replace")


def read_json(directory: Path, name: str) -> object:
    """The JSON file ``name`` (e.g. ``config.json``) of a run directory, plain or compressed;
    OSError when it is missing, ValueError naming it when it is not JSON."""
    path = log_path(directory, name)
    text = read_log_text(path)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc}); restore it, or move the run directory "
                         "aside") from None


def has_round_log(directory: Path) -> bool:
    """Whether ``directory`` is a run directory: it has ``rounds.jsonl`` or
    ``rounds.jsonl.xz``."""
    return log_path(directory, ROUNDS_LOG).is_file()


def run_directories(folder: Path, pattern: str = "*") -> list[Path]:
    """The run directories (those with a round log, plain or compressed) that match the glob
    ``pattern`` under ``folder``, sorted: ``*`` the run directories in an output-dir,
    ``*/seed*/*`` those of a sweep folder (``<variant>/seed<k>/<run>/``)."""
    return sorted({log.parent for name in (ROUNDS_LOG, ROUNDS_LOG + COMPRESSED)
                   for log in Path(folder).glob(f"{pattern}/{name}")})


def read_rounds(directory: Path) -> list[dict]:
    """All round records of a run directory's ``rounds.jsonl`` (or ``rounds.jsonl.xz``).

    A last line that is not a whole JSON object (a run killed while appending it) is skipped
    with a warning naming the file and the line; a bad line before the last (the file was
    damaged, not cut short) and a compressed log that does not decompress raise
    :class:`DamagedLogError` (a ValueError) naming the file."""
    path = log_path(directory, ROUNDS_LOG)
    lines = read_log_text(path).splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except ValueError as exc:
            record, why = None, f"not JSON ({exc})"
        else:
            why = None if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        if why is None:
            records.append(record)
        elif index == len(numbered) - 1:
            warnings.warn(f"{path}, line {number}: skipped, {why}: the run was stopped while "
                          "writing it (the rounds before it are read)", RuntimeWarning,
                          stacklevel=2)
        else:
            raise DamagedLogError(f"{path}, line {number}: {why}; only the last line of a run "
                                  "log may be cut short, so the file was damaged. Restore it, "
                                  "or move the run directory aside")
    return records


def run_finished(directory: Path) -> bool:
    """Whether the run in ``directory`` ended: its ``final_model.pt`` is there, or (a copy
    kept without model files, as ``docs/results/run-logs``) its log's last record is the
    evaluated round ``num-server-rounds`` of its ``config.json``. A damaged log or config
    (:class:`DamagedLogError`) counts as not finished, with a warning naming the file."""
    directory = Path(directory)
    if (directory / MODEL_NAME).is_file():
        return True
    try:
        rounds = read_json(directory, CONFIG_FILE)["run-config"]["num-server-rounds"]
        records = read_rounds(directory)
    except DamagedLogError as exc:
        warnings.warn(f"{exc}; the run is not counted as finished", RuntimeWarning, stacklevel=2)
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(records) and records[-1].get(C.LOG_ROUND) == rounds and \
        C.LOG_ACCURACY in records[-1]


def table_header() -> str:
    return " | ".join(f"{title:>{len(fmt.format(0) if 'f' not in fmt else fmt.format(0.0))}}"
                      for _, title, fmt in TABLE_COLUMNS)


def table_row(record: dict) -> str:
    cells = []
    for key, _, fmt in TABLE_COLUMNS:
        value = record.get(key)
        if key in MEGABYTE_KEYS and value is not None:
            value = value / 1e6
        width = len(fmt.format(0.0 if "f" in fmt else 0))
        cells.append(" " * (width - 1) + "-" if value is None else fmt.format(value))
    return " | ".join(cells)


def format_table(records: list[dict]) -> str:
    """A per-round text table of accuracy, losses, clients, bytes and time."""
    return "\n".join([table_header()] + [table_row(r) for r in records])
