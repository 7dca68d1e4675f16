"""``bench layout``: milliseconds per local SGD step of each convolutional model with
contiguous (NCHW) weights against channels-last (NHWC) weights, on the run's device (one
torch thread on the CPU, as each ClientApp gets), and the 10k-image test-set evaluation in
both layouts; next to each, the layout :func:`task.layout.training_layout` picks on this
device. These figures are why it picks channels-last on the CPU and leaves CUDA as it is
(docs/results/benchmark.md, "Channels-last training"). Random images: a convolution's cost
does not depend on the pixel values. Each layout is warmed up once, then the two alternate,
best of ``--repeats``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from task.evaluate import evaluate
from task.heap import keep_step_memory
from task.layout import inference_layout, training_layout
from task.models import build_model
from strategies.client import local_sgd
from task.train import resolve_device

from .common import settled

HELP = "channels-last vs contiguous: SGD step and evaluation times on this device"

# (model, input shape, batch size): the convolutional models at the batch sizes the
# experiments use
CASES = (
    ("cnn-mcmahan", (1, 28, 28), 32),
    ("cnn-mcmahan", (1, 28, 28), 10),
    ("cnn-mcmahan", (1, 28, 28), 64),
    ("cnn-small", (1, 28, 28), 32),
    ("cnn-small", (3, 32, 32), 64),
    ("lenet-gn", (1, 28, 28), 32),
    ("cnn-fedveca", (1, 28, 28), 32),
    ("cnn-small-moon", (3, 32, 32), 64),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=100, help="SGD steps per timing (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="timings per layout (default 3)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto (CUDA when present; default), cpu or cuda")
    p.add_argument("--eval-images", type=int, default=10_000,
                   help="images in the evaluation timing (default: Fashion-MNIST's 10k test set)")
    p.add_argument("--model", nargs="*", default=None, metavar="NAME",
                   help="only these models (default: every convolutional one)")


def is_channels_last(model: torch.nn.Module) -> bool:
    """Whether the model's convolution weights are stored channels-last (a weight with one
    input channel, or a 1x1 kernel, reads the same in both layouts: one must tell them apart)."""
    weights = [p for p in model.parameters() if p.dim() == 4]
    return (all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
            and any(not w.is_contiguous() for w in weights))


def alternate_best_ms(runs: dict[bool, Callable[[], object]], repeats: int, device: torch.device,
                      per: int) -> dict[bool, float]:
    """{channels_last: best ms per ``per`` units} of the two runs, each warmed up once
    (oneDNN primitives, cuDNN plans, the allocator), then timed alternately."""
    for run_once in runs.values():
        run_once()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for channels_last, run_once in runs.items():
            settled(device)
            start = time.perf_counter()
            run_once()
            settled(device)
            best[channels_last] = min(best[channels_last], time.perf_counter() - start)
    return {channels_last: seconds / per * 1e3 for channels_last, seconds in best.items()}


def sgd_step_ms(name: str, shape: tuple[int, int, int], batch: int, device: torch.device,
                steps: int, repeats: int) -> dict[bool, float]:
    """{channels_last: best ms per SGD step} for ``name`` on ``device``."""
    x = torch.randn(steps * batch, *shape, device=device)
    y = torch.randint(0, 10, (steps * batch,), device=device)
    runs = {}
    for channels_last in (False, True):
        torch.manual_seed(0)
        model = build_model(name, shape, 10).to(device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        runs[channels_last] = (lambda m=model: local_sgd(m, x, y, lr=0.01, batch_size=batch,
                                                         steps=steps))
    return alternate_best_ms(runs, repeats, device, steps)


def evaluation_ms(device: torch.device, images: int,
                  repeats: int) -> tuple[dict[bool, float], bool]:
    """({channels_last: best ms} of evaluating cnn-mcmahan on ``images`` images in batches
    of 128 as the server does, whether :func:`task.layout.inference_layout` picked
    channels-last): the server's own layout function makes the second variant."""
    x = torch.randn(images, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (images,), device=device)
    model = build_model("cnn-mcmahan", (1, 28, 28), 10).to(device)
    served_model, served_x = inference_layout(
        build_model("cnn-mcmahan", (1, 28, 28), 10).to(device), x)
    runs = {False: lambda: evaluate(model, x, y),
            True: lambda: evaluate(served_model, served_x, y)}
    return alternate_best_ms(runs, repeats, device, 1), is_channels_last(served_model)


def run(args) -> None:
    if min(args.steps, args.repeats, args.eval_images) < 1:
        raise SystemExit(f"--steps {args.steps} --repeats {args.repeats} --eval-images "
                         f"{args.eval_images}: give integers >= 1")
    known = sorted({name for name, _, _ in CASES})
    unknown = sorted(set(args.model or ()) - set(known))
    if unknown:
        raise SystemExit(f"--model {' '.join(unknown)}: not a convolutional model here; "
                         f"choose from {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --device auto "
                         "or cpu")
    device = resolve_device(args.device)
    keep_step_memory()  # as the ClientApps and the ServerApp: one step's memory kept
    previous = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread per ClientApp, as the simulation gives
    try:
        name_of = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, 1 thread"
        print(f"Device: {device} ({name_of}), torch {torch.__version__}; {args.steps} SGD "
              f"steps per timing, best of {args.repeats} per layout")
        print(f"{'model':15s} {'input':12s} {'B':>3s} {'contiguous':>11s} {'channels-last':>14s} "
              f"{'speed-up':>8s}  training_layout picks")
        ratios = []
        for name, shape, batch in CASES:
            if args.model and name not in args.model:
                continue
            ms = sgd_step_ms(name, shape, batch, device, args.steps, args.repeats)
            picked = training_layout(build_model(name, shape, 10).to(device), shape)
            ratios.append(ms[False] / ms[True])
            print(f"{name:15s} {str(shape):12s} {batch:3d} {ms[False]:8.3f} ms {ms[True]:11.3f} ms "
                  f"{ratios[-1]:7.2f}x  "
                  f"{'channels-last' if is_channels_last(picked) else 'contiguous'}", flush=True)
        ev, served_channels_last = evaluation_ms(device, args.eval_images, args.repeats)
        print(f"evaluation, cnn-mcmahan, {args.eval_images} images, B=128: contiguous "
              f"{ev[False]:.1f} ms, channels-last {ev[True]:.1f} ms "
              f"({ev[False] / ev[True]:.2f}x; inference_layout picks "
              f"{'channels-last' if served_channels_last else 'contiguous'})")
        print(f"channels-last SGD speed-up on {device.type}: "
              f"{min(ratios):.2f}x to {max(ratios):.2f}x")
    finally:
        torch.set_num_threads(previous)
