"""Vectorised packed mode in the app's ClientApp: a share's virtual clients trained together.

With ``vectorised-clients = "on"`` the packing mod (:func:`strategies.client.packed_clients`)
hands a packed train message's virtual clients to :func:`train_share` first. A client whose
local work is plain local SGD (FedAvg and every strategy without a client side; FedProx's
proximal term) joins the group of the clients with the same model, effective batch size
(B, or n where n < B), lr, momentum, weight decay and mu; each group of two or more trains
in one batched computation (:func:`strategies.client.vectorised_sgd.vectorised_sgd`): the
received model is stacked on the device once per group, the replies are copied out in one
transfer per tensor. Everything else goes to the app's own ``train`` handler one by one,
as in sequential packed mode: a group of one (batching one client only costs), a client with
other client work (SCAFFOLD, FedDyn, MOON, FedLC, FedVeca, DynamicFL), a sub-model width
(HeteroFL, FjORD, FedRolex), an empty partition. The ClientApp logs each reason once.

``vectorised-clients = "auto"`` trains a group together only where that is faster here:
the first time the process meets a model, width, device and batch size, it times one
batched step of up to :data:`PROBE_CLIENTS` clients against the same steps one client at a
time, and where batching wins clearly, again with up to :data:`CONFIRM_CLIENTS` clients
(:func:`batched_is_faster`, on copies: nothing is trained; the fastest of three repeats),
keeps the answer and logs both times; once it says "one by one", the shares of
that model go straight to the handler. On this project's 2-core CPU a batched step of cnn-small (B = 32) cost 4.1-6.4 ms a
client against 2.9-3.5 ms in the loop, of mlp-2nn 0.81 against 1.31 ms.

Same data, seeds, batch order, fault injection and reply as the handler; the models match
within float32 rounding (tests/test_vectorised.py states the tolerance).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from logging import INFO, WARNING

import torch
from flwr.app import Context, Message
from flwr.common.logger import log

from strategies import contract as C
from strategies.client import batch_indices, is_width_message
from strategies.client.fedprox import add_proximal_term
from strategies.client.sgd_loop import LocalResult, step_count
from strategies.client.sides import TrainTask, arrays_content, client_sides, training_metrics
from strategies.client.vectorised_sgd import stacked, vectorised_sgd

from .client_app import (CLIENT_SIDE_MODULES, task_model, model_device, received_state, run_config,
                         train_inputs, train_task)

VECTORISED_SIDES = frozenset({"strategies.client.ProximalTerm"})
"""The client sides the vectorised loop runs (each through the function the loop's helper
calls)."""

PROBE_CLIENTS = 32  # clients of the batched step "auto" times first
PROBE_MARGIN = 0.8  # batched must take at most this share of the loop's time to be timed again
CONFIRM_CLIENTS = 256  # ... with up to this many clients, which decides
PROBE_REPEATS = 3  # timed repeats of each way; the fastest counts (robust to interference)
_LOGGED: set[str] = set()
_FASTER: dict[tuple, bool] = {}  # decision_key -> a batched step is faster here


@dataclass(frozen=True)
class VirtualClient:
    """One virtual client ready to train: its number in the share, message, task, tau_i,
    effective batch size and FedProx's mu (0: none)."""

    number: int
    msg: Message
    task: TrainTask
    steps: int
    batch: int
    mu: float
    model_name: str
    decision: tuple

    @property
    def group(self) -> tuple:
        """What clients trained together share."""
        t = self.task
        return (id(t.model), self.batch, t.lr, t.momentum, t.weight_decay, self.mu)


def sequential_because(why: str, level: int = INFO) -> None:
    """Log once per process why some virtual clients train one by one."""
    if why not in _LOGGED:
        _LOGGED.add(why)
        log(level, "vectorised-clients: %s train one by one (the per-client loop)", why)


def train_share(clients: list[tuple[int, Message, Context]]) -> dict[int, Message | BaseException]:
    """The outcomes of the share's virtual clients trained together (module docstring): a
    reply, or the exception the handler would have raised; the others are left out."""
    cfg = run_config(clients[0][2]) if clients else None
    mode = cfg.vectorised_clients if cfg is not None else "off"
    if mode == "off" or (mode == "auto" and _FASTER.get(decision_key(clients[0][1], cfg)) is False):
        return {}  # the handler one by one, without preparing anything twice
    outcomes: dict[int, Message | BaseException] = {}
    groups: dict[tuple, list[VirtualClient]] = defaultdict(list)
    for number, msg, context in clients:
        try:
            client = ready(number, msg, context)
        except Exception as exc:  # noqa: BLE001 - its error reply (an injected crash), as the handler's
            outcomes[number] = exc
            continue
        if client is not None:
            groups[client.group].append(client)
    for group in groups.values():
        if len(group) < 2:
            sequential_because("clients alone in their group (model, batch size, lr, "
                               "momentum, weight decay, mu)")
            continue
        if mode == "auto" and not batched_is_faster(group):
            continue
        try:
            outcomes.update(train_group(group))
        except Exception as exc:  # noqa: BLE001 - the per-client loop gives each its own outcome
            sequential_because(f"groups whose batched training failed "
                               f"({type(exc).__name__}: {exc})", level=WARNING)
    return outcomes


def decision_key(msg: Message, cfg) -> tuple:
    """What ``auto``'s measurement is kept for: the model, its width, the device and B."""
    batch = int(msg.content[C.CONFIG].get(C.BATCH_SIZE, cfg.batch_size))
    return (cfg.model, cfg.model_width, model_device(cfg), batch)


def ready(number: int, msg: Message, context: Context) -> VirtualClient | None:
    """The client's training inputs (the handler's, fault injection included: it raises),
    or None when it trains one by one."""
    x, y, part, cfg, seed, partition_id = train_inputs(msg, context)
    if len(y) == 0:
        return None
    if is_width_message(msg):
        sequential_because("sub-models (model-width: HeteroFL, FjORD, FedRolex)")
        return None
    sides = client_sides(msg, CLIENT_SIDE_MODULES)
    other = [side.name for side in sides if side.name not in VECTORISED_SIDES]
    if other:
        sequential_because(f"clients of {', '.join(other)}")
        return None
    model = task_model(cfg.model, part.input_shape, part.num_classes, model_device(cfg),
                   cfg.model_width)
    if any(True for _ in model.buffers()):
        sequential_because(f"clients of model {cfg.model} (it has buffers)")
        return None
    task = train_task(msg, context, model, x, y, part, cfg, seed, partition_id)
    steps = step_count(len(y), task.batch_size, task.epochs, task.steps)
    batch = task.batch_size if 0 < task.batch_size < len(y) else len(y)
    mu = float(msg.content[C.CONFIG][C.PROXIMAL_MU]) if sides else 0.0
    return VirtualClient(number, msg, task, steps, batch, mu, cfg.model, decision_key(msg, cfg))


def batched_is_faster(group: list[VirtualClient]) -> bool:
    """Whether the group trains faster batched than one by one here, decided once per process
    for its model, width, device and batch size, and logged. One batched step of the group's
    first :data:`PROBE_CLIENTS` clients is timed against their steps in the per-client loop;
    unless it takes at most :data:`PROBE_MARGIN` of the loop's time the answer is "one by
    one". Where it does and the group is larger, the same is timed with up to
    :data:`CONFIRM_CLIENTS` clients, which decides: a batched step's cost per client changes
    with the number of clients (cnn-small, B = 32, one thread on the 2-core CPU: 1.3x the
    loop at 8 clients, 1.2x at 32, 1.6x at 128, 2.2x at 500), so a small probe alone may
    answer "batched" for a share that is slower batched."""
    key = group[0].decision
    if key in _FASTER:
        return _FASTER[key]
    probe = group[:PROBE_CLIENTS]
    seconds = per_client_seconds(probe)
    faster = seconds["batched"] <= PROBE_MARGIN * seconds["loop"]
    if faster and len(group) > len(probe):
        probe = group[:CONFIRM_CLIENTS]
        seconds = per_client_seconds(probe)
        faster = seconds["batched"] < seconds["loop"]
    _FASTER[key] = faster
    log(INFO, "vectorised-clients=auto: a batched step of %d clients of %s (B = %d) on %s took "
        "%.2f ms a client, the per-client loop %.2f ms: %s", len(probe),
        group[0].model_name, group[0].batch, next(group[0].task.model.parameters()).device,
        1e3 * seconds["batched"], 1e3 * seconds["loop"],
        "trained together" if faster else "one by one")
    return faster


def per_client_seconds(probe: list[VirtualClient]) -> dict[str, float]:
    """Seconds per client of one SGD step of ``probe``'s clients, {"loop": one by one,
    "batched": together}: each way once untimed, then the fastest of :data:`PROBE_REPEATS`,
    on copies of the received model and data (nothing is trained)."""
    import copy  # noqa: PLC0415
    import time  # noqa: PLC0415

    from strategies.client import sgd_steps  # noqa: PLC0415

    first = probe[0].task
    device = next(first.model.parameters()).device
    model = copy.deepcopy(first.model)
    like = dict(model.named_parameters())
    states = [received_state(c.msg.content[C.ARRAYS]) for c in probe]
    batches = [(c.task.x[:c.batch], c.task.y[:c.batch]) for c in probe]

    def settle() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_by_one() -> None:
        for state, batch in zip(states, batches):
            model.load_state_dict({n: state[n] for n in like}, strict=False)
            sgd_steps(model, torch.optim.SGD(model.parameters(), lr=first.lr), [batch])

    def together() -> None:
        vectorised_sgd(model, stacked(states, like),
                       lambda step, active: (torch.stack([x for x, _ in batches[:active]]),
                                             torch.stack([y for _, y in batches[:active]])),
                       [1] * len(probe), lr=first.lr)

    seconds = {}
    for name, way in (("loop", one_by_one), ("batched", together)):
        way()  # untimed: the first call's one-time costs
        settle()
        times = []
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            way()
            settle()
            times.append(time.perf_counter() - start)
        seconds[name] = min(times) / len(probe)
    return seconds


def train_group(group: list[VirtualClient]) -> dict[int, Message]:
    """Train one group together; its replies by number."""
    group = sorted(group, key=lambda c: -c.steps)  # most steps first (stable)
    model = group[0].task.model
    like = dict(model.named_parameters())
    names = list(like)
    params = stacked([received_state(c.msg.content[C.ARRAYS]) for c in group], like)
    streams = [batch_indices(len(c.task.y), c.task.batch_size,
                             torch.Generator().manual_seed(c.task.seed)) for c in group]

    def batches(step: int, active: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = [next(streams[k]).to(group[k].task.x.device) for k in range(active)]
        return (torch.stack([group[k].task.x[i] for k, i in enumerate(idx)]),
                torch.stack([group[k].task.y[i] for k, i in enumerate(idx)]))

    mu = group[0].mu
    before_step = None
    if mu > 0:
        anchors = {name: p.clone() for name, p in params.items()}  # w^t of each client

        def before_step(grads: dict, views: dict, active: int) -> None:
            add_proximal_term([grads[n] for n in names], [views[n] for n in names],
                              [anchors[n][:active] for n in names], mu)

    task = group[0].task
    losses = vectorised_sgd(model, params, batches, [c.steps for c in group], lr=task.lr,
                            momentum=task.momentum, weight_decay=task.weight_decay,
                            before_step=before_step)
    trained = {name: tensor.cpu().numpy() for name, tensor in params.items()}  # one copy each
    replies = {}
    for k, c in enumerate(group):
        result = LocalResult(num_examples=len(c.task.y), local_steps=c.steps,
                             train_loss=losses[k])
        metrics = training_metrics(result, c.task.partition_id)
        replies[c.number] = Message(arrays_content({n: trained[n][k] for n in names}, metrics),
                                    reply_to=c.msg)
    return replies
