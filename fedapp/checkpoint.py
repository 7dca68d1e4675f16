"""Checkpoint / resume of a run (run config ``checkpoint-every``, ``resume-from``).

Every ``checkpoint-every`` rounds the ServerApp writes ``checkpoint.pkl`` into the run
directory (temp file, fsync, ``os.replace``: a crash while writing leaves the previous
checkpoint intact). It holds, at the end of round r:

* the global model (numpy arrays, exact bytes, key order kept);
* the strategy's cross-round state (``strategy.state_dict()``: FedNova's momentum
  buffer, FedVeca's tau table / L / previous gradient, DynamicFL's L / rich set / budgets,
  SCAFFOLD's c and its copy of every client's c_i, Flower's FedAvgM / FedOpt moments);
* the server's RNG states (numpy, Python ``random``; the ServerApp draws from no torch RNG:
  its torch side is a child process, fedapp.evaluation_process);
* the run-log records of rounds 0..r and the elapsed seconds;
* the resolved run config, to refuse resuming a different experiment.

``resume-from=<run dir>`` starts a *new* run directory (the old one is left as it
was), seeds its ``rounds.jsonl`` with rounds 0..r from the checkpoint and runs rounds
r+1..N with their true round numbers, so clients draw the same (seed, round,
partition) batch streams and the strategies the same per-round samples as an
uninterrupted run.

Every strategy, Flower's own server optimisers included, runs (and resumes) through the
one round loop :func:`strategies.rounds.run_rounds`, whose ``first_round`` starts at
round r+1 with the true round numbers.
"""

from __future__ import annotations

import os
import pickle
import random
from collections.abc import Callable
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies import contract as C
from strategies import rounds

from .config import ConfigError, default

CHECKPOINT_NAME = "checkpoint.pkl"
FORMAT_VERSION = 1
# Keys a resumed run may change; every other run-config value must equal the checkpoint's.
MAY_DIFFER = ("num-server-rounds", "checkpoint-every", "resume-from", "output-dir", "data-dir",
              "allow-download", "device", "round-timeout", "tracking", "tracking-dir")


# ----------------------------------------------------------------- files
def save_checkpoint(directory: Path, payload: dict) -> Path:
    """Atomically write ``payload`` to ``directory/checkpoint.pkl``."""
    path = Path(directory) / CHECKPOINT_NAME
    tmp = path.with_name(f".{CHECKPOINT_NAME}.tmp")
    with tmp.open("wb") as handle:
        pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: str | Path) -> dict:
    """The checkpoint of a run directory, with a clear error if there is none or it is broken.

    The file is a pickle: resume only from run directories you (or your runs) wrote.
    """
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise ConfigError(f"run config: resume-from={str(run_dir)!r} has no {CHECKPOINT_NAME}; "
                          "point it at a run directory written with checkpoint-every >= 1 (its "
                          "rounds.jsonl shows how far it got), or start fresh with "
                          "--run-config \"resume-from=''\"")
    try:
        with path.open("rb") as handle:
            payload = pickle.load(handle)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same thing
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__}: {exc}); it is corrupt or "
                          "truncated. Resume from an earlier copy or start the run again") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise ConfigError(f"{path} is not a fedhetero checkpoint of format {FORMAT_VERSION}")
    return payload


def check_compatible(payload: dict, run_config: dict) -> None:
    """Refuse to resume a checkpoint of a different experiment (other than ``MAY_DIFFER``)."""
    saved = payload["run-config"]
    # a key added after the checkpoint was written counts as its default: a checkpoint taken
    # before, e.g., server-beta1 existed resumes when the key is left at its default
    saved = {**{k: default(k) for k in run_config if k not in saved}, **saved}
    diff = {k: (saved.get(k), run_config.get(k)) for k in sorted(set(saved) | set(run_config))
            if k not in MAY_DIFFER and saved.get(k) != run_config.get(k)}
    if diff:
        shown = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ConfigError(f"run config: resume-from checkpoint was written with other settings "
                          f"({shown}); resume with the same run config (only "
                          f"{', '.join(MAY_DIFFER)} may change)")
    rounds = run_config["num-server-rounds"]
    if rounds <= payload["round"]:
        raise ConfigError(f"run config: num-server-rounds={rounds} but the checkpoint is "
                          f"already at round {payload['round']}; ask for more rounds to resume, "
                          f"e.g. --run-config \"num-server-rounds={payload['round'] + 1}\"")


# ----------------------------------------------------------------- payload
def rng_state() -> dict:
    return {"numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    """The server's RNGs as ``rng_state`` took them (a "torch" entry, which checkpoints
    written before the ServerApp's torch side moved out of its process hold, is not used)."""
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def make_payload(server_round: int, arrays: ArrayRecord, strategy: Strategy, records: list[dict],
                 elapsed: float, run_config: dict) -> dict:
    state = strategy.state_dict() if hasattr(strategy, "state_dict") else None
    return {
        "format": FORMAT_VERSION,
        "round": int(server_round),
        "arrays": {key: np.array(array.numpy(), copy=True) for key, array in arrays.items()},
        "strategy-class": type(strategy).__name__,
        "strategy": state,
        "rng": rng_state(),
        "records": [dict(r) for r in records],
        C.LOG_ELAPSED_SECONDS: float(elapsed),
        "run-config": dict(run_config),
    }


def arrays_of(payload: dict) -> ArrayRecord:
    return ArrayRecord({key: Array(np.ascontiguousarray(value))
                        for key, value in payload["arrays"].items()})


def restore_strategy(strategy: Strategy, payload: dict) -> None:
    if payload["strategy-class"] != type(strategy).__name__:
        raise ConfigError(f"checkpoint is of strategy {payload['strategy-class']}, the run config "
                          f"builds {type(strategy).__name__}")
    if payload["strategy"] is not None:
        strategy.load_state_dict(payload["strategy"])


class Checkpointer:
    """The server evaluator's checkpoints: :meth:`snapshot` at the end of round r, on the
    server's loop (the model, the strategy's state and the RNGs as the next round finds
    them), then :meth:`write` once round r's run-log record is complete (its evaluation
    may finish while round r + 1 trains)."""

    def __init__(self, directory: Path, every: int, strategy: Strategy, run_config: dict) -> None:
        self.directory, self.every = Path(directory), int(every)
        self.strategy, self.run_config = strategy, run_config

    def due(self, server_round: int) -> bool:
        """True for the rounds that are checkpointed (every ``checkpoint-every`` rounds)."""
        return self.every > 0 and server_round > 0 and server_round % self.every == 0

    def snapshot(self, server_round: int, arrays: ArrayRecord, elapsed: float) -> dict | None:
        """The checkpoint of round r without its run-log records (copied now), or None
        when round r is not checkpointed."""
        if not self.due(server_round):
            return None
        return make_payload(server_round, arrays, self.strategy, [], elapsed, self.run_config)

    def write(self, payload: dict, records: list[dict]) -> Path:
        """Save a :meth:`snapshot` with the run log's records of rounds 0..r."""
        payload = {**payload, "records": [dict(r) for r in records]}
        path = save_checkpoint(self.directory, payload)
        log(INFO, "Checkpoint of round %d: %s", payload["round"], path)
        return path


# ----------------------------------------------------------------- the loop
def run_rounds(strategy: Strategy, *, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int,
               first_round: int, timeout: float, train_config: ConfigRecord,
               evaluate_config: ConfigRecord,
               evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None]) -> Result:
    """Rounds ``first_round``..``num_rounds`` of ``strategy`` (:func:`strategies.rounds.
    run_rounds`). With ``first_round`` > 1 the initial model is not evaluated again (round
    r's record is already in the run log)."""
    return rounds.run_rounds(strategy, grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn, first_round)


__all__ = ["CHECKPOINT_NAME", "Checkpointer", "arrays_of", "check_compatible",
           "load_checkpoint", "restore_rng", "restore_strategy", "run_rounds", "save_checkpoint"]
