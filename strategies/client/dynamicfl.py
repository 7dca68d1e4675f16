"""DynamicFL's client side: local SGD resumable by (round, start-step, num-steps).

A DynamicFL round (Le et al., Alg. 1; :class:`strategies.DynamicFL`) cuts each client's
L local steps into chunks [s, s + k) that arrive as separate train messages. Two things
make a chunked round equal to one uninterrupted L-step run, bit for bit:

* the **batch stream** is a pure function of (seed, round, partition): concatenated
  reshuffled passes over the local data cut into minibatches of B; step l uses batch l
  whatever the chunking (:func:`strategies.client.batches.batch_stream`);
* the **optimizer momentum** is carried from one chunk to the next in ``Context.state``
  (:mod:`strategies.client.state`), reset at the first chunk of a new round unless
  ``keep_momentum_across_rounds`` (the official code's behaviour).

:func:`train_chunk` is the helper a ClientApp calls on a DynamicFL train message;
:func:`chunk_steps` is the same SGD on tensors with the momentum passed in and out.

Optimiser settings, each taken from the first place that has it:

1. the train config the strategy sends (``lr``, ``batch-size``, ``momentum``,
   ``weight-decay``, ``seed``; DynamicFL always sends ``lr``);
2. the keyword arguments of :func:`train_chunk`;
3. for B, the DataLoader's ``batch_size`` when ``data`` is one;
4. the paper's settings (Le et al., Table of hyper-parameters): B = 10, eta = 0.01,
   momentum 0.9, weight decay 5e-4 (logged once per process when used).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict

from .. import contract as C
from ..records import to_record
from .batches import batch_stream, client_seed
from .data import loader_batch_size, tensors_for
from .state import load_arrays, load_meta, save_arrays

log = logging.getLogger(__name__)

MOMENTUM_STATE = "dynamicfl-momentum"  # Context.state ArrayRecord: momentum buffer per parameter
MOMENTUM_META = MOMENTUM_STATE + "-meta"  # its ConfigRecord: round and next step of the buffers

# Le et al., hyper-parameter table ("Shared parameter"): used when nobody else says.
PAPER_DEFAULTS = {C.BATCH_SIZE: 10, C.LR: 0.01, C.MOMENTUM: 0.9, C.WEIGHT_DECAY: 5e-4}
_announced: set[str] = set()


def is_dynamicfl_chunk(config: Mapping) -> bool:
    """True when a train message's config is a DynamicFL chunk (it carries ``start-step``)."""
    return C.START_STEP in config


@dataclass(frozen=True)
class ChunkResult:
    """One chunk's outcome; ``momentum`` is what to pass as ``momentum_state`` next time."""

    num_examples: int
    local_steps: int
    train_loss: float
    momentum: dict[str, Any]


def chunk_steps(
    model: Any,
    x: Any,
    y: Any,
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
    momentum_state: Mapping[str, Any] | None = None,
) -> ChunkResult:
    """Steps [start_step, start_step + num_steps) of the round's batch stream, in place.

    ``seed`` is the client's stream seed for this round (``client_seed(seed, round, pid)``);
    ``round_steps`` (L) only sizes the cached stream (0: just long enough for this chunk).
    ``momentum_state`` (parameter name -> buffer) continues the previous chunk's momentum;
    None or empty starts from zero, as ``torch.optim.SGD`` does. Data and model must be on
    the same device. Returns the mean minibatch loss over the chunk and the new buffers (CPU).
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)
    import torch.nn.functional as F  # noqa: PLC0415, N812

    n = len(y)
    if n == 0:
        raise ValueError("this client has no training data; a DynamicFL client needs at least "
                         "one example")
    if start_step < 0 or num_steps < 1:
        raise ValueError(f"need start-step >= 0 and num-steps >= 1, got {start_step}, {num_steps}")
    length = max(int(round_steps), start_step + num_steps)
    rows = batch_stream(n, int(batch_size), length, int(seed))[start_step:start_step + num_steps]
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=lr, momentum=momentum,
                                weight_decay=weight_decay, nesterov=nesterov and momentum > 0)
    if momentum > 0 and momentum_state:
        for name, p in named:
            if name in momentum_state:
                buf = torch.as_tensor(momentum_state[name])
                optimizer.state[p]["momentum_buffer"] = buf.to(p.device, p.dtype).clone()
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
    return ChunkResult(num_examples=n, local_steps=num_steps,
                       train_loss=float(loss_sum) / num_steps, momentum=buffers)


def load_momentum(state: RecordDict, server_round: int, start_step: int,
                  keep_across_rounds: bool = False) -> dict[str, np.ndarray] | None:
    """The momentum buffers to continue with, from ``Context.state`` (None: start from zero).

    Within a round the stored buffers must end where this chunk starts; at step 0 of a new
    round they are dropped unless ``keep_across_rounds``. A chunk that finds no (or stale)
    buffers mid-round, e.g. after a node restart, starts from zero with a warning.
    """
    buffers, meta = load_arrays(state, MOMENTUM_STATE), load_meta(state, MOMENTUM_STATE)
    if buffers is None or meta is None:
        if start_step > 0:
            log.warning("DynamicFL chunk at step %d of round %d found no momentum in "
                        "Context.state; starting from zero momentum", start_step, server_round)
        return None
    same_round = int(meta["round"]) == server_round and int(meta["next-step"]) == start_step
    if start_step == 0 and not same_round:
        if not keep_across_rounds:
            return None
    elif not same_round:
        log.warning("DynamicFL chunk at step %d of round %d: stored momentum is from round %s "
                    "step %s; starting from zero momentum", start_step, server_round,
                    meta["round"], meta["next-step"])
        return None
    return buffers


def save_momentum(state: RecordDict, buffers: Mapping[str, Any], server_round: int,
                  next_step: int) -> None:
    """Store the buffers in ``Context.state`` (no buffers: forget the stored ones)."""
    save_arrays(state, MOMENTUM_STATE, buffers,
                meta={"round": int(server_round), "next-step": int(next_step)})


def _setting(config: Mapping, key: str, given: Any, fallback: Any = None) -> Any:
    """The config's value, else the caller's, else ``fallback``, else the paper's (announced)."""
    if key in config:
        return config[key]
    if given is not None:
        return given
    if fallback is not None:
        return fallback
    if key not in _announced:
        _announced.add(key)
        log.info("DynamicFL client: no '%s' in the train config or the call; using the paper's "
                 "%s = %s (Le et al.)", key, key, PAPER_DEFAULTS[key])
    return PAPER_DEFAULTS[key]


def train_chunk(
    model: Any,
    data: Any,
    config: Mapping,
    state: RecordDict,
    *,
    partition_id: int,
    lr: float | None = None,
    batch_size: int | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    seed: int | None = None,
    nesterov: bool = False,
    clip_norm: float | None = None,
    keep_momentum_across_rounds: bool = False,
) -> RecordDict:
    """Train one DynamicFL chunk as a train message asks; momentum kept in ``state``.

    Parameters
    ----------
    model
        A torch ``nn.Module`` holding the received model; trained in place.
    data
        The local training set: ``(x, y)`` tensors or a DataLoader
        (:func:`strategies.client.data.as_tensors`), moved to the model's device. Every
        chunk must see the same examples in the same order: convert once and keep it.
    config
        The message's ConfigRecord: ``server-round``, ``start-step``, ``num-steps``,
        ``round-steps`` and whatever optimiser keys the strategy sends.
    state
        ``context.state``: the momentum buffers between chunks.
    partition_id
        ``context.node_config["partition-id"]``: with ``seed`` and the round, it fixes
        the batch stream; also sent back as ``partition-id``.
    lr, batch_size, momentum, weight_decay, seed
        Used when the config does not carry the key (see the module docstring for the
        full order: config, these, the DataLoader's batch size, the paper's values;
        the seed falls back to 0).
    nesterov, clip_norm, keep_momentum_across_rounds
        Optimiser variants; defaults as ``torch.optim.SGD`` and the paper.

    Returns
    -------
    RecordDict
        ``"arrays"`` (the model after the chunk) and ``"metrics"`` with ``num-examples``
        (|D_m|, the aggregation weight), ``train-loss``, ``local-steps`` and
        ``partition-id``. Reply with ``Message(content, reply_to=msg)``.
    """
    if not is_dynamicfl_chunk(config):
        raise ValueError(f"a DynamicFL chunk config carries '{C.START_STEP}'; this one has "
                         f"{sorted(config)}: is the server a strategies.DynamicFL?")
    x, y = tensors_for(model, data)
    server_round = int(config.get(C.SERVER_ROUND, 0))
    start = int(config[C.START_STEP])
    steps = int(config.get(C.NUM_STEPS, config.get(C.LOCAL_STEPS, 1)))
    rho = float(_setting(config, C.MOMENTUM, momentum))
    buffers = load_momentum(state, server_round, start, keep_momentum_across_rounds) \
        if rho > 0 else None
    run_seed = int(config.get(C.SEED, 0 if seed is None else seed))
    result = chunk_steps(
        model, x, y,
        lr=float(_setting(config, C.LR, lr)),
        batch_size=int(_setting(config, C.BATCH_SIZE, batch_size, loader_batch_size(data))),
        start_step=start, num_steps=steps,
        round_steps=int(config.get(C.ROUND_STEPS, 0)),
        seed=client_seed(run_seed, server_round, int(partition_id)),
        momentum=rho, weight_decay=float(_setting(config, C.WEIGHT_DECAY, weight_decay)),
        nesterov=nesterov, clip_norm=clip_norm, momentum_state=buffers,
    )
    save_momentum(state, result.momentum, server_round, start + steps)
    metrics = MetricRecord({
        C.NUM_EXAMPLES: result.num_examples,
        C.TRAIN_LOSS: result.train_loss,
        C.LOCAL_STEPS_TAKEN: result.local_steps,
        C.PARTITION_ID: int(partition_id),
    })
    arrays = to_record({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    return RecordDict({C.ARRAYS: arrays, C.METRICS: metrics})
