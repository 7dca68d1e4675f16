"""The run log: resolved config, one JSON line per round, the final model.

Layout of one run directory::

    <output-dir>/<YYYYmmdd-HHMMSS>-<strategy>-run<run_id>/
        config.json      resolved run config + versions
        rounds.jsonl     one JSON object per round (round 0 = initial model)
        final_model.pt   torch state_dict of the final global model
        events.out.tfevents.*, mlflow.db   with run-config ``tracking`` (fedapp.tracking)
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from flwr.app import ArrayRecord

from strategies import contract as C

from .tracking import Trackers

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


class RunLog:
    """Writes one run's directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rounds_path = directory / "rounds.jsonl"
        self.trackers = Trackers([])  # run-config `tracking`: every round record as scalars

    @classmethod
    def create(cls, output_dir: Path, strategy: str, run_id: int, config: dict,
               tracking: str = "", tracking_dir: str = "") -> RunLog:
        """A new run directory; ``tracking`` / ``tracking_dir`` as the run-config keys
        (:mod:`fedapp.tracking`), with ``config["run-config"]`` as MLflow's parameters."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        directory = output_dir / f"{stamp}-{strategy}-run{run_id}"
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory)
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        log.rounds_path.write_text("")
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
        """Where the final model goes (a torch state dict: ``task.models.save_state_dict``)."""
        return self.directory / "final_model.pt"

    def save_model(self, state_dict: dict) -> Path:
        from task.models import save_state_dict  # noqa: PLC0415 - torch only where a model is

        return save_state_dict(state_dict, self.model_path)


def model_sha256(arrays: ArrayRecord) -> str:
    """sha256 over the model's arrays in sorted key order, each as ``key|dtype|shape|``
    followed by its bytes (C order): equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        array = arrays[key].numpy()
        digest.update(f"{key}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def read_rounds(directory: Path) -> list[dict]:
    """All round records of a run directory."""
    lines = (Path(directory) / "rounds.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


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
