"""``bench aggregation``: each strategy's ``aggregate_train`` against Flower's FedAvg on the
same replies (default 100 replies of the 1,663,370-parameter McMahan CNN): time ratio
(best of interleaved repeats) and peak memory beyond the replies, in model-sized buffers
(tracemalloc). Targets (issue #19): FedVeca <= 1.5x Flower's FedAvg, <= 4 model sizes."""

from __future__ import annotations

import argparse
import time

import torch

from strategies import contract as C
from strategies.engine.round_plan import RoundPlan
from task.models import build_model

from ..runtime import at_least

HELP = "aggregate_train time and memory vs Flower's FedAvg"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replies", type=at_least(1), default=100, help="client replies aggregated")
    p.add_argument("--model", default="cnn-mcmahan", help="model name (task.models)")
    p.add_argument("--repeats", type=at_least(1), default=5,
                   help="interleaved timings of each strategy (the best is printed)")


def _replies(num_replies: int, model: str):
    """Train replies as a Flower SuperLink would hand them to aggregate_train."""
    import numpy as np  # noqa: PLC0415
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )  # noqa: PLC0415
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    torch.manual_seed(0)
    net = build_model(model, (1, 28, 28), 10)
    global_arrays = ArrayRecord(net.state_dict())
    rng = np.random.default_rng(0)
    replies = []
    for i in range(num_replies):
        arrays = ArrayRecord(
            {
                k: Array((v.numpy() + 0.01 * rng.standard_normal(v.shape)).astype(v.numpy().dtype))
                for k, v in net.state_dict().items()
            }
        )
        instruction = Message(
            RecordDict({C.CONFIG: ConfigRecord()}),
            message_type=MessageType.TRAIN,
            dst_node_id=i + 1,
        )
        metrics = MetricRecord(
            {C.NUM_EXAMPLES: 100 + 7 * i, C.TRAIN_LOSS: 1.0, C.LOCAL_STEPS_TAKEN: 10 + i}
        )
        replies.append(
            Message(RecordDict({C.ARRAYS: arrays, C.METRICS: metrics}), reply_to=instruction)
        )
    return global_arrays, replies, sum(v.numel() for v in net.state_dict().values()) * 4


def run(args) -> None:
    import tracemalloc  # noqa: PLC0415

    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg  # noqa: PLC0415

    from flwr.app import ArrayRecord  # noqa: PLC0415

    from strategies import FedAvg, FedNova, FedProx, FedVeca  # noqa: PLC0415

    import logging  # noqa: PLC0415

    logging.getLogger("flwr").setLevel(logging.ERROR)  # no per-call log lines between the timings
    global_arrays, replies, model_bytes = _replies(args.replies, args.model)
    _, veca_replies, _ = _replies(args.replies, args.model)
    for reply in (
        veca_replies
    ):  # FedVeca's extra payload: grad F_i(w_k) (as large as the model), beta, delta
        reply.content[C.GRAD] = ArrayRecord(dict(reply.content[C.ARRAYS].items()))
        reply.content[C.METRICS][C.BETA], reply.content[C.METRICS][C.DELTA] = 1.0, 0.5
    replies_of = {"FedVeca": veca_replies}
    nodes = [r.metadata.src_node_id for r in replies]
    plan = RoundPlan.of_sent(1, global_arrays, {n: {} for n in nodes})  # w_t sent to each
    contenders = {"Flower FedAvg": FlowerFedAvg().aggregate_train}
    for name, strategy in {
        "FedAvg": FedAvg(),
        "FedProx": FedProx(proximal_mu=0.01),
        "FedNova": FedNova(),
        "FedVeca": FedVeca(),
    }.items():
        contenders[name] = lambda _, replies, strategy=strategy: strategy.aggregate_round(
            plan, replies)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, aggregate in contenders.items():
            start = time.perf_counter()
            aggregate(1, replies_of.get(name, replies))
            times[name].append(time.perf_counter() - start)
    peaks = {}
    for name, aggregate in contenders.items():
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        aggregate(1, replies_of.get(name, replies))
        peaks[name] = (tracemalloc.get_traced_memory()[1] - base) / model_bytes
        tracemalloc.stop()
    flower = min(times["Flower FedAvg"])
    print(
        f"Aggregation of {args.replies} replies of {args.model} ({model_bytes / 1e6:.2f} MB "
        "float32 each; "
        f"FedVeca's also carry the gradient); best of {args.repeats} interleaved repeats"
    )
    print(
        f"{'strategy':<14} {'seconds':>8} {'vs Flower FedAvg':>17} "
        f"{'peak extra memory (model sizes)':>32}"
    )
    for name in contenders:
        print(
            f"{name:<14} {min(times[name]):>8.3f} {min(times[name]) / flower:>17.2f} "
            f"{peaks[name]:>32.2f}"
        )
    print(f"FedVeca aggregation = {min(times['FedVeca']) / flower:.2f}x Flower's FedAvg "
          f"(target <= 1.5), {peaks['FedVeca']:.2f} model sizes (target <= 4)")
