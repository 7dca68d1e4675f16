"""``bench heap``: ms per SGD step and minor page faults per step with glibc's own malloc
thresholds against :func:`task.heap.keep_step_memory`'s fixed ones, one torch thread, on
the CPU. Each measurement is a freshly spawned process (glibc's thresholds move with what a
process has allocated before, so a fresh one starts from glibc's defaults), the two
settings alternated ``--repeats`` times. With glibc's own thresholds the same steps in
the same fresh process trim the heap in some runs and not in others, so the median and
the range of each setting are printed, and the ratio of the medians."""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

from task.model_names import MODEL_NAMES

from .cpu_accounting import stat_fields
from .layout import CASES

HELP = "SGD step time with glibc's malloc thresholds against fixed ones (CPU)"
INPUT_SHAPE = {name: shape for name, shape, _ in reversed(CASES)}  # each model's first case


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="cnn-mcmahan", help="model name (task.models)")
    p.add_argument("--batch-size", type=int, default=32, help="local batch size B")
    p.add_argument("--steps", type=int, default=200, help="timed SGD steps per measurement")
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per setting")


def minor_faults() -> int:
    """This process's minor page faults so far (Linux's /proc; -1 elsewhere)."""
    try:
        return int(stat_fields()[7])
    except OSError:
        return -1


def sgd_steps(job: tuple) -> tuple[float, int]:
    """(seconds, minor faults) of ``steps`` SGD steps in this process, after 5 untimed ones;
    with ``keep`` the thresholds are fixed first."""
    keep, model_name, batch_size, steps = job
    import torch  # noqa: PLC0415 - in the spawned process

    from task.heap import keep_step_memory  # noqa: PLC0415
    from task.layout import training_layout  # noqa: PLC0415
    from task.models import build_model  # noqa: PLC0415
    from strategies.client import local_sgd  # noqa: PLC0415

    if keep:
        keep_step_memory()
    torch.set_num_threads(1)  # one thread per ClientApp, as the simulation gives
    torch.manual_seed(0)
    shape = INPUT_SHAPE.get(model_name, (1, 28, 28))  # else Fashion-MNIST's
    model = training_layout(build_model(model_name, shape, 10), shape)
    x, y = torch.randn(100 * batch_size, *shape), torch.randint(0, 10, (100 * batch_size,))
    local_sgd(model, x, y, lr=0.01, batch_size=batch_size, steps=5)
    faults, start = minor_faults(), time.perf_counter()
    local_sgd(model, x, y, lr=0.01, batch_size=batch_size, steps=steps)
    return time.perf_counter() - start, minor_faults() - faults


def run(args) -> None:
    from task.heap import keep_step_memory  # noqa: PLC0415

    if min(args.steps, args.repeats, args.batch_size) < 1:
        raise SystemExit(f"--steps {args.steps} --repeats {args.repeats} --batch-size "
                         f"{args.batch_size}: give integers >= 1")
    if args.model not in MODEL_NAMES:
        raise SystemExit(f"--model {args.model}: unknown; choose from {', '.join(MODEL_NAMES)}")
    context = multiprocessing.get_context("spawn")
    runs: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
    with context.Pool(1, maxtasksperchild=1) as pool:  # a fresh process per measurement
        if not pool.apply(keep_step_memory):
            print("this platform's C library is not glibc: no malloc thresholds to compare")
            return
        for _ in range(args.repeats):
            for keep in (False, True):
                runs[keep].append(pool.apply(sgd_steps, ((keep, args.model, args.batch_size,
                                                          args.steps),)))
    print(f"{args.model}, B = {args.batch_size}, {args.steps} SGD steps, CPU, 1 thread, "
          f"{args.repeats} fresh processes per setting:")
    median = {}
    for keep, label in ((False, "glibc's thresholds"), (True, "keep_step_memory")):
        ms = [1000 * seconds / args.steps for seconds, _ in runs[keep]]
        faults = [count / args.steps for _, count in runs[keep]]
        median[keep] = statistics.median(ms)
        print(f"  {label:20s} ms/step median {median[keep]:7.2f} ({min(ms):.2f}-{max(ms):.2f})"
              f"   minor faults/step {min(faults):.0f}-{max(faults):.0f}")
    print(f"median speed-up with fixed thresholds = {median[False] / median[True]:.2f}x")
