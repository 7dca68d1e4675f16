"""The ServerApp's torch side, in a process of its own: initial model, evaluation on the test
split (or the validation split held out of the training split), final model file.

The ServerApp aggregates with numpy only (the strategies need flwr + numpy) and so does not
import torch, whose import alone is about 500 MB resident: this child process, started once
per run, builds the seeded initial model, evaluates each evaluated round's model on the test
split (with ``validation_fraction`` > 0: on the validation split, :mod:`task.data`; the test
split is then never evaluated) and writes ``final_model.pt``. It also runs the evaluation
beside the next round's training without sharing the ServerApp's interpreter
(docs/results/benchmark.md, "ServerApp memory").

The child is ``python -m fedapp.evaluation_process FD`` with the ServerApp's ``sys.path``;
requests and replies are pickled over a socket pair (``multiprocessing.connection``). It
imports neither flwr nor the strategies, holds no state a request depends on besides what
its spec gave it, and stops when asked or when the ServerApp's end of the socket closes (the
ServerApp's process ended, however it ended). A process that runs the ServerApp several
times with the same spec (the in-process fault and resume tools, the tests) keeps one child
for them all: :func:`evaluation_process`.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from task.data import DataNotFoundError

START_TIMEOUT_S = 600  # reading and decoding a dataset the first time (CIFAR-100) can be slow


@dataclass(frozen=True)
class EvaluationSpec:
    """What the child needs from the run config (picklable, no flwr)."""

    dataset: str
    data_dir: str
    allow_download: bool
    synthetic_alpha: float
    synthetic_beta: float
    normalize: bool
    model: str
    seed: int
    device: str
    batch_size: int
    reference_gflops: float | None  # the simulated clock's, when the strategy has one
    width_levels: tuple[float, ...] = ()  # a width strategy's levels: each width evaluated too
    model_width: float = 1.0  # the run's model-width: the model built at this width
    validation_fraction: float = 0.0  # > 0: evaluate on this share held out of the train split


@dataclass(frozen=True)
class EvaluationResult:
    """One evaluation: loss and accuracy on the evaluated split, its seconds, the child's peak
    memory so far; with width levels, the accuracy of each width's static sub-model (the first
    ceil(r K) units of every hidden layer) by width."""

    loss: float
    accuracy: float
    seconds: float
    peak_rss_mb: float
    width_accuracy: dict | None = None


class EvaluationProcess:
    """The ServerApp's handle on the child; one request at a time (a lock serialises them).

    ``info`` holds what the child reported once started: ``arrays`` (the seeded initial
    model, key -> numpy array, the state dict's order), ``input-shape``, ``num-classes``,
    ``source`` (where the data came from), ``device``, ``torch`` (its version) and
    ``seconds-per-example`` (the simulated clock's cost, when ``reference_gflops`` is set),
    ``evaluation-examples`` (the size of the evaluated split);
    with ``width_levels``, ``width-spec`` (``task.models.width_spec``'s plain tuples) and
    ``width-compute`` (per level, the width-r model's training FLOPs over the full model's).
    """

    def __init__(self, spec: EvaluationSpec) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fedapp.evaluation_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env)
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        self.lock = threading.Lock()
        try:
            self.info = self._request(asdict(spec), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Running, and no request of it was left without its reply."""
        return not self.connection.closed and self.process.poll() is None

    def evaluate(self, arrays: dict[str, np.ndarray], background: bool = False) -> EvaluationResult:
        """Loss and accuracy of ``arrays`` on the evaluated split. ``background``: on one torch
        thread at nice 19 (it runs while clients train: :func:`background_evaluation_thread`);
        else on all torch threads."""
        return EvaluationResult(**self._request(("evaluate", arrays, background)))

    def save_model(self, arrays: dict[str, np.ndarray], path: Path) -> Path:
        """Write ``arrays`` to ``path`` as a torch state dict of the model, atomically."""
        return Path(self._request(("save", arrays, str(path))))

    def close(self) -> None:
        """Ask the child to stop and wait for it (killed, by its PID, if it does not stop)."""
        try:
            self.connection.send(("stop",))
        except OSError:
            pass  # already gone
        self.connection.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _request(self, message, timeout: float | None = None):
        """Send ``message``, return the child's reply (its error raised here)."""
        with self.lock:
            try:
                self.connection.send(message)
                if timeout is not None and not self.connection.poll(timeout):
                    raise RuntimeError(f"the ServerApp's evaluation process (pid {self.pid}) did "
                                       f"not start within {timeout} s")
                status, payload = self.connection.recv()
            except (EOFError, OSError):
                status, payload = "gone", None
            except BaseException:  # interrupted between request and reply: not to be reused
                self.connection.close()
                raise
        if status == "gone":
            code = self.process.wait(timeout=30)
            raise RuntimeError(f"the ServerApp's evaluation process (pid {self.pid}) ended "
                               f"unexpectedly (exit code {code}); its error, if any, is printed "
                               "above") from None
        if status == "ok":
            return payload
        kind, message, trace = payload
        if kind == "DataNotFoundError":
            raise DataNotFoundError(message)
        if kind == "ValueError":
            raise ValueError(message)
        raise RuntimeError(f"the ServerApp's evaluation process failed: {kind}: {message}\n{trace}")


KEEP_SPECS = 2  # children kept for later runs (each holds torch, a model and its data)
_KEPT: dict[EvaluationSpec, EvaluationProcess] = {}  # least recently used first


def evaluation_process(spec: EvaluationSpec) -> EvaluationProcess:
    """This process's evaluation process for ``spec``: started on first use, then kept for
    later runs with the same spec (a new one if it died), stopped when this process exits.
    Only the :data:`KEEP_SPECS` most recently used specs keep theirs: a process that runs many
    configurations one after another (a test worker) would otherwise hold a child of about
    600 MB for each of them."""
    kept = _KEPT.pop(spec, None)
    if kept is not None and not kept.alive:
        kept.close()
        kept = None
    if kept is None:
        while len(_KEPT) >= KEEP_SPECS:
            _KEPT.pop(next(iter(_KEPT))).close()
        kept = EvaluationProcess(spec)
    _KEPT[spec] = kept  # now the most recently used
    return kept


@atexit.register
def _stop_kept() -> None:
    for kept in _KEPT.values():
        kept.close()
    _KEPT.clear()


# ------------------------------------------------------------------ the child
def background_evaluation_thread() -> None:
    """Set up the thread that evaluates while the clients train: one torch thread (torch's
    thread count is per thread, so the rest of the process keeps its own; one thread
    contends least with the training that has the cores, and its losses are the same bits
    as with more threads, checked on the CNNs), at nice 19 (per thread on Linux;
    elsewhere the priority is left as it is). Ray starts its workers, the ClientApps, at
    nice 15 (``RAY_worker_niceness``), so where a client trains on the same core the
    scheduler's weights (15 against 36) give this thread a share of it, not only the
    time the clients leave idle: on a machine whose cores all train, the evaluation's CPU
    comes out of the clients' (docs/results/benchmark.md, "The background evaluation's share
    of the CPU")."""
    import torch  # noqa: PLC0415 - the child's side only

    torch.set_num_threads(1)
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


class Evaluator:
    """The child's state: the model, the evaluated split on the device (the test split, or
    the validation split), the background thread."""

    def __init__(self, spec: EvaluationSpec) -> None:
        import torch  # noqa: PLC0415 - the child's side only

        from task.data import load_dataset  # noqa: PLC0415
        from task.devices import seconds_per_example  # noqa: PLC0415
        from task.heap import keep_step_memory  # noqa: PLC0415
        from task.layout import inference_layout  # noqa: PLC0415
        from task.models import build_model  # noqa: PLC0415
        from task.train import resolve_device  # noqa: PLC0415

        keep_step_memory()  # each evaluation batch reuses the last one's memory
        dataset = load_dataset(spec.dataset, spec.data_dir, spec.allow_download,
                               spec.synthetic_alpha, spec.synthetic_beta, spec.normalize,
                               with_train=False,  # the server evaluates only
                               validation_fraction=spec.validation_fraction)
        x_eval, y_eval = ((dataset.x_validation, dataset.y_validation)
                          if spec.validation_fraction else (dataset.x_test, dataset.y_test))
        torch.manual_seed(spec.seed)
        model = build_model(spec.model, dataset.input_shape, dataset.num_classes,
                            width=spec.model_width)
        device = resolve_device(spec.device)
        self.info = {
            "arrays": {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()},
            # plain Python values only: unpickling them must not import torch in the ServerApp
            "input-shape": tuple(int(n) for n in dataset.input_shape),
            "num-classes": int(dataset.num_classes),
            "source": str(dataset.source),
            "evaluation-examples": int(len(y_eval)),
            "device": str(device),
            "torch": str(torch.__version__),  # not torch's TorchVersion
            "seconds-per-example": (None if spec.reference_gflops is None else
                                    seconds_per_example(model, dataset.input_shape,
                                                        spec.reference_gflops)),
        }
        self.width_models = {}
        if spec.width_levels:
            from task.devices import training_flops_per_example  # noqa: PLC0415
            from task.models import width_spec  # noqa: PLC0415

            shape, classes = dataset.input_shape, dataset.num_classes
            full = training_flops_per_example(model, shape)
            built = {r: build_model(spec.model, shape, classes, width=r)
                     for r in spec.width_levels if r != 1.0}
            self.info["width-spec"] = width_spec(spec.model, shape, classes)
            self.info["width-compute"] = {
                float(r): (1.0 if r == 1.0 else training_flops_per_example(built[r], shape) / full)
                for r in spec.width_levels}
            self.width_models = {r: inference_layout(m.to(device), x_eval[:1].to(device))[0]
                                 for r, m in built.items()}
        self.model, self.x_eval = inference_layout(model.to(device), x_eval.to(device))
        self.y_eval = y_eval.to(device)
        self.batch_size = spec.batch_size
        self.background = ThreadPoolExecutor(1, thread_name_prefix="fedhetero-eval",
                                              initializer=background_evaluation_thread)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Give the model ``arrays`` (the ServerApp's round model, key -> numpy array)."""
        import torch  # noqa: PLC0415

        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})

    def evaluate(self, arrays: dict[str, np.ndarray], background: bool) -> dict:
        if background:
            return self.background.submit(self.evaluate, arrays, False).result()
        from task.evaluate import evaluate  # noqa: PLC0415

        began = time.perf_counter()
        self.load(arrays)
        result = evaluate(self.model, self.x_eval, self.y_eval, self.batch_size)
        widths = None
        if self.width_models:
            widths = {1.0: float(result.accuracy)}
            for r, model in self.width_models.items():
                load_prefix(model, arrays)
                widths[float(r)] = float(
                    evaluate(model, self.x_eval, self.y_eval, self.batch_size).accuracy)
        return {"loss": float(result.loss), "accuracy": float(result.accuracy),
                "seconds": time.perf_counter() - began, "peak_rss_mb": peak_rss_mb(),
                "width_accuracy": widths}

    def save_model(self, arrays: dict[str, np.ndarray], path: str) -> str:
        from .model_file import write_model  # noqa: PLC0415

        self.load(arrays)
        final = {k: v.cpu().contiguous() for k, v in self.model.state_dict().items()}
        return str(write_model(final, Path(path)))


def load_prefix(model, arrays: dict[str, np.ndarray]) -> None:
    """Load into a width-r ``model`` the first entries of every full-width array along each
    axis (its shapes): the static sub-model of the first ceil(r K) units of every hidden
    layer (``strategies.engine.submodel_math``, "static"; a flatten's units are consecutive)."""
    import torch  # noqa: PLC0415

    state = model.state_dict()
    model.load_state_dict({
        key: torch.from_numpy(np.ascontiguousarray(
            arrays[key][tuple(slice(0, n) for n in value.shape)]))
        for key, value in state.items()})


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's VmHWM, which starts afresh at
    exec (``ru_maxrss`` keeps the high-water mark of the process that forked this one, e.g.
    a large parent's), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # noqa: PLC0415 - POSIX only

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def serve(connection: Connection) -> None:
    """The child's loop: the spec, then requests until "stop" or the socket closes."""

    def failed(exc: BaseException) -> tuple[str, tuple[str, str, str]]:
        return "error", (type(exc).__name__, str(exc), traceback.format_exc())

    try:
        evaluator = Evaluator(EvaluationSpec(**connection.recv()))
    except EOFError:
        return
    except Exception as exc:  # noqa: BLE001 - reported to the ServerApp, which raises it
        connection.send(failed(exc))
        return
    connection.send(("ok", evaluator.info))
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return  # the ServerApp is gone
        if request[0] == "stop":
            return
        try:
            reply = (evaluator.evaluate(*request[1:]) if request[0] == "evaluate" else
                     evaluator.save_model(*request[1:]))
        except Exception as exc:  # noqa: BLE001 - reported to the ServerApp, which raises it
            connection.send(failed(exc))
            continue
        connection.send(("ok", reply))


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
