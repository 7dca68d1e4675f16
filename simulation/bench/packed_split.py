"""``bench packed-split``: where the time of a packed round goes, in one process.

The ServerApp runs against in-process ClientApps
(:func:`simulation.reliability.grid.run_inprocess`: no Ray, no SuperLink, no transport, the
W workers called one after another) on :mod:`.scale`'s workload (FedAvg, one SGD step of
B = 32 per client, cnn-small, Fashion-MNIST IID) with ``virtual-clients`` = N on W workers
and ``vectorised-clients`` = ``--vectorised``. Per warm round (rounds 2..R-1, the mean; round
R evaluates the test set) it
prints the round's wall time, the ClientApp calls summed over the workers, the local
training inside them (the vectorised step, :func:`strategies.client.vectorised_sgd`, or the
per-client loop's ``local_sgd``) and the rest of the round: the ServerApp's own work
(sampling, the packed Grid's packing and unpacking, the trust gate, averaging, the run log).

That last part runs in the one ServerApp process whatever W is and wherever the clients
train, so it is a floor of a packed round at N clients on this machine's core: more
workers or a GPU shorten the ClientApp calls, never it. The bench prints it per client
beside the round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from strategies import contract as C

from ..runtime import at_least, option_type
from .common import DATA_DIR
from .scale import packed_workload

HELP = ("where a packed round's time goes, in one process: the ServerApp's own work, the "
        "ClientApp calls and the training in them")

# (module, function name): the local training the bench times, patched where its caller
# looks it up at call time
TRAINING = (("fedapp.vectorised_share", "vectorised_sgd"), ("fedapp.client_app", "local_sgd"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=option_type("num-supernodes"), default=1000,
                   help="virtual clients")
    p.add_argument("--workers", type=at_least(1), nargs="+", default=[2, 16], metavar="W",
                   help="workers (SuperNodes) serving them, one run each")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per run (>= 3: rounds 2..R-1 are timed)")
    p.add_argument("--vectorised", choices=("off", "auto", "on"), default="on",
                   help="the runs' vectorised-clients (default on: the batched step)")
    p.add_argument("--data-dir", default=DATA_DIR, help="Fashion-MNIST IDX folder")


@contextmanager
def timed_calls(current_round) -> Iterator[dict[str, list[tuple[int, float]]]]:
    """Inside the block each ClientApp call of the in-process Grid (``clientapp``) and each
    call of a :data:`TRAINING` function (``training``) appends (``current_round()`` as it
    ends, its seconds) to the list of its name; the functions are put back after."""
    import importlib  # noqa: PLC0415

    from simulation.reliability.grid import FaultGrid  # noqa: PLC0415

    calls: dict[str, list[tuple[int, float]]] = defaultdict(list)

    def timer(original, name):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:  # the call's seconds first: the round lookup reads the run log
                seconds = time.perf_counter() - start
                calls[name].append((current_round(), seconds))
        return timed

    patched = [(FaultGrid, "deliver", "clientapp")] + [
        (importlib.import_module(module), function, "training") for module, function in TRAINING]
    originals = [getattr(owner, attr) for owner, attr, _ in patched]
    for (owner, attr, name), original in zip(patched, originals):
        setattr(owner, attr, timer(original, name))
    try:
        yield calls
    finally:
        for (owner, attr, _), original in zip(patched, originals):
            setattr(owner, attr, original)


def round_split(records: list[dict], calls: dict[str, list[tuple[int, float]]]) -> dict:
    """Mean seconds per warm round (2..R-1, R the last record's): ``round`` (the run log's
    wall seconds), ``clientapp`` and ``training`` (their calls made during that round,
    summed) and ``server`` (the round less its ClientApp calls). ``calls``: timer name ->
    (round, seconds) per call."""
    last = max(r[C.LOG_ROUND] for r in records)
    rounds = [r for r in records if 2 <= r[C.LOG_ROUND] < last]
    if not rounds:
        raise ValueError("bench packed-split: no warm round (rounds 2..R-1) in the run log")

    def per_round(name: str) -> list[float]:
        return [sum(s for k, s in calls.get(name, []) if k == r[C.LOG_ROUND]) for r in rounds]

    wall = [r[C.LOG_WALL_SECONDS] for r in rounds]
    clientapp, training = per_round("clientapp"), per_round("training")
    return {"round": statistics.mean(wall), "clientapp": statistics.mean(clientapp),
            "training": statistics.mean(training),
            "server": statistics.mean(w - c for w, c in zip(wall, clientapp))}


def split_line(clients: int, workers: int, split: dict) -> str:
    """One run's line."""
    return (f"{clients} clients, W={workers}: round {split['round']:.3f} s = ClientApp calls "
            f"{split['clientapp']:.3f} s (training {split['training']:.3f} s) + the "
            f"ServerApp's own work {split['server']:.3f} s "
            f"({1000 * split['server'] / clients:.2f} ms per client)")


def run_split(clients: int, workers: int, rounds: int, vectorised: str, data_dir: str) -> dict:
    """One in-process run's :func:`round_split`; each timed call is charged to the round in
    flight as it ends (the ServerApp's run log holds rounds 0..r-1 during round r)."""
    from fedapp.run_log import read_rounds  # noqa: PLC0415
    from simulation.reliability.grid import run_inprocess  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="fedhetero-bench-") as tmp:
        out = Path(tmp) / "runs"
        config = {**packed_workload(clients, rounds, data_dir, vectorised), "output-dir": str(out)}

        def current_round() -> int:
            logs = list(out.glob("*/rounds.jsonl"))
            return len(read_rounds(logs[0].parent)) if logs else 0

        with timed_calls(current_round) as calls:
            _, run_dir = run_inprocess(config, num_nodes=min(workers, clients))
        return round_split(read_rounds(run_dir), calls)


def run(args) -> None:
    if args.rounds < 3:
        raise SystemExit("bench packed-split: --rounds must be >= 3 (rounds 2..R-1 are timed)")
    from simulation.reliability.common import quiet_flower  # noqa: PLC0415

    quiet_flower()
    print(f"Packed mode in one process (no Ray, no SuperLink, the workers one after another): "
          f"{args.clients} virtual clients, FedAvg, one SGD step per client (B=32, cnn-small, "
          f"Fashion-MNIST IID), {args.rounds} rounds per run, rounds 2..{args.rounds - 1} timed; "
          f"vectorised-clients {args.vectorised}", flush=True)
    for workers in args.workers:
        split = run_split(args.clients, workers, args.rounds, args.vectorised, args.data_dir)
        print(split_line(args.clients, min(workers, args.clients), split), flush=True)
