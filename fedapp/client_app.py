"""ClientApp: @train / @evaluate / @query: task's model, data and optimiser in the one
local-SGD loop of ``strategies.client``.

Each strategy's client work is found from the train message itself
(:func:`strategies.client.sides.client_sides`: the client sides the registered strategies
name, matched by the keys their contracts send): a client side with a local training of its
own runs it (FedVeca's tau steps, a DynamicFL chunk, FjORD's ordered dropout); the others
ride on the one loop, ``strategies.client.local_sgd``, on the optimiser the task builds from
the message (:func:`task.train.sgd_optimizer`): step hooks (FedProx's proximal term,
SCAFFOLD's correction, FedDyn's regulariser), a loss term (MOON) or a loss (FedLC), and the
reply they build (client state in ``context.state``). No strategy has a branch here. A
message with ``model-width`` (HeteroFL, FedRolex, FjORD) gets the model built at that width
holding the received sub-model (``load_width_state``); the query is answered by
``client_info_reply``.

Each node finds its data by ``partition-id`` / ``num-partitions`` in its node config
(simulation sets both; a deployed SuperNode names them in ``--node-config``, and
optionally ``data-dir``, ``data-cache-dir`` and ``num-threads``: docs/deployment.md).
The partition comes from the node's on-disk data cache (:mod:`task.node_data`), once per
process.

A deployed SuperNode starts a new process for every message, so this module imports
only flwr, numpy, ``strategies`` and the torch-free part of the task (run-config check,
data cache); torch, the models and the local solver are imported by the handlers that
need them: a client-info query whose partition is cached imports no torch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import contract as C
from strategies.client import (
    client_info_reply,
    client_seed,
    is_width_message,
    label_counts,
    load_width_state,
    local_sgd,
    sent_scaler,
    packed_clients,
    sent_width,
)
from strategies.client.sides import TrainTask, client_sides, model_content, training_metrics
from strategies.engine.registry import registered
from task.data import PartitionSpec
from task.node_data import PARTITIONS_KEPT, Partition, load_partition

from .config import ConfigError, RunConfig
from .faults import apply_fault

if TYPE_CHECKING:  # annotations only: the handlers import torch when they run
    import torch

# node-config keys of this ClientApp (besides partition-id / num-partitions)
DATA_DIR = "data-dir"  # absolute dataset folder on this node (default: the run config's)
DATA_CACHE_DIR = "data-cache-dir"  # absolute folder of the on-disk data cache
NUM_THREADS = "num-threads"  # torch intra-op threads of this node's ClientApp

def vectorised_share(clients: list[tuple[int, Message, Context]]) -> dict:
    """Packed mode's train share, trained together where ``vectorised-clients`` is on
    (:func:`fedapp.vectorised_share.train_share`)."""
    from .vectorised_share import train_share  # noqa: PLC0415 - torch, and it imports this module

    return train_share(clients)


# packed mode: a share of virtual clients per call, its train work vectorised where asked
app = ClientApp(mods=[packed_clients(vectorised_share)])


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    return RunConfig.from_user_config(dict(items))


def run_config(context: Context) -> RunConfig:
    """The validated run config (parsed once per distinct config)."""
    return _config(tuple(sorted(context.run_config.items())))


def node_error(key: str, value: object, allowed: str, example: str) -> ConfigError:
    """A bad node-config value: names the key, the value, what is allowed and the fix."""
    return ConfigError(
        f"node config {key}={value!r} is not allowed: it must be {allowed}. Start the "
        f"SuperNode with --node-config '{example}' (docs/deployment.md, node-config keys)"
    )


def partition_of(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config, with a clear error."""
    node = context.node_config
    for key in ("partition-id", "num-partitions"):
        if key not in node:
            raise ConfigError(
                f"node config has no '{key}'; start the SuperNode with "
                "--node-config \"partition-id=0 num-partitions=2\""
            )
    return int(node["partition-id"]), int(node["num-partitions"])


def node_folder(context: Context, key: str, default: str) -> str:
    """An absolute folder named by node-config ``key`` ("" or absent: ``default``)."""
    value = context.node_config.get(key, "")
    if value == "":
        return default
    if not isinstance(value, str) or not Path(value).is_absolute():
        raise node_error(key, value, "an absolute folder on this node's host",
                         f'{key}="/abs/folder"')
    if key == DATA_DIR and not Path(value).is_dir():
        raise node_error(key, value, "an existing folder on this node's host (it is not "
                         "there: the node's data is missing)", f'{key}="/abs/folder"')
    return value


def num_threads(context: Context) -> int | None:
    """``num-threads`` from the node config (None when unset); a clear error when bad."""
    value = context.node_config.get(NUM_THREADS)
    if value is None:
        return None
    threads = value if isinstance(value, int) and not isinstance(value, bool) else 0
    if isinstance(value, str) and value.strip().isdigit():
        threads = int(value)
    if threads < 1:
        raise node_error(NUM_THREADS, value, "an integer >= 1 (or left out for torch's "
                         "default: every core)", f"{NUM_THREADS}=1")
    return threads


def apply_threads(context: Context) -> None:
    """Set torch's intra-op threads from ``num-threads`` before any work (no-op when unset:
    a simulation's Ray actor keeps what Ray gave it)."""
    threads = num_threads(context)
    if threads is not None:
        import torch  # noqa: PLC0415

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def node_partition(context: Context) -> tuple[Partition, RunConfig]:
    """This node's partition (numpy, from the node's data cache) and the run config."""
    cfg = run_config(context)
    partition_id, num_partitions = partition_of(context)
    source = cfg.data_source(node_folder(context, DATA_DIR, cfg.data_dir))  # less validation
    spec = PartitionSpec(
        scheme=cfg.partition, seed=cfg.partition_data_seed, alpha=cfg.dirichlet_alpha,
        min_size=cfg.min_partition_size, classes_per_partition=cfg.classes_per_partition,
        shards_per_partition=cfg.shards_per_partition, sigma=cfg.quantity_sigma,
    )
    cache_dir = node_folder(context, DATA_CACHE_DIR, "")
    return load_partition(source, spec, partition_id, num_partitions, cache_dir), cfg


def local_data(context: Context) -> tuple[torch.Tensor, torch.Tensor, Partition, RunConfig]:
    """This node's (x, y) as tensors on the training device, its partition and the config."""
    from task.train import resolve_device  # noqa: PLC0415 - torch

    part, cfg = node_partition(context)
    x, y = _on_device(part, str(resolve_device(cfg.device)))
    return x, y, part, cfg


@functools.lru_cache(maxsize=PARTITIONS_KEPT)
def _on_device(part: Partition, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    import torch  # noqa: PLC0415

    return torch.from_numpy(part.x).to(device), torch.from_numpy(part.y).to(device)


def clear_caches() -> None:
    """Forget this process's on-device copies of the partitions (after the data changed)."""
    _on_device.cache_clear()


@functools.lru_cache(maxsize=8)
def task_model(name: str, input_shape: tuple, num_classes: int, device: str, width: float = 1.0,
           scaler: bool = False) -> torch.nn.Module:
    """One model object per process and width; every call loads the received weights into
    it. On the CPU a convolutional model keeps channels-last weights
    (:func:`task.layout.training_layout`); the process keeps one SGD step's memory for the
    next (:func:`task.heap.keep_step_memory`). ``width`` / ``scaler``: ``build_model``'s
    (HeteroFL, FjORD, FedRolex; 1.0 / False: the full model)."""
    from task.heap import keep_step_memory  # noqa: PLC0415
    from task.layout import training_layout  # noqa: PLC0415
    from task.models import build_model  # noqa: PLC0415

    keep_step_memory()
    model = build_model(name, input_shape, num_classes, width=width, scaler=scaler)
    return training_layout(model.to(device), input_shape)


def model_device(cfg: RunConfig) -> str:
    """The training device's name, as :func:`_model` caches it."""
    from task.train import resolve_device  # noqa: PLC0415

    return str(resolve_device(cfg.device))


def received_model(msg: Message, cfg: RunConfig, part: Partition) -> torch.nn.Module:
    """The process's model for this config, holding the received weights; for a message
    with ``model-width`` r the model built at r (and ``width-scaler``), loaded strictly
    (:func:`strategies.client.load_width_state`: a clear error for a wrong shape)."""
    width, scaler = cfg.model_width, False  # model-width: every client's model (FedAvg at r)
    if is_width_message(msg):
        config = msg.content[C.CONFIG]
        width, scaler = sent_width(config), sent_scaler(config)
    model = task_model(cfg.model, part.input_shape, part.num_classes, model_device(cfg), width,
                   scaler)
    state = received_state(msg.content[C.ARRAYS])
    if is_width_message(msg):
        return load_width_state(model, state, width)
    model.load_state_dict(state)
    return model


_RECEIVED: list = [(), None]  # (the last received arrays' bytes objects, their tensors)


def received_state(record) -> dict[str, torch.Tensor]:
    """The received weights as tensors, converted once per received content: the virtual
    clients of a packed share all get the one global model (one object after Flower
    inflates the message), so all but the first reuse the tensors. The cache is keyed by the
    arrays' immutable bytes objects themselves (held by it), so a changed record converts
    again."""
    key = tuple((name, array.data) for name, array in record.items())
    cached, state = _RECEIVED
    if len(cached) == len(key) and all(a[0] == b[0] and a[1] is b[1]
                                       for a, b in zip(cached, key)):
        return state
    state = record.to_torch_state_dict()
    _RECEIVED[:] = [key, state]
    return state


def _epochs(value: object) -> int | float:
    """``local-epochs`` as sent: an int for whole epochs, a float for a fraction of one."""
    value = float(value)
    return int(value) if value.is_integer() else value


CLIENT_SIDE_MODULES = tuple(dict.fromkeys(
    r.client_side for r in registered().values() if r.client_side))
"""The ``strategies.client`` modules of the registered strategies' client sides."""


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training on this node's partition, as the message's strategy asks (module
    docstring); replies the model and the statistics."""
    x, y, part, cfg, seed, partition_id = train_inputs(msg, context)
    model = received_model(msg, cfg, part)
    if len(y) == 0:  # an empty partition: 0 examples; the server skips the reply (one log line)
        empty = MetricRecord({C.NUM_EXAMPLES: 0, C.PARTITION_ID: partition_id})
        content = RecordDict({C.ARRAYS: msg.content[C.ARRAYS], C.METRICS: empty})
        return Message(content, reply_to=msg)
    task = train_task(msg, context, model, x, y, part, cfg, seed, partition_id)
    sides = client_sides(msg, CLIENT_SIDE_MODULES)
    own = [side for side in sides if side.train is not None]
    if own:  # a client side with a local training of its own
        return Message(own[0].train(task), reply_to=msg)
    optimizer = task.optimizer()
    hooks = [side.hook(task) for side in sides]  # state-keeping sides read context.state
    for hook in hooks:
        if hasattr(hook, "wrap"):
            hook.wrap(optimizer, model)
    forward = next((h.forward for h in hooks if hasattr(h, "forward")), None)
    loss_fn = next((h.loss_fn for h in hooks if hasattr(h, "loss_fn")), None)
    result = local_sgd(model, x, y, optimizer=optimizer, batch_size=task.batch_size,
                       epochs=task.epochs, steps=task.steps, seed=seed, forward=forward,
                       loss_fn=loss_fn)
    metrics = training_metrics(result, partition_id)
    finisher = next((h for h in hooks if hasattr(h, "finish")), None)
    if finisher is not None:  # the client side keeps its state, builds the reply
        return Message(finisher.finish(model, metrics), reply_to=msg)
    return Message(model_content(model, metrics), reply_to=msg)


def train_inputs(msg: Message, context: Context
                 ) -> tuple[torch.Tensor, torch.Tensor, Partition, RunConfig, int, int]:
    """A train call's local data (x, y on the training device), partition, run config,
    batch-order seed and partition id, after the injected fault, if any (``fault-*-prob``,
    docs/reliability.md: it raises)."""
    apply_threads(context)
    x, y, part, cfg = local_data(context)
    config = msg.content[C.CONFIG]
    partition_id, _ = partition_of(context)
    server_round = int(config.get(C.SERVER_ROUND, 0))
    # an asynchronous task draws its own batches: several may fall in one round
    batches = int(config.get(C.ASYNC_TASK, server_round))
    seed = client_seed(int(config.get(C.SEED, cfg.seed)), batches, partition_id)
    apply_fault(int(config.get(C.SEED, cfg.seed)), server_round, partition_id,
                cfg.fault_crash_prob, cfg.fault_late_prob, cfg.round_timeout,
                packed=bool(context.node_config.get(C.VIRTUAL_CLIENT)))
    return x, y, part, cfg, seed, partition_id


def train_task(msg: Message, context: Context, model: torch.nn.Module, x: torch.Tensor,
               y: torch.Tensor, part: Partition, cfg: RunConfig, seed: int,
               partition_id: int) -> TrainTask:
    """What a strategy's client side gets: the message's local work, the run config's where
    the message sends none, the task's optimiser and model builder."""
    config = msg.content[C.CONFIG]
    scaler, device = sent_scaler(config) if is_width_message(msg) else False, model_device(cfg)

    def build(width: float) -> torch.nn.Module:
        return task_model(cfg.model, part.input_shape, part.num_classes, device, width, scaler)

    return TrainTask(
        msg=msg, state=context.state, model=model, x=x, y=y,
        optimizer=lambda: app_optimizer(model, config, cfg),
        batch_size=int(config.get(C.BATCH_SIZE, cfg.batch_size)),
        epochs=_epochs(config.get(C.LOCAL_EPOCHS, cfg.local_epochs)),
        steps=int(config.get(C.LOCAL_STEPS, cfg.local_steps)), seed=seed,
        run_seed=cfg.seed, partition_id=partition_id,
        lr=float(config.get(C.LR, cfg.lr)),
        momentum=float(config.get(C.MOMENTUM, cfg.momentum)),
        weight_decay=float(config.get(C.WEIGHT_DECAY, cfg.weight_decay)), build=build)


def app_optimizer(model: torch.nn.Module, config: object, cfg: RunConfig) -> torch.optim.SGD:
    """The task's SGD with the train config's lr / momentum / weight-decay (the run config's
    where the message has none): the optimiser the helpers wrap."""
    from task.train import sgd_optimizer  # noqa: PLC0415 - torch

    return sgd_optimizer(model, config, lr=cfg.lr, momentum=cfg.momentum,
                         weight_decay=cfg.weight_decay)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this node's training partition."""
    from task.evaluate import evaluate  # noqa: PLC0415

    apply_threads(context)
    x, y, part, cfg = local_data(context)
    model = received_model(msg, cfg, part)
    result = evaluate(model, x, y, cfg.eval_batch_size)
    metrics = MetricRecord({
        C.NUM_EXAMPLES: result.num_examples,
        C.EVAL_LOSS: result.loss,
        C.EVAL_ACCURACY: result.accuracy,
    })
    return Message(RecordDict({C.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Client facts the server samples and weights by: partition id, size, label counts."""
    part, _ = node_partition(context)  # numpy: no torch for a cached partition
    partition_id, _ = partition_of(context)
    budget = context.node_config.get(C.COMM_BUDGET)  # DynamicFL: bytes per round this node can move
    return client_info_reply(msg, partition_id=partition_id, num_examples=len(part.y),
                             label_counts=label_counts(part.y, part.num_classes),
                             comm_budget=None if budget is None else float(budget))
