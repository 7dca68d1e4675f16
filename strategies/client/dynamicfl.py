"""DynamicFL's client side: local SGD resumable by (round, start-step, num-steps).

A DynamicFL round (Le et al., Alg. 1; :class:`strategies.DynamicFL`) cuts each client's
L local steps into chunks [s, s + k) that arrive as separate train messages. Two things
make a chunked round equal to one uninterrupted L-step run, bit for bit:

* the **batch stream** is a pure function of (seed, round, partition): concatenated
  reshuffled passes over the local data cut into minibatches of B; step l uses batch l
  whatever the chunking (:func:`strategies.client.batches.batch_stream`);
* the **optimiser state** (SGD's momentum buffers, Adam's moments, ...) is carried from
  one chunk to the next in ``Context.state``
  (:mod:`strategies.client.optimizer_state`), reset at the first chunk of a new round
  unless ``keep_momentum_across_rounds`` (the official code's behaviour).

The steps are those of the one local-SGD loop (:func:`strategies.client.sgd_steps`):
:func:`run_chunk` feeds it the chunk's rows of the stream with any optimiser;
:func:`train_chunk` is the helper a ClientApp calls on a DynamicFL train message (with
your own optimiser, or SGD as below); :func:`chunk_steps` is SGD on tensors with the
state passed in and out.

Without your optimiser, ``train_chunk`` builds ``torch.optim.SGD``, each setting taken
from the first place that has it:

1. the train config the strategy sends (``lr``, ``batch-size``, ``momentum``,
   ``weight-decay``, ``seed``; DynamicFL always sends ``lr``);
2. the keyword arguments of :func:`train_chunk`;
3. for B, the DataLoader's ``batch_size`` when ``data`` is one;
4. the paper's settings (Le et al., Table of hyper-parameters): B = 10, eta = 0.01,
   momentum 0.9, weight decay 5e-4 (logged once per process when used).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from .. import contract as C
from ..engine.records import sent_config, to_record
from .batches import batch_stream, client_seed
from .data import loader_batch_size, tensors_for
from .optimizer_state import load_optimizer_state, optimizer_state_arrays
from .sgd_loop import LocalResult, LossFn, plain_sgd, sgd_steps
from .state import load_arrays, load_meta, meta_key
from .sides import ClientSide, TrainTask, register_client_side

log = logging.getLogger(__name__)

# Context.state ArrayRecord: the optimiser's state after the last chunk (optimizer_state)
OPTIMIZER_STATE = "dynamicfl-optimizer-state"
OPTIMIZER_META = meta_key(OPTIMIZER_STATE)  # its ConfigRecord: round and next step
ROUND, NEXT_STEP, KIND = "round", "next-step", "optimizer"  # the meta's scalars

# Le et al., hyper-parameter table ("Shared parameter"): used when nobody else says.
PAPER_DEFAULTS = C.DYNAMICFL_PAPER_SGD
_announced: set[str] = set()


def is_dynamicfl_chunk(config: Mapping) -> bool:
    """True when a train message's config is a DynamicFL chunk (it carries ``start-step``)."""
    return C.START_STEP in config


@dataclass(frozen=True)
class ChunkResult:
    """One chunk's outcome; ``optimizer_state`` is what to pass as ``optimizer_state`` next
    time (:func:`strategies.client.optimizer_state.optimizer_state_arrays`)."""

    num_examples: int
    local_steps: int
    train_loss: float
    optimizer_state: dict[str, Any]


def chunk_batches(x: Any, y: Any, *, batch_size: int, start_step: int, num_steps: int,
                  seed: int, round_steps: int = 0) -> Iterator[tuple[Any, Any]]:
    """Minibatches [start_step, start_step + num_steps) of the round's stream on (x, y).

    ``seed`` is the client's stream seed for this round (``client_seed(seed, round, pid)``);
    ``round_steps`` (L) only sizes the cached stream (0: just long enough for this chunk).
    """
    import torch  # noqa: PLC0415  (lazy: strategies never needs torch at import)

    n = len(y)
    if n == 0:
        raise ValueError("this client has no training data; a DynamicFL client needs at least "
                         "one example")
    if start_step < 0 or num_steps < 1:
        raise ValueError(f"need start-step >= 0 and num-steps >= 1, got {start_step}, {num_steps}")
    length = max(int(round_steps), start_step + num_steps)
    rows = batch_stream(n, int(batch_size), length, int(seed))[start_step:start_step + num_steps]
    for row in torch.from_numpy(np.array(rows, dtype=np.int64)).to(x.device):
        yield x[row], y[row]


def run_chunk(model: Any, optimizer: Any, x: Any, y: Any, *, batch_size: int, start_step: int,
              num_steps: int, seed: int, round_steps: int = 0, clip_norm: float | None = None,
              loss_fn: LossFn | None = None) -> LocalResult:
    """The chunk's steps with ``optimizer`` (any, as given: its state is the caller's), in
    place; ``clip_norm`` clips the gradient norm before each step."""
    import torch  # noqa: PLC0415

    clip = None
    if clip_norm is not None:
        def clip(m: Any, _x: Any, _y: Any) -> None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip_norm)
    steps, loss = sgd_steps(
        model, optimizer,
        chunk_batches(x, y, batch_size=batch_size, start_step=start_step, num_steps=num_steps,
                      seed=seed, round_steps=round_steps),
        loss_fn=loss_fn, on_gradients=clip)
    return LocalResult(num_examples=len(y), local_steps=steps, train_loss=loss)


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
    optimizer_state: Mapping[str, Any] | None = None,
) -> ChunkResult:
    """Steps [start_step, start_step + num_steps) of the round's batch stream with SGD, in place.

    ``optimizer_state`` (from the previous chunk's :class:`ChunkResult`) continues its
    momentum; None or empty starts from zero, as ``torch.optim.SGD`` does. Data and model
    must be on the same device. Returns the mean minibatch loss over the chunk and the
    optimiser's state (CPU arrays).
    """
    optimizer = plain_sgd(model, lr, momentum, weight_decay, nesterov)
    if optimizer_state:
        load_optimizer_state(optimizer, model, optimizer_state)
    result = run_chunk(model, optimizer, x, y, batch_size=batch_size, start_step=start_step,
                       num_steps=num_steps, seed=seed, round_steps=round_steps,
                       clip_norm=clip_norm)
    return ChunkResult(num_examples=result.num_examples, local_steps=result.local_steps,
                       train_loss=result.train_loss,
                       optimizer_state=optimizer_state_arrays(optimizer, model))


def load_chunk_state(state: RecordDict, server_round: int, start_step: int, kind: str,
                     keep_across_rounds: bool = False) -> dict[str, np.ndarray] | None:
    """The optimiser state to continue with, from ``Context.state`` (None: start afresh).

    Within a round the stored state must end where this chunk starts and come from an
    optimiser of the same ``kind`` (class name); at step 0 of a new round it is dropped
    unless ``keep_across_rounds``. A chunk that finds no (or stale) state mid-round, e.g.
    after a node restart, starts afresh with a warning.
    """
    meta = load_meta(state, OPTIMIZER_STATE)
    arrays = load_arrays(state, OPTIMIZER_STATE) or {}
    if meta is None:
        if start_step > 0:
            log.warning("DynamicFL chunk at step %d of round %d found no optimizer state in "
                        "Context.state; starting from a fresh optimizer", start_step,
                        server_round)
        return None
    same_round = int(meta[ROUND]) == server_round and int(meta[NEXT_STEP]) == start_step
    if start_step == 0 and not same_round:
        if not keep_across_rounds:
            return None
    elif not same_round:
        log.warning("DynamicFL chunk at step %d of round %d: the stored optimizer state is "
                    "from round %s step %s; starting from a fresh optimizer", start_step,
                    server_round, meta[ROUND], meta[NEXT_STEP])
        return None
    if meta.get(KIND) != kind:
        log.warning("DynamicFL chunk at step %d of round %d: the stored optimizer state is a "
                    "%s's, this chunk runs a %s; starting from a fresh optimizer", start_step,
                    server_round, meta.get(KIND), kind)
        return None
    return arrays


def save_chunk_state(state: RecordDict, arrays: Mapping[str, Any], server_round: int,
                     next_step: int, kind: str) -> None:
    """Keep the optimiser's state (possibly none, e.g. plain SGD) and where it ends."""
    state[OPTIMIZER_STATE] = ArrayRecord(
        {name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})
    state[OPTIMIZER_META] = ConfigRecord({ROUND: int(server_round), NEXT_STEP: int(next_step),
                                          KIND: kind})


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
    optimizer: Any = None,
    metrics: Mapping[str, Any] | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    seed: int | None = None,
    nesterov: bool = False,
    clip_norm: float | None = None,
    keep_momentum_across_rounds: bool = False,
) -> RecordDict:
    """Train one DynamicFL chunk as a train message asks; optimiser state kept in ``state``.

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
        ``context.state``: the optimiser's state between chunks.
    partition_id
        ``context.node_config["partition-id"]``: with ``seed`` and the round, it fixes
        the batch stream; also sent back as ``partition-id``.
    optimizer
        Your own optimiser over ``model``'s parameters (momentum, Adam, weight decay, a
        fresh one per message is fine): it runs the chunk as you built it (build it with
        ``config["lr"]`` to follow the strategy's learning rate), its state continued from
        the previous chunk. None: ``torch.optim.SGD`` from the config and the keywords
        below (module docstring).
    metrics
        Your own metrics for the reply; the keys below are added to them.
    lr, batch_size, momentum, weight_decay, seed
        Used when the config does not carry the key (see the module docstring for the
        full order: config, these, the DataLoader's batch size, the paper's values;
        the seed falls back to 0). With ``optimizer``, only ``batch_size`` and ``seed``.
    nesterov, clip_norm, keep_momentum_across_rounds
        Optimiser variants; defaults as ``torch.optim.SGD`` and the paper
        (``keep_momentum_across_rounds`` carries any optimiser's state into the next round).

    Returns
    -------
    RecordDict
        ``"arrays"`` (the model after the chunk) and ``"metrics"``: ``metrics`` plus
        ``num-examples`` (|D_m|, the aggregation weight), ``train-loss``, ``local-steps``
        and ``partition-id``. Reply with ``Message(content, reply_to=msg)``.
    """
    if not is_dynamicfl_chunk(config):
        raise ValueError(f"a DynamicFL chunk config carries '{C.START_STEP}'; this one has "
                         f"{sorted(config)}: is the server a strategies.DynamicFL?")
    x, y = tensors_for(model, data)
    server_round = int(config.get(C.SERVER_ROUND, 0))
    start = int(config[C.START_STEP])
    steps = int(config.get(C.NUM_STEPS, config.get(C.LOCAL_STEPS, 1)))
    if optimizer is None:
        optimizer = plain_sgd(
            model, float(_setting(config, C.LR, lr)),
            float(_setting(config, C.MOMENTUM, momentum)),
            float(_setting(config, C.WEIGHT_DECAY, weight_decay)), nesterov)
    kind = type(optimizer).__name__
    carried = load_chunk_state(state, server_round, start, kind, keep_momentum_across_rounds)
    if carried:
        load_optimizer_state(optimizer, model, carried)
    run_seed = int(config.get(C.SEED, 0 if seed is None else seed))
    result = run_chunk(
        model, optimizer, x, y,
        batch_size=int(_setting(config, C.BATCH_SIZE, batch_size, loader_batch_size(data))),
        start_step=start, num_steps=steps, round_steps=int(config.get(C.ROUND_STEPS, 0)),
        seed=client_seed(run_seed, server_round, int(partition_id)), clip_norm=clip_norm,
    )
    save_chunk_state(state, optimizer_state_arrays(optimizer, model), server_round,
                     start + steps, kind)
    out = dict(metrics or {})
    out.update({
        C.NUM_EXAMPLES: result.num_examples,
        C.TRAIN_LOSS: result.train_loss,
        C.LOCAL_STEPS_TAKEN: result.local_steps,
        C.PARTITION_ID: int(partition_id),
    })
    arrays = to_record({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    return RecordDict({C.ARRAYS: arrays, C.METRICS: MetricRecord(out)})


def chunk_side(task: TrainTask) -> RecordDict:
    """DynamicFL's client side (Le et al., Alg. 1): one chunk of the round's batch stream
    with the ClientApp's optimiser; its momentum in ``Context.state``."""
    return train_chunk(task.model, (task.x, task.y), task.msg.content[C.CONFIG], task.state,
                       partition_id=task.partition_id, optimizer=task.optimizer(),
                       batch_size=task.batch_size, seed=task.run_seed)


register_client_side(ClientSide("strategies.client.train_chunk",
                                lambda msg: is_dynamicfl_chunk(sent_config(msg.content) or {}),
                                train=chunk_side))
