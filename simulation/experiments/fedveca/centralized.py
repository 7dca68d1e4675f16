"""``python -m simulation centralized``: centralized SGD, the reference of FedVeca's Fig. 3.

All clients' data on one device (the union of the partitions), plain minibatch SGD with
batch B and learning rate eta for a given total number of steps (FedVeca's tau_all, Luo et al.
Sec. IV-A), evaluated on the test set at checkpoints: by default after each round's share of
FedVeca's steps (``--from-fedveca RUN_DIR``: the cumulative sum_i tau_(k,i)), else after
every ``steps / rounds`` steps. The run directory has the federated runs' layout
(``config.json``, ``rounds.jsonl`` with round 0 = the initial model, ``final_model.pt``),
so ``python -m simulation report`` treats it as one more variant.

It does not use Flower: there is nothing federated to run.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fedapp.run_log import RunLog, format_table, has_round_log, read_rounds
from strategies import contract as C
from task.data import PartitionSpec, client_data, load_dataset
from task.evaluate import evaluate
from task.heap import keep_step_memory
from task.layout import training_layout
from task.models import build_model
from strategies.client import batch_indices

from ...runtime import at_least
from .fairness import checkpoints as cumulative_checkpoints
from .fairness import steps_per_round


CENTRAL_STEPS = "central-steps"  # run-log key of this driver only: SGD steps so far


def even_checkpoints(total_steps: int, rounds: int) -> list[int]:
    """round(k * total / K) for k = 1..K (the last is the total)."""
    return [round(k * total_steps / rounds) for k in range(1, rounds + 1)]


def centralized_sgd(
    model,
    x: torch.Tensor,
    y: torch.Tensor,
    checkpoints: Sequence[int],
    *,
    lr: float,
    batch_size: int,
    seed: int,
    on_checkpoint: Callable[[int, int, float], None] | None = None,
) -> int:
    """Plain SGD on (x, y) up to ``checkpoints[-1]`` steps of B examples each.

    The minibatches are cut from fresh epoch permutations (``strategies.client.batch_indices``,
    as the clients do). After the step count reaches each checkpoint k (1-based index),
    ``on_checkpoint(k, steps_so_far, mean_minibatch_loss_since_last_checkpoint)`` runs.
    Returns the number of steps taken.
    """
    if any(b < a for a, b in zip(checkpoints, checkpoints[1:])) or (
        checkpoints and checkpoints[0] < 0
    ):
        raise ValueError(
            f"checkpoints must be non-decreasing and >= 0, got {list(checkpoints)[:5]}..."
        )
    generator = torch.Generator().manual_seed(seed)
    batches = batch_indices(len(y), batch_size, generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps, loss_sum, loss_count = 0, 0.0, 0
    for index, target in enumerate(checkpoints, 1):
        model.train()
        while steps < target:
            idx = next(batches).to(x.device)
            optimizer.zero_grad(set_to_none=True)
            loss = model.loss(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            steps += 1
            loss_sum += float(loss.detach())
            loss_count += 1
        if on_checkpoint is not None:
            on_checkpoint(index, steps, loss_sum / loss_count if loss_count else float("nan"))
        loss_sum, loss_count = 0.0, 0
    return steps


def union_data(
    dataset, partition: str, num_partitions: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The union of all partitions' (x, y), in partition order."""
    spec = PartitionSpec(scheme=partition, seed=seed)
    parts = [client_data(dataset, spec, pid, num_partitions) for pid in range(num_partitions)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def run_centralized(
    *,
    model_name: str,
    checkpoints: Sequence[int],
    lr: float,
    batch_size: int,
    seed: int,
    output_dir: Path,
    dataset_name: str = "fashion-mnist",
    data_dir: str = "",
    partition: str = "fedveca-case3",
    num_partitions: int = 5,
    eval_batch_size: int = 1000,
    extra: dict | None = None,
    verbose: bool = True,
) -> Path:
    """Train, evaluate at every checkpoint, and write a run directory under ``output_dir``."""
    dataset = load_dataset(dataset_name, data_dir, False)
    x, y = union_data(dataset, partition, num_partitions, seed)
    torch.manual_seed(seed)  # the ServerApp's initial model for this seed
    # the ClientApps' layout (channels-last convolutions on the CPU) and heap thresholds:
    # the same SGD as FedVeca's clients
    keep_step_memory()
    model = training_layout(build_model(model_name, dataset.input_shape, dataset.num_classes),
                            dataset.input_shape)
    config = {
        "run-config": {
            "strategy": "centralized",
            "model": model_name,
            "lr": lr,
            "batch-size": batch_size,
            "seed": seed,
            "dataset": dataset_name,
            "partition": partition,
            "num-partitions": num_partitions,
            "num-server-rounds": len(checkpoints),
            "total-steps": int(checkpoints[-1]) if checkpoints else 0,
            **(extra or {}),
        },
        "checkpoints": list(map(int, checkpoints)),
        "train-examples": len(y),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    log = RunLog.create(Path(output_dir), "centralized", 0, config)
    x_test, y_test = dataset.x_test, dataset.y_test
    started = last = time.perf_counter()
    records: list[dict] = []

    def record(round_: int, steps: int, train_loss: float | None) -> None:
        nonlocal last
        result = evaluate(model, x_test, y_test, eval_batch_size)
        now = time.perf_counter()
        row = {
            C.LOG_ROUND: round_,
            C.LOG_ACCURACY: result.accuracy,
            C.LOG_LOSS: result.loss,
            CENTRAL_STEPS: steps,
            C.LOG_WALL_SECONDS: now - last,
            C.LOG_ELAPSED_SECONDS: now - started,
        }
        if train_loss is not None:
            row[C.LOG_TRAIN_LOSS] = train_loss
        last = now
        records.append(row)
        log.append_round(row)
        if verbose and (round_ % 10 == 0 or round_ == len(checkpoints)):
            print(
                f"centralized seed {seed}: round {round_}/{len(checkpoints)} ({steps} steps), "
                f"accuracy {result.accuracy:.4f}",
                flush=True,
            )

    record(0, 0, None)
    centralized_sgd(
        model,
        x,
        y,
        checkpoints,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        on_checkpoint=lambda k, steps, loss: record(k, steps, loss),
    )
    log.save_model({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})
    if verbose:
        print(format_table(records[-3:]), flush=True)
    return log.directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The centralized options."""
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder; the run directory goes below it"
    )
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--from-fedveca",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="a FedVeca run directory: total steps and checkpoints from its rounds.jsonl",
    )
    budget.add_argument("--steps", type=at_least(1), default=None, help="total SGD steps")
    parser.add_argument(
        "--rounds", type=at_least(1), default=50, help="checkpoints (without --from-fedveca)"
    )
    parser.add_argument("--model", default="svm", help="svm or cnn-fedveca (task.models)")
    parser.add_argument("--lr", type=float, default=0.01, help="eta")
    parser.add_argument("--batch-size", type=at_least(1), default=100, help="B")
    parser.add_argument("--seed", type=int, default=0,
                        help="the partition, initial model and batch-order seed")
    parser.add_argument("--dataset", default="fashion-mnist", help="dataset name")
    parser.add_argument("--data-dir", default="",
                        help="absolute data folder (empty: the default place)")
    parser.add_argument("--partition", default="fedveca-case3",
                        help="partition whose union is the training set")
    parser.add_argument("--num-partitions", type=at_least(1), default=5,
                        help="partitions (clients)")


def run(args: argparse.Namespace) -> int:
    """Train and evaluate; prints the run directory and step count as JSON."""
    if args.from_fedveca is not None:
        if not has_round_log(args.from_fedveca):
            raise SystemExit(
                f"--from-fedveca {args.from_fedveca}: no rounds.jsonl there; give a FedVeca run "
                "directory (fedveca-fig3 writes them to <out>/fedveca/seed<k>/<run>/)"
            )
        points = cumulative_checkpoints(steps_per_round(read_rounds(args.from_fedveca)))
        if not points:
            raise SystemExit(
                f"--from-fedveca {args.from_fedveca}: no fedveca-tau in its "
                "rounds.jsonl; give a FedVeca run directory"
            )
    else:  # --steps (argparse: one of the two, and >= 1)
        points = even_checkpoints(args.steps, args.rounds)
    run_dir = run_centralized(
        model_name=args.model,
        checkpoints=points,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        output_dir=args.out.resolve(),
        dataset_name=args.dataset,
        data_dir=args.data_dir,
        partition=args.partition,
        num_partitions=args.num_partitions,
    )
    print(json.dumps({"run-dir": str(run_dir), "steps": points[-1]}))
    return 0
