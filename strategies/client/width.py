"""The client side of the width-heterogeneous strategies: build the model at the sent
width, load the received sub-model, and FjORD's ordered-dropout local steps.

* HeteroFL (Diao, Ding and Tarokh, ICLR 2021), Sec. 3: a client of width r trains the
  model whose hidden layers keep the first ceil(r K) of their K units; the server sends
  exactly that sub-model (``model-width`` = r, ``width-scaler`` for its Scaler).
* FedRolex (Alam, Liu, Yan and Zhang, NeurIPS 2022), Sec. 3.2: the same client work; only
  the server's choice of units (a rolling window) differs, so the client sees a dense
  width-r sub-model just the same.
* FjORD (Horvath et al., NeurIPS 2021), Sec. 3, ordered dropout: for every local batch a
  width p is sampled uniformly from the discrete set of widths the client supports
  (``width-levels``, all <= r) and the step trains the left-most ceil(p K) units of every
  layer, the width-p prefix of the width-r model.

* HeteroFL's and FedRolex's label split (the authors' code: ``label_split`` and the
  "Masked CrossEntropy" of HeteroFL's models, on by default; FedRolex's models the same):
  a client trains with the cross-entropy whose logits of the labels absent from its
  training data are set to 0 (:func:`masked_cross_entropy`, ``out.masked_fill(label_mask ==
  0, 0)``), so the output rows of those labels get no gradient, and replies its labels as
  ``label-mask`` (:func:`label_mask`); the server averages each output row over the clients
  holding its label. :class:`LabelSplit` is both on the one local-SGD loop.

A width-scalable model keeps the FIRST ceil(p K) units of each hidden layer (e.g.
``task.models.build_model(..., width=p)``), so for p <= r every array of the width-p model
is a prefix, on every axis, of the width-r model's array: :func:`ordered_dropout_sgd` steps
the width-p model on a copy of that prefix and writes it back.

torch is imported inside the functions: ``import strategies.client`` needs no torch.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import Message, RecordDict

from .. import contract as C
from ..engine.records import sent_config
from .sgd_loop import LocalResult, epoch_batches, plain_sgd, sgd_steps, step_count
from .sides import ClientSide, TrainTask, model_content, register_client_side, training_metrics

__all__ = ["LabelSplit", "is_label_split_message", "is_width_message", "label_mask",
           "load_width_state", "masked_cross_entropy", "ordered_dropout_sgd", "sent_label_split",
           "sent_levels", "sent_scaler", "sent_width", "width_model"]

Build = Callable[[float], Any]  # width -> torch.nn.Module, the user's model at that width
LEVEL_STREAM = 0x0D  # the draw stream of ordered dropout: default_rng([seed, LEVEL_STREAM])
_NOISE = 1e-12  # widths this close count as equal (float noise of a sent list)


def is_width_message(msg: Message) -> bool:
    """True when a message's config carries ``model-width`` (HeteroFL, FjORD, FedRolex)."""
    return C.MODEL_WIDTH in (sent_config(msg.content) or {})


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def sent_width(config: Mapping) -> float:
    """The width r a message's config asks for (``model-width``; 1.0 when absent).

    Raises
    ------
    ValueError
        Unless r is a real number (not a bool) in (0, 1].
    """
    value = config.get(C.MODEL_WIDTH, 1.0)
    if not _is_real(value) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"config {C.MODEL_WIDTH}={value!r} is not a width: it must be a "
                         f"number in (0, 1] (e.g. 0.5 for half width); send the client's "
                         f"width r from the server")
    return float(value)


def sent_flag(config: Mapping, key: str) -> bool:
    """A bool the server sends in the train config (False when absent).

    Raises
    ------
    ValueError
        Unless the value is a bool, naming ``key``.
    """
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"config {key}={value!r} must be True or False; send a bool from "
                         f"the server")
    return value


def sent_scaler(config: Mapping) -> bool:
    """Whether HeteroFL's Scaler is on (``width-scaler``; False when absent; a ValueError
    unless a bool)."""
    return sent_flag(config, C.WIDTH_SCALER)


def sent_label_split(config: Mapping) -> bool:
    """Whether the server asks for HeteroFL's label split (``label-split``; False when
    absent; a ValueError unless a bool)."""
    return sent_flag(config, C.LABEL_SPLIT)


def is_label_split_message(msg: Message) -> bool:
    """True when a width message asks for the label split (``label-split`` = True)."""
    return is_width_message(msg) and sent_label_split(sent_config(msg.content) or {})


def label_mask(y: Any, num_classes: int) -> list[int]:
    """The client's labels as a mask: one entry per class, 1 for each label that occurs
    in ``y`` (its whole training data), else 0 (HeteroFL's ``label_split``:
    ``torch.unique(label[data_split[i]])``, as a 0/1 list). What the reply's
    ``label-mask`` carries.

    Raises
    ------
    ValueError
        When ``num_classes`` is not an int >= 1, or a label is outside [0, num_classes).
    """
    import torch  # noqa: PLC0415

    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} must be an int >= 1: the model's "
                         f"outputs")
    labels = torch.as_tensor(y).reshape(-1).long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"the labels run from {int(labels.min())} to {int(labels.max())}, "
                         f"outside [0, {num_classes}): give the model's number of outputs as "
                         f"num_classes")
    present = torch.bincount(labels, minlength=num_classes) > 0
    return [int(v) for v in present.tolist()]


def masked_cross_entropy(logits: Any, y: Any, mask: Sequence[int]) -> Any:
    """The mean cross-entropy at ``y`` of ``logits`` whose entries of the labels with
    ``mask`` 0 are replaced by 0: HeteroFL's masked loss as its code writes it
    (``out.masked_fill(label_mask == 0, 0)``, then ``F.cross_entropy``), so the output rows
    of those labels get no gradient.

    Raises
    ------
    ValueError
        When ``mask`` does not have one entry per logit.
    """
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    keep = torch.as_tensor(list(mask), device=logits.device) != 0
    if keep.ndim != 1 or keep.numel() != logits.shape[-1]:
        raise ValueError(f"mask has {keep.numel()} entries but the logits have "
                         f"{logits.shape[-1]} classes; give label_mask(y, "
                         f"{logits.shape[-1]})")
    return F.cross_entropy(logits.masked_fill(~keep, 0.0), y)


class LabelSplit:
    """HeteroFL's label split on the one local-SGD loop, for one train message: the loss
    is :func:`masked_cross_entropy` with the mask of ``labels`` (the client's whole
    training labels, :func:`label_mask` with the model's number of outputs, found at the
    first step), and :meth:`finish` adds that mask to the reply as ``label-mask``.

    Use it with your own loop (``hook.loss_fn(model(x), y)``) or with
    :func:`strategies.client.local_sgd` (``loss_fn=hook.loss_fn``), then reply
    ``hook.finish(model, metrics)``.
    """

    def __init__(self, msg: Message, labels: Any) -> None:
        if not is_label_split_message(msg):
            raise ValueError(f"not a label-split train message: its config has no "
                             f"'{C.LABEL_SPLIT}' = True beside '{C.MODEL_WIDTH}'")
        self.labels, self.mask = labels, None

    def loss_fn(self, logits: Any, y: Any) -> Any:
        """:func:`masked_cross_entropy` with this client's mask."""
        if self.mask is None:
            self.mask = label_mask(self.labels, int(logits.shape[-1]))
        return masked_cross_entropy(logits, y, self.mask)

    def finish(self, model: Any, metrics: Mapping[str, Any]) -> RecordDict:
        """The reply content: the trained model and ``metrics`` with ``label-mask``.

        Raises
        ------
        ValueError
            When no step ran (the mask needs the model's number of outputs).
        """
        if self.mask is None:
            raise ValueError("LabelSplit.finish: no local step ran through loss_fn, so the "
                             "label mask is unknown; train with loss_fn=hook.loss_fn")
        return model_content(model, {**metrics, C.LABEL_MASK: list(self.mask)})


def sent_levels(config: Mapping) -> tuple[float, ...] | None:
    """FjORD's ordered-dropout widths (``width-levels``), sorted ascending without
    duplicates; None when absent (HeteroFL, FedRolex).

    Raises
    ------
    ValueError
        Unless the value is a non-empty list of numbers in (0, r] that contains r (within
        1e-12), r = :func:`sent_width`.
    """
    if C.WIDTH_LEVELS not in config:
        return None
    width, value = sent_width(config), config[C.WIDTH_LEVELS]
    fix = (f"send a non-empty list of widths in (0, {C.MODEL_WIDTH}={width!r}] that "
           f"includes {width!r}, e.g. [{width / 2!r}, {width!r}]")
    if (not isinstance(value, (list, tuple)) or not value
            or not all(_is_real(p) and 0.0 < float(p) <= width + _NOISE for p in value)):
        raise ValueError(f"config {C.WIDTH_LEVELS}={value!r} is not allowed: {fix}")
    if not any(abs(float(p) - width) <= _NOISE for p in value):
        raise ValueError(f"config {C.WIDTH_LEVELS}={value!r} lacks the client's width "
                         f"{C.MODEL_WIDTH}={width!r}: {fix}")
    return _distinct(value, width)


def _distinct(levels: Sequence[float], width: float) -> tuple[float, ...]:
    """``levels`` as sorted distinct floats, those within 1e-12 of ``width`` set to it."""
    return tuple(sorted({width if abs(float(p) - width) <= _NOISE else float(p)
                         for p in levels}))


def load_width_state(model: Any, state: Mapping[str, Any], width: float) -> Any:
    """Load ``state`` (name -> tensor or array) into ``model`` built at ``width``, in place,
    on the model's device; returns the model.

    Raises
    ------
    ValueError
        When a key is missing or extra, or a shape differs from the model's (naming the
        key, both shapes and the width).
    """
    import torch  # noqa: PLC0415

    own = model.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise ValueError(f"the received arrays do not fit the model built at width "
                         f"r={width!r}: keys missing {missing}, unexpected {extra}; build "
                         f"your model at the sent width: build(r)")
    for key, tensor in own.items():
        received = tuple(state[key].shape)
        if received != tuple(tensor.shape):
            raise ValueError(f"received array {key!r} has shape {received} but the model "
                             f"built at width r={width!r} has {tuple(tensor.shape)}; build "
                             f"your model at the sent width: build(r)")
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
    return model


def width_model(build: Build, msg: Message) -> Any:
    """HeteroFL / FedRolex: ``build(r)`` at the sent width r (:func:`sent_width`), holding
    the received sub-model (:func:`load_width_state`: strict keys and shapes)."""
    config = sent_config(msg.content) or {}
    width = sent_width(config)
    state = msg.content[C.ARRAYS].to_torch_state_dict()
    return load_width_state(build(width), state, width)


def _level_models(model: Any, build: Build, levels: Sequence[float], width: float
                  ) -> list[Any]:
    """Per level: the model itself for p = r, else build(p) on the model's device, its
    shapes checked to be prefixes of the model's."""
    own = model.state_dict()
    device = next(iter(own.values())).device if own else None
    out = []
    for p in levels:
        if p == width:
            out.append(model)
            continue
        sub = build(p)
        if sub is model:
            raise ValueError(f"build({p!r}) returned the width-r model itself; return a "
                             f"separate model per width")
        sub = sub.to(device) if device is not None else sub
        shapes = {k: tuple(v.shape) for k, v in sub.state_dict().items()}
        if set(shapes) != set(own):
            raise ValueError(f"build({p!r}) has keys {sorted(shapes)} but the width-{width!r} "
                             f"model has {sorted(own)}; build every width from one model")
        for key, shape in shapes.items():
            big = tuple(own[key].shape)
            if len(shape) != len(big) or any(s > b for s, b in zip(shape, big)):
                raise ValueError(f"build({p!r})'s {key!r} has shape {shape}, not a prefix of "
                                 f"the width-{width!r} model's {big}; give widths p <= r of "
                                 f"a model that keeps the first units of each layer")
        out.append(sub)
    return out


def ordered_dropout_sgd(model: Any, build: Build, x: Any, y: Any, levels: Sequence[float], *,
                        batch_size: int, epochs: float = 1, steps: int = 0, seed: int = 0,
                        lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                        width: float | None = None) -> LocalResult:
    """FjORD's local training (Horvath et al., NeurIPS 2021, Sec. 3, ordered dropout), in
    place on the width-r ``model``: p sampled uniformly per batch from the discrete set
    ``levels``, one plain-SGD step of the width-p prefix.

    Parameters
    ----------
    model
        The model built at width r, holding the received sub-model.
    build
        ``build(p)``: the user's model at width p, keeping the first units of every layer
        (called once per level p < r per call; its arrays must fit inside the model's).
    x, y
        The local data, on the model's device.
    levels
        The widths p; drawn from their sorted distinct values. Every p <= r.
    batch_size, epochs, steps, seed
        As :func:`strategies.client.local_sgd`: the same number of steps (``steps`` > 0,
        else floor(E n / B)) and the same batches (``epoch_batches(x, y, B, steps, seed)``).
    lr, momentum, weight_decay
        :func:`plain_sgd`'s settings. One optimiser per level for the whole call, so the
        momentum buffers are per level (exact for momentum 0: the paper's plain SGD).
    width
        The model's width r (default: the largest level).

    Returns
    -------
    LocalResult
        n, the steps and the mean minibatch loss (float64 sum / steps); (0, 0, NaN) for
        empty data.

    Notes
    -----
    Step t trains width ``levels[i_t]`` (sorted distinct levels), where ``i_t`` is entry t
    of ``numpy.random.default_rng([seed, 0x0D]).integers(len(levels), size=steps)``. A
    step at p < r copies the prefix of every state_dict entry (parameters and buffers)
    into the width-p model, steps it with :func:`sgd_steps`, and writes it back into the
    prefix; entries outside the prefix are left unchanged.
    """
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if width is None:
        width = max((float(p) for p in levels), default=1.0)
    levels = _distinct(levels, float(width))
    if not levels or not all(0.0 < p <= width for p in levels):
        raise ValueError(f"levels={levels!r} must be a non-empty set of widths in (0, r] with "
                         f"r={width!r} the model's width")
    n = len(y)
    if n == 0:
        return LocalResult(num_examples=0, local_steps=0, train_loss=float("nan"))
    total = step_count(n, batch_size, epochs, steps)
    models = _level_models(model, build, levels, width)
    optimizers = [plain_sgd(m, lr, momentum, weight_decay) for m in models]
    full = model.state_dict()
    draws = np.random.default_rng([seed, LEVEL_STREAM]).integers(len(levels), size=total)
    loss_sum = 0.0
    for batch, level in zip(epoch_batches(x, y, batch_size, total, seed), draws):
        sub = models[level]
        if sub is model:
            loss_sum += sgd_steps(model, optimizers[level], [batch])[1]
            continue
        part = sub.state_dict()
        prefix = {k: tuple(slice(0, s) for s in v.shape) for k, v in part.items()}
        with torch.no_grad():
            for key, tensor in part.items():
                tensor.copy_(full[key][prefix[key]])
        loss_sum += sgd_steps(sub, optimizers[level], [batch])[1]
        with torch.no_grad():
            for key, tensor in part.items():
                full[key][prefix[key]].copy_(tensor)
    return LocalResult(num_examples=n, local_steps=total, train_loss=loss_sum / total)


def ordered_dropout_side(task: TrainTask) -> RecordDict:
    """FjORD's client side (Horvath et al., Sec. 3): each step trains the width-p prefix of
    the width-r model, p drawn uniformly from the sent levels (:func:`ordered_dropout_sgd`
    with the message's lr / momentum / weight decay); the reply as any local training's."""
    config = task.msg.content[C.CONFIG]
    result = ordered_dropout_sgd(
        task.model, task.build, task.x, task.y, sent_levels(config),
        batch_size=task.batch_size, epochs=task.epochs, steps=task.steps, seed=task.seed,
        lr=task.lr, momentum=task.momentum, weight_decay=task.weight_decay,
        width=sent_width(config))
    return model_content(task.model, training_metrics(result, task.partition_id))


register_client_side(ClientSide(
    "strategies.client.width.LabelSplit", is_label_split_message,
    hook=lambda task: LabelSplit(task.msg, task.y)))
register_client_side(ClientSide(
    "strategies.client.ordered_dropout_sgd",
    lambda msg: is_width_message(msg) and sent_levels(msg.content[C.CONFIG]) is not None,
    train=ordered_dropout_side))

