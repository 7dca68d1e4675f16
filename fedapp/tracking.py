"""Round records as experiment-tracking scalars (run-config ``tracking``, ``tracking-dir``).

``tracking = "tensorboard"`` writes TensorBoard event files, ``"mlflow"`` logs to a local
MLflow store, ``"tensorboard,mlflow"`` does both; ``""`` (default) is off. Every round
record the run log appends (``rounds.jsonl``, including the records a resumed run copies
from its checkpoint) becomes scalars at step = its round:

* an int or float value is one scalar named by its key (a bool is 0 / 1); the round
  itself is the step, not a scalar;
* a dict is flattened with ``/``: ``{"drift-cosine": {"fc.weight": 0.9}}`` gives
  ``drift-cosine/fc.weight`` (nested dicts: ``a/b/c``), which TensorBoard groups by ``a``;
* lists (per-reply values in reply order, e.g. ``local-steps``: positions are not client
  identities), strings and None are not logged.

Where (``tracking-dir``, "" = the run directory): TensorBoard's event file goes into the
run directory itself (``tensorboard --logdir <output-dir>`` shows every run), or into
``<tracking-dir>/<run directory name>/``. MLflow's store is the SQLite file
``mlflow.db`` in the run directory or in ``tracking-dir`` (one store for all runs that
name it): experiment ``fedhetero``, one MLflow run per run, named after the run directory,
with the run config as parameters. (MLflow's plain-file store ``./mlruns`` refuses to
open since MLflow 3.7 unless ``MLFLOW_ALLOW_FILE_STORE=true``; SQLite is its replacement,
and flwr already brings SQLAlchemy and alembic.)

Both writers are optional: ``pip install -e ".[tracking]"`` (tensorboard, mlflow-skinny),
imported only when a run asks for them.
"""

from __future__ import annotations

import atexit
import importlib.util
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path

from flwr.common.logger import log as flwr_log

from strategies import contract as C

TRACKERS = ("tensorboard", "mlflow")
EXTRA = "tracking"  # the pyproject extra that installs both writers
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # what each tracker imports
MLFLOW_STORE = "mlflow.db"
MLFLOW_EXPERIMENT = "fedhetero"
MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log_batch call


def tracker_names(value: str) -> tuple[str, ...]:
    """``"tensorboard,mlflow"`` -> ('tensorboard', 'mlflow'); "" -> (). Unknown names raise
    ValueError."""
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or (value.strip() and not names):
        raise ValueError(f"unknown tracker(s) {', '.join(unknown) or repr(value)}")
    return names


def check_installed(value: str) -> None:
    """Raise ValueError naming the extra to install when a chosen tracker's package is
    missing (checked by the ServerApp, the only process that writes)."""
    missing = [n for n in tracker_names(value) if importlib.util.find_spec(MODULES[n]) is None]
    if missing:
        raise ValueError(
            f"run config: tracking={value!r} needs the {', '.join(missing)} package(s), which "
            f"are not installed where the ServerApp runs. Install the '{EXTRA}' extra: "
            f"pip install -e \".[{EXTRA}]\" (or pip install tensorboard mlflow-skinny), or "
            f"turn tracking off: --run-config \"tracking=''\"")


def scalars_of(record: Mapping[str, object], prefix: str = "") -> dict[str, float]:
    """The numeric scalars of a round record, flattened as the module docstring says."""
    scalars: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if not prefix and key == C.LOG_ROUND:
            continue
        if isinstance(value, Mapping):
            scalars.update(scalars_of(value, f"{name}/"))
        elif isinstance(value, (bool, int, float)):
            scalars[name] = float(value)
    return scalars


class TensorBoardTracker:
    """TensorBoard event file (torch.utils.tensorboard's SummaryWriter) in ``directory``."""

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (optional extra)

        self.writer = SummaryWriter(log_dir=str(directory))
        self.directory = directory
        flwr_log(INFO, "Tracking: TensorBoard event files in %s (tensorboard --logdir %s)",
                 directory, directory)

    def log(self, record: Mapping[str, object]) -> None:
        step, now = int(record[C.LOG_ROUND]), time.time()
        for tag, value in scalars_of(record).items():
            self.writer.add_scalar(tag, value, step, walltime=now)
        self.writer.flush()  # complete on disk after every round, even if the run dies

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """One MLflow run in the SQLite store ``directory / mlflow.db`` (experiment fedhetero)."""

    def __init__(self, directory: Path, run_name: str, params: Mapping[str, object]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415 (optional extra)
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        directory.mkdir(parents=True, exist_ok=True)
        self.uri = f"sqlite:///{(directory / MLFLOW_STORE).resolve()}"
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(MLFLOW_EXPERIMENT)
        experiment_id = (experiment.experiment_id if experiment is not None else
                         self.client.create_experiment(
                             MLFLOW_EXPERIMENT,
                             artifact_location=(directory / "mlartifacts").resolve().as_uri()))
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        items = [Param(key, str(value)) for key, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow's limit of params per batch
            self.client.log_batch(self.run_id, params=items[start:start + 100])
        self.closed = False
        atexit.register(self.close, "FAILED")  # a run that dies before close() says so
        flwr_log(INFO, "Tracking: MLflow run %r (experiment %s) in %s (mlflow ui "
                 "--backend-store-uri %s)", run_name, MLFLOW_EXPERIMENT, self.uri, self.uri)

    def log(self, record: Mapping[str, object]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        step, now = int(record[C.LOG_ROUND]), int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in scalars_of(record).items()]
        for start in range(0, len(metrics), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MLFLOW_BATCH])

    def close(self, status: str = "FINISHED") -> None:
        if not self.closed:
            self.closed = True
            atexit.unregister(self.close)
            self.client.set_terminated(self.run_id, status=status)


class Trackers:
    """The trackers of one run: ``log`` every round record, ``close`` at the end."""

    def __init__(self, trackers: list) -> None:
        self.trackers = trackers

    @classmethod
    def open(cls, value: str, run_directory: Path, tracking_dir: str,
             run_config: Mapping[str, object]) -> Trackers:
        """The trackers ``tracking = value`` names, writing where ``tracking-dir`` says."""
        base = Path(tracking_dir) if tracking_dir else None
        trackers = []
        for name in tracker_names(value):
            if name == "tensorboard":
                trackers.append(TensorBoardTracker(
                    run_directory if base is None else base / run_directory.name))
            else:
                trackers.append(MlflowTracker(base or run_directory, run_directory.name,
                                              run_config))
        return cls(trackers)

    def log(self, record: Mapping[str, object]) -> None:
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
