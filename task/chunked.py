"""DynamicFL's client side: local SGD resumable by (round, start-step, num-steps).

A DynamicFL round (Le et al., Alg. 1; ``strategies/dynamicfl.py``) cuts each client's L
local steps into chunks [s, s + k) that arrive as separate train messages. Two things make
a chunked round equal to one uninterrupted L-step run, bit for bit:

* the **batch stream** is a pure function of (seed, round, partition): the concatenation of
  reshuffled passes over the local data (``numpy.random.default_rng(client_seed(...))``,
  one permutation per pass), cut into minibatches of B; step l uses batch l whatever the
  chunking (:func:`batch_stream`);
* the **optimizer momentum** is carried from one chunk to the next in a state dict the
  caller keeps: :func:`train_chunk` takes and returns it; :func:`dynamicfl_train` keeps it in
  Flower's ``Context.state`` (an ArrayRecord), reset at the first chunk of a new round
  unless ``keep_momentum_across_rounds`` (the official code's behaviour).

:func:`dynamicfl_train` is the helper an existing PyTorch ClientApp calls; see
docs/dynamicfl.md section 5 for the few-line diff.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies import contract as C

from .train import client_seed

log = logging.getLogger(__name__)

MOMENTUM_STATE = "dynamicfl-momentum"  # Context.state ArrayRecord: momentum buffer per parameter name
MOMENTUM_META = "dynamicfl-momentum-meta"  # Context.state ConfigRecord: round and next step of the buffers


def is_dynamicfl_chunk(config: Mapping) -> bool:
    """True when a train message's config is a DynamicFL chunk (it carries ``start-step``)."""
    return C.START_STEP in config


@functools.lru_cache(maxsize=64)
def batch_stream(num_examples: int, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
    """The (num_steps, B) minibatch indices of one client's round.

    Concatenated reshuffled passes over ``range(num_examples)`` (one
    ``rng.permutation`` per pass, ``rng = default_rng(seed)``), cut into rows of B. The first
    k rows do not depend on ``num_steps``, so any chunk [s, s + k) can be cut from a stream of
    length >= s + k. ``batch_size`` 0 or >= n means full batch: every row is a fresh pass.
    Read-only (cached).
    """
    if num_examples <= 0 or num_steps < 0:
        raise ValueError(f"need num_examples > 0 and num_steps >= 0, got {num_examples}, {num_steps}")
    b = num_examples if batch_size <= 0 or batch_size >= num_examples else batch_size
    rng = np.random.default_rng(seed)
    need = num_steps * b
    passes = max(1, math.ceil(need / num_examples))
    stream = np.concatenate([rng.permutation(num_examples) for _ in range(passes)])[:need].reshape(num_steps, b)
    stream.setflags(write=False)
    return stream


@dataclass(frozen=True)
class ChunkResult:
    """One chunk's outcome; ``momentum`` is what to pass as ``momentum_state`` next time."""

    num_examples: int
    local_steps: int
    train_loss: float
    momentum: dict[str, torch.Tensor]


def train_chunk(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    batch_size: int,
    start_step: int,
    num_steps: int,
    seed: int,
    round_steps: int = 0,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    clip_norm: float | None = None,
    momentum_state: Mapping[str, torch.Tensor] | None = None,
) -> ChunkResult:
    """Steps [start_step, start_step + num_steps) of the round's batch stream, in place.

    ``seed`` is the client's stream seed for this round (``client_seed(seed, round, pid)``);
    ``round_steps`` (L) only sizes the cached stream (0: just long enough for this chunk).
    ``momentum_state`` (parameter name -> buffer) continues the previous chunk's momentum;
    None or empty starts from zero, as ``torch.optim.SGD`` does. Data and model must be on
    the same device. Returns the mean minibatch loss over the chunk and the new buffers (CPU).
    """
    n = len(y)
    if n == 0:
        raise ValueError("this client has no training data; a DynamicFL client needs at least one example")
    if start_step < 0 or num_steps < 1:
        raise ValueError(f"need start-step >= 0 and num-steps >= 1, got {start_step}, {num_steps}")
    length = max(int(round_steps), start_step + num_steps)
    rows = batch_stream(n, int(batch_size), length, int(seed))[start_step:start_step + num_steps]
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=lr, momentum=momentum, weight_decay=weight_decay,
                                nesterov=nesterov and momentum > 0)
    if momentum > 0 and momentum_state:
        for name, p in named:
            if name in momentum_state:
                optimizer.state[p]["momentum_buffer"] = momentum_state[name].to(p.device, p.dtype).clone()
    loss_fn = getattr(model, "loss", None) or F.cross_entropy
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    index = torch.from_numpy(np.array(rows, dtype=np.int64)).to(x.device)
    for row in index:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[row]), y[row])
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        loss_sum += loss.detach()
    buffers = {}
    if momentum > 0:
        for name, p in named:
            buf = optimizer.state[p].get("momentum_buffer")
            if buf is not None:
                buffers[name] = buf.detach().cpu().clone()
    return ChunkResult(num_examples=n, local_steps=num_steps, train_loss=float(loss_sum) / num_steps,
                       momentum=buffers)


def load_momentum(state: RecordDict, server_round: int, start_step: int,
                  keep_across_rounds: bool = False) -> dict[str, torch.Tensor] | None:
    """The momentum buffers to continue with, from ``Context.state`` (None: start from zero).

    Within a round the stored buffers must end where this chunk starts; at step 0 of a new
    round they are dropped unless ``keep_across_rounds``. A chunk that finds no (or stale)
    buffers mid-round, e.g. after a node restart, starts from zero with a warning.
    """
    if MOMENTUM_STATE not in state or MOMENTUM_META not in state:
        if start_step > 0:
            log.warning("DynamicFL chunk at step %d of round %d found no momentum in Context.state; "
                        "starting from zero momentum", start_step, server_round)
        return None
    meta = state[MOMENTUM_META]
    same_round = int(meta["round"]) == server_round and int(meta["next-step"]) == start_step
    if start_step == 0 and not same_round:
        if not keep_across_rounds:
            return None
    elif not same_round:
        log.warning("DynamicFL chunk at step %d of round %d: stored momentum is from round %s step %s; "
                    "starting from zero momentum", start_step, server_round, meta["round"], meta["next-step"])
        return None
    return state[MOMENTUM_STATE].to_torch_state_dict()


def save_momentum(state: RecordDict, buffers: Mapping[str, torch.Tensor], server_round: int, next_step: int) -> None:
    """Store the buffers in ``Context.state`` (ArrayRecord + a small ConfigRecord)."""
    if not buffers:
        for key in (MOMENTUM_STATE, MOMENTUM_META):
            if key in state:
                del state[key]
        return
    state[MOMENTUM_STATE] = ArrayRecord({k: v.detach().cpu() for k, v in buffers.items()})
    state[MOMENTUM_META] = ConfigRecord({"round": int(server_round), "next-step": int(next_step)})


def dynamicfl_train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: Mapping,
    state: RecordDict,
    *,
    partition_id: int,
    lr: float = 0.01,
    batch_size: int = 10,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    nesterov: bool = False,
    clip_norm: float | None = None,
    keep_momentum_across_rounds: bool = False,
) -> ChunkResult:
    """Train one DynamicFL chunk as a train message's ``config`` asks, momentum in ``state``.

    ``config`` is the message's ConfigRecord (``server-round``, ``start-step``,
    ``num-steps``, ``round-steps``, and ``lr`` / ``batch-size`` / ``momentum`` /
    ``weight-decay`` / ``seed`` when the server sends them; the keyword arguments are the
    fallbacks). ``state`` is ``context.state``. Reply with the trained model, ``num-examples``
    = ``result.num_examples`` (|D_m|, the aggregation weight) and ``train-loss``.
    """
    server_round = int(config.get(C.SERVER_ROUND, 0))
    start = int(config[C.START_STEP])
    steps = int(config.get(C.NUM_STEPS, config.get(C.LOCAL_STEPS, 1)))
    rho = float(config.get(C.MOMENTUM, momentum))
    buffers = load_momentum(state, server_round, start, keep_momentum_across_rounds) if rho > 0 else None
    result = train_chunk(
        model, x, y,
        lr=float(config.get(C.LR, lr)),
        batch_size=int(config.get(C.BATCH_SIZE, batch_size)),
        start_step=start, num_steps=steps,
        round_steps=int(config.get(C.ROUND_STEPS, 0)),
        seed=client_seed(int(config.get(C.SEED, seed)), server_round, partition_id),
        momentum=rho, weight_decay=float(config.get(C.WEIGHT_DECAY, weight_decay)),
        nesterov=nesterov, clip_norm=clip_norm, momentum_state=buffers,
    )
    save_momentum(state, result.momentum, server_round, start + steps)
    return result


def label_counts(y: torch.Tensor, num_classes: int) -> list[int]:
    """The label histogram a query reply sends as ``label-counts`` (DynaComm needs it)."""
    return [int(c) for c in torch.bincount(y.detach().cpu().long(), minlength=num_classes).tolist()]
