"""``bench overhead``: (a) wall time of FedAvg rounds on Flower's simulation engine (real
``flwr run``, Ray backend) against the bare torch time of the same SGD steps in one
process, as a ratio; the first round (actor start, data decoding) is reported apart;
(b) our ClientApp's per-message overhead beyond Flower's own: the time a warm
``@app.train`` call spends outside SGD (record <-> tensor conversion, data and model
lookup, reply building), measured in-process."""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from fedapp.config import RunConfig
from fedapp.registry import train_config
from strategies import contract as C
from task.data import PartitionSpec, client_data, load_dataset
from task.heap import keep_step_memory
from task.layout import training_layout
from task.models import build_model
from strategies.client import local_sgd

from .common import (add_workload_arguments, bare_torch_round_seconds,
                     simulation_round_seconds, workload)

HELP = "simulation vs bare torch, and ClientApp overhead"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p, clients=10, rounds=4, model="cnn-small",
                           rounds_help="server rounds (round 1, the start-up, is reported apart)")


def client_overhead_ms(repeats: int = 30) -> tuple[float, float, float]:
    """(train call ms, SGD-only ms, overhead ms) for a warm 1-step @app.train call."""
    from flwr.app import (  # noqa: PLC0415
        ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict)
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415

    from fedapp.client_app import app  # noqa: PLC0415

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    keep_step_memory()  # before either timing, not at the ClientApp's first message
    run_config = {"model": "cnn-small", "partition": "iid", "local-steps": 1}
    cfg = RunConfig.from_user_config(run_config)
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 10},
        state=RecordDict(),
        run_config=run_config,
    )
    dataset = load_dataset(cfg.dataset)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    sgd_model = training_layout(copy.deepcopy(model), dataset.input_shape)  # the ClientApp's layout
    config = ConfigRecord({**train_config(cfg), C.SERVER_ROUND: 1})
    message = Message(
        RecordDict({C.ARRAYS: ArrayRecord(model.state_dict()), C.CONFIG: config}),
        message_type=MessageType.TRAIN,
        dst_node_id=1,
    )
    x, y = client_data(dataset, PartitionSpec(scheme="iid", seed=0), 0, 10)

    def timed(fn) -> float:
        fn()  # warm
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    call = timed(lambda: app(message, context))
    sgd = timed(lambda: local_sgd(sgd_model, x, y, lr=0.05, batch_size=cfg.batch_size, steps=1, seed=1))
    return call, sgd, call - sgd


def run(args) -> None:
    work = workload(args)
    print(
        f"Workload: Fashion-MNIST IID, model {args.model}, {args.clients} clients, {args.rounds} "
        "rounds, "
        f"E={args.epochs}, B={args.batch_size}; device "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}, "
        f"{torch.get_num_threads()} torch threads in this process"
    )
    sim = simulation_round_seconds(work, args.clients, args.cpus_per_client)
    bare = bare_torch_round_seconds(work, args.clients, args.rounds)
    warm_sim, warm_bare = statistics.mean(sim[1:]), statistics.mean(bare[1:])
    print("\n(a) FedAvg round wall time, simulation engine vs bare torch (same SGD steps)")
    print(f"    simulation, round 1 (actor start + data decoding): {sim[0]:.2f} s")
    print(f"    simulation, rounds 2..{args.rounds} mean:                {warm_sim:.2f} s")
    print(f"    bare torch, one process, rounds 2..{args.rounds} mean:   {warm_bare:.2f} s")
    print(f"    ratio simulation / bare torch (warm rounds):      {warm_sim / warm_bare:.2f}")
    call, sgd, extra = client_overhead_ms()
    print("\n(b) ClientApp per-message overhead (warm, in-process, 1 SGD step, median)")
    print(
        f"    @app.train call {call:.2f} ms, SGD alone {sgd:.2f} ms -> overhead {extra:.2f} ms "
        f"per message (target <= 20 ms)"
    )
