"""Checkpoint / resume of a run (run config ``checkpoint-every``, ``resume-from``).

Every ``checkpoint-every`` rounds the ServerApp writes a checkpoint into the run directory:
``checkpoint-round<r>-<token>.npz`` (every numpy array) and ``checkpoint.json`` (everything
else, as typed JSON: :mod:`fedapp.checkpoint_format`, plus the SHA-256 of the ``.npz`` and
of the JSON state, checked on load). Both are written atomically (:mod:`fedapp.atomic_file`:
temp file, fsync, ``os.replace``, fsync of the folder), the ``.npz`` first: the JSON names
the ``.npz`` it belongs to, so a crash or a full disk at any point leaves the previous
checkpoint whole. Nothing is unpickled when a checkpoint is read (JSON, and the ``.npz``
through :func:`fedapp.npz_file.read_npz`: no pickle, no compressed member, no header that
claims more than its bytes); a ``checkpoint.pkl`` of fedhetero before format 2 is refused.
A file planted with recomputed hashes is still checked: its nesting depth is bounded, its
payload must have the shape :func:`make_payload` gives it, and the ServerApp resumes its
model only when its keys, shapes and dtypes are the run's model's (:func:`model_problem`).
A checkpoint holds, at the end of round r:

* the global model (numpy arrays, exact bytes, key order kept);
* the strategy's cross-round state (``strategy.state_dict()``: FedNova's momentum
  buffer, FedVeca's tau table / L / previous gradient, DynamicFL's L / rich set / budgets,
  SCAFFOLD's c and its copy of every client's c_i, Flower's FedAvgM / FedOpt moments);
* the server's RNG states (numpy, Python ``random``). No torch RNG state: the ServerApp
  draws from no torch RNG (its torch side is a child process, fedapp.evaluation_process,
  that only evaluates), and clients seed every draw from (seed, round, partition);
* the run-log records of rounds 0..r and the elapsed seconds;
* the resolved run config and its digest (:func:`config_digest`), to refuse resuming a
  different experiment (and, in a sweep, a checkpoint of another variant or seed).

``resume-from=<run dir>`` starts a *new* run directory (the old one is left as it
was), seeds its ``rounds.jsonl`` with rounds 0..r from the checkpoint and runs rounds
r+1..N with their true round numbers, so clients draw the same (seed, round,
partition) batch streams and the strategies the same per-round samples as an
uninterrupted run.

Every strategy, Flower's own server optimisers included, runs (and resumes) through the
one round loop :func:`strategies.engine.rounds.run_rounds`, whose ``first_round`` starts at
round r+1 with the true round numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import secrets
import zipfile
from collections.abc import Callable
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies import contract as C
from strategies.engine import rounds

from .atomic_file import write_atomically, write_bytes_atomically
from .checkpoint_format import CheckpointFormatError, decode, dumps, encode, loads
from .config import ConfigError, default, flwr_run_fix
from .npz_file import NpzFormatError, read_npz

CHECKPOINT_NAME = "checkpoint.json"
LEGACY_NAME = "checkpoint.pkl"  # format 1 (a pickle): refused
FORMAT_NAME = "fedhetero-checkpoint"
FORMAT_VERSION = 2
ARRAYS_FILE = re.compile(r"checkpoint-round[0-9]{1,9}-[0-9a-f]{8}\.npz")
MAX_JSON_BYTES = 1 << 30  # the JSON holds no arrays; a larger one is not a checkpoint
# Keys a resumed run may change; every other run-config value must equal the checkpoint's.
MAY_DIFFER = ("num-server-rounds", "checkpoint-every", "resume-from", "output-dir", "data-dir",
              "allow-download", "device", "round-timeout", "silence-timeout", "tracking",
              "tracking-dir", "partition-map")
# Keys left out of the config digest: a resumed run's own resume-from names its source
NOT_DIGESTED = ("resume-from",)
PAYLOAD_KEYS = ("format", "round", "arrays", "strategy-class", "strategy", "rng", "records",
                C.LOG_ELAPSED_SECONDS, "run-config", "config-digest")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (the disk is full, ...); the previous one is whole."""


def config_digest(run_config: dict) -> str:
    """SHA-256 of the resolved run config (``RunConfig.to_dict()``), ``resume-from`` aside:
    equal digests mean the same experiment, variant and seed (and output folder)."""
    kept = {k: v for k, v in run_config.items() if k not in NOT_DIGESTED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------- files
def save_checkpoint(directory: Path, payload: dict) -> Path:
    """Write ``payload`` (:func:`make_payload`) as ``directory/checkpoint.json`` and its
    ``.npz``; the previous checkpoint stays whole until the new one is. Raises
    CheckpointWriteError (naming the file and the cause) when a write fails."""
    directory = Path(directory)
    tree, arrays = encode(payload)  # before any write: a value it cannot hold changes nothing
    arrays_path = directory / f"checkpoint-round{int(payload['round'])}-{secrets.token_hex(4)}.npz"
    path = directory / CHECKPOINT_NAME
    try:
        write_atomically(arrays_path, lambda handle: np.savez(handle, **arrays))
        state = dumps(tree)
        manifest = {"format": FORMAT_NAME, "format-version": FORMAT_VERSION,
                    "round": int(payload["round"]), "config-digest": payload["config-digest"],
                    "arrays-file": arrays_path.name, "arrays-sha256": file_sha256(arrays_path),
                    "state-sha256": text_sha256(state), "state": tree}
        write_bytes_atomically(path, (dumps(manifest) + "\n").encode())
    except OSError as exc:
        with contextlib.suppress(OSError):  # not referenced by any checkpoint.json
            arrays_path.unlink(missing_ok=True)
        raise CheckpointWriteError(
            exc.errno, f"the checkpoint of round {payload['round']} could not be written "
            f"({exc.filename or directory}: {exc.strerror or exc}); the previous checkpoint in "
            f"{directory}, if any, is whole. Free space (or fix the folder) and resume with "
            f"resume-from='{directory}'", str(exc.filename or path)) from exc
    remove_stale_files(directory, keep=arrays_path.name)
    return path


def remove_stale_files(directory: Path, keep: str) -> None:
    """The ``.npz`` of older checkpoints and the temp files a killed write left behind."""
    for stale in [*directory.glob("checkpoint-round*.npz"), *directory.glob(".checkpoint*.tmp")]:
        if stale.name != keep:
            with contextlib.suppress(OSError):
                stale.unlink()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_checkpoint(run_dir: str | Path) -> dict:
    """The checkpoint of a run directory, with a clear error if there is none or it is
    broken (ConfigError naming the file, what is wrong and what to do)."""
    run_dir = Path(run_dir)
    start_fresh = {"resume-from": ""}
    fresh = f"or start fresh: {flwr_run_fix(start_fresh)}"
    if not run_dir.is_dir():
        hint = (" (that is a file: give the run directory that holds it)"
                if run_dir.is_file() else " (no such folder)")
        raise ConfigError(f"run config: resume-from={str(run_dir)!r} is not a run directory"
                          f"{hint}; point it at a run directory written with checkpoint-every "
                          f">= 1, {fresh}", start_fresh)
    path = run_dir / CHECKPOINT_NAME
    if not path.is_file():
        if (run_dir / LEGACY_NAME).exists():
            raise ConfigError(
                f"run config: resume-from={str(run_dir)!r} holds {LEGACY_NAME}, a checkpoint of "
                f"fedhetero before checkpoint format {FORMAT_VERSION}: a Python pickle, which can "
                "run any code when it is loaded, so it is not read (and not converted). Start "
                f"the run again ({flwr_run_fix(start_fresh)}); runs of this version write "
                f"{CHECKPOINT_NAME}, which resumes without unpickling anything", start_fresh)
        raise ConfigError(f"run config: resume-from={str(run_dir)!r} has no {CHECKPOINT_NAME}; "
                          "point it at a run directory written with checkpoint-every >= 1 (its "
                          f"rounds.jsonl shows how far it got), {fresh}", start_fresh)
    try:
        return read_checkpoint(path)
    except RecursionError:
        exc = CheckpointFormatError("its JSON is nested deeper than any checkpoint "
                                    "(Python's recursion limit)")
        raise ConfigError(f"{path} cannot be read: {exc}. It is not a fedhetero checkpoint; "
                          "resume from an earlier copy or start the run again") from None
    except (OSError, CheckpointFormatError, NpzFormatError, ValueError,
            zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path} cannot be read: {exc}. It is corrupt, truncated or not a "
                          f"fedhetero checkpoint of format {FORMAT_VERSION}; resume from an "
                          "earlier copy or start the run again") from None


def read_checkpoint(path: Path) -> dict:
    """Parse, verify (hashes, shapes of the values) and decode ``checkpoint.json`` and its
    ``.npz``; raises CheckpointFormatError (or OSError) on anything else."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointFormatError(f"{path.stat().st_size} bytes, more than a checkpoint's "
                                    f"JSON ({MAX_JSON_BYTES})")
    manifest = loads(path.read_bytes().decode("utf-8"))
    if type(manifest) is not dict or manifest.get("format") != FORMAT_NAME:
        raise CheckpointFormatError(f"not a {FORMAT_NAME} (its 'format' is "
                                    f"{manifest.get('format') if type(manifest) is dict else None!r})")
    if manifest.get("format-version") != FORMAT_VERSION:
        raise CheckpointFormatError(f"format-version {manifest.get('format-version')!r}, this "
                                    f"fedhetero reads {FORMAT_VERSION}")
    name = manifest.get("arrays-file")
    if type(name) is not str or not ARRAYS_FILE.fullmatch(name):
        raise CheckpointFormatError(f"arrays-file {name!r} is not a checkpoint .npz name")
    if text_sha256(dumps(manifest.get("state"))) != manifest.get("state-sha256"):
        raise CheckpointFormatError("the SHA-256 of its state does not match the one it "
                                    "records: the file was changed or damaged after it was "
                                    "written")
    arrays_path = path.parent / name
    if file_sha256(arrays_path) != manifest.get("arrays-sha256"):
        raise CheckpointFormatError(f"the SHA-256 of {name} does not match the one the JSON "
                                    "records: the .npz was changed, damaged or replaced "
                                    "after it was written")
    payload = decode(manifest["state"], read_npz(arrays_path))
    problem = payload_problem(payload, manifest)
    if problem:
        raise CheckpointFormatError(problem)
    return payload


def payload_problem(payload: object, manifest: dict) -> str | None:
    """Why a decoded payload is not one :func:`make_payload` wrote (None if it is)."""
    if type(payload) is not dict or sorted(payload) != sorted(PAYLOAD_KEYS):
        keys = sorted(payload) if type(payload) is dict else type(payload).__name__
        return f"its payload has keys {keys}, not {sorted(PAYLOAD_KEYS)}"
    checks = (
        (payload["format"] == FORMAT_VERSION, f"payload format {payload['format']!r}"),
        (type(payload["round"]) is int and payload["round"] >= 0
         and payload["round"] == manifest.get("round"), f"round {payload['round']!r}"),
        (type(payload["arrays"]) is dict and all(
            type(k) is str and type(v) is np.ndarray for k, v in payload["arrays"].items()),
         "'arrays' is not a dict of named numpy arrays"),
        (type(payload["strategy-class"]) is str, "'strategy-class' is not a str"),
        (rng_problem(payload["rng"]) is None, f"'rng': {rng_problem(payload['rng'])}"),
        (type(payload["records"]) is list and all(type(r) is dict for r in payload["records"]),
         "'records' is not a list of dicts"),
        (type(payload[C.LOG_ELAPSED_SECONDS]) is float, f"'{C.LOG_ELAPSED_SECONDS}' is not a float"),
        (type(payload["run-config"]) is dict and all(type(k) is str for k in payload["run-config"]),
         "'run-config' is not a dict"),
    )
    for ok, what in checks:
        if not ok:
            return what
    digest = config_digest(payload["run-config"])
    if not payload["config-digest"] == manifest.get("config-digest") == digest:
        return "its config-digest is not the digest of its run config"
    return None


def rng_problem(state: object) -> str | None:
    """Why ``state`` is not what :func:`rng_state` returns (None if it is)."""
    if type(state) is not dict or sorted(state) != ["numpy", "python"]:
        return "not a dict with 'numpy' and 'python'"
    numpy, python = state["numpy"], state["python"]
    if not (type(numpy) is tuple and len(numpy) == 5 and numpy[0] == "MT19937"
            and type(numpy[1]) is np.ndarray and numpy[1].dtype == np.uint32
            and numpy[1].shape == (624,) and type(numpy[2]) is int and type(numpy[3]) is int
            and type(numpy[4]) is float):
        return "the numpy state is not ('MT19937', 624 uint32, int, int, float)"
    if not (type(python) is tuple and len(python) == 3 and type(python[1]) is tuple
            and all(type(x) is int for x in python[1])):
        return "the Python random state is not (version, tuple of ints, gauss)"
    return None


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
    """The server's global RNG states (numpy's legacy generator, Python's ``random``)."""
    return {"numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    """The server's RNGs as :func:`rng_state` took them."""
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
        "config-digest": config_digest(run_config),
    }


def arrays_of(payload: dict) -> ArrayRecord:
    return ArrayRecord({key: Array(np.ascontiguousarray(value))
                        for key, value in payload["arrays"].items()})


def model_problem(payload: dict, model: dict[str, np.ndarray]) -> str | None:
    """Why the checkpoint's model is not the run's ``model`` (its state dict as numpy
    arrays): the keys in order, then each array's shape and dtype (None: it is); any
    floating dtype stands for a floating one (Flower's FedAdam, FedYogi, FedAdagrad and
    FedAvgM send float64 from round 2 on)."""
    saved = payload["arrays"]
    if list(saved) != list(model):
        extra = [k for k in saved if k not in model]
        missing = [k for k in model if k not in saved]
        return (f"its model's keys are not the run's model's (keys the model does not have: "
                f"{extra[:3]}, keys it lacks: {missing[:3]}"
                + (", the same keys in another order" if not extra and not missing else "") + ")")
    for key, array in saved.items():
        expected = model[key]
        floating = array.dtype.kind == expected.dtype.kind == "f"  # FedAdam & co: float64
        if array.shape != expected.shape or not (floating or array.dtype == expected.dtype):
            return (f"its model's {key!r} is {array.dtype}{list(array.shape)}, the run's model "
                    f"has {expected.dtype}{list(expected.shape)}")
    return None


def check_model(payload: dict, model: dict[str, np.ndarray], run_dir: str | Path) -> None:
    """Refuse to resume a checkpoint whose model is not the run's (:func:`model_problem`)."""
    problem = model_problem(payload, model)
    if problem:
        start_fresh = {"resume-from": ""}
        raise ConfigError(f"run config: resume-from={str(run_dir)!r}: {problem}. The checkpoint "
                          "was not written by this run's model (planted or from another "
                          f"version); start fresh: {flwr_run_fix(start_fresh)}", start_fresh)


def check_strategy_class(payload: dict, strategy_class: str) -> None:
    """Refuse a checkpoint written by another strategy class than the run config builds."""
    if payload["strategy-class"] != strategy_class:
        raise ConfigError(f"checkpoint is of strategy {payload['strategy-class']}, the run config "
                          f"builds {strategy_class}")


def check_resumable(run_dir: str | Path, run_config: dict, strategy_class: str) -> dict:
    """Every check the ServerApp makes of ``resume-from`` before it trains, reading only
    (a driver runs it before anything starts): the checkpoint of ``run_dir`` loads
    (:func:`load_checkpoint`), was written with this resolved ``run_config``
    (:func:`check_compatible`) and by ``strategy_class``. Returns the checkpoint;
    ConfigError names what is wrong and the fix."""
    payload = load_checkpoint(run_dir)
    check_compatible(payload, run_config)
    check_strategy_class(payload, strategy_class)
    return payload


def restore_strategy(strategy: Strategy, payload: dict) -> None:
    check_strategy_class(payload, type(strategy).__name__)
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
    """Rounds ``first_round``..``num_rounds`` of ``strategy`` (:func:`strategies.engine.rounds.
    run_rounds`). With ``first_round`` > 1 the initial model is not evaluated again (round
    r's record is already in the run log)."""
    return rounds.run_rounds(strategy, grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn, first_round)


__all__ = ["CHECKPOINT_NAME", "CheckpointWriteError", "Checkpointer", "arrays_of",
           "check_compatible", "check_model", "check_resumable", "check_strategy_class", "config_digest",
           "load_checkpoint", "restore_rng", "restore_strategy", "run_rounds", "save_checkpoint"]
