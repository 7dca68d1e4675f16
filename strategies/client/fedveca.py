"""FedVeca's client procedure (Luo et al., arXiv 2209.13803, Algorithm 2) for any PyTorch model.

:func:`fedveca_train` is what a ClientApp calls on a FedVeca train message: it runs the
tau_(k,i) plain-SGD steps the server asked for (eq. 1) from the received model w_k and
returns the reply content a FedVeca server needs:

* ``"arrays"``: the local model after tau steps (the server turns it into G_(k,i), eq. 5);
* ``"grad"``: h_i = grad F_i(w_k), the mean-loss gradient at the received model over the
  local training set (Alg. 2 line 9; optionally over a random subsample);
* metrics ``beta`` = max_{lambda=1..tau-1} ||grad F_i(w_k) - grad F_i(w^lambda)|| /
  ||w_k - w^lambda|| (Assumption 3, Alg. 2 lines 15-16; lambda = 0 is 0/0 and skipped), in
  one of two modes: ``"literal"`` compares h_i with the step's minibatch gradient g^lambda
  (the paper's line 15); ``"same-batch"`` compares the gradients at w_k and at w^lambda on
  the step's minibatch (one extra gradient per step; the local smoothness without the
  minibatch noise);
* metrics ``delta`` = max_{lambda=1..tau-1} ||sum_{s=0..lambda} g^s||^2 /
  ((lambda + 1) ||grad F(w_{k-1})||^2) (Assumption 4 as written in Alg. 2 lines 17-18).

:func:`fedveca_steps` is the same computation on tensors, returning a
:class:`FedVecaResult`. Everything is computed online with O(1) model-sized buffers:
h_i, the running sum sum_s g^s and, in ``same-batch`` mode, a copy of w_k. For plain SGD
w_k - w^lambda = lr * sum_{s<lambda} g^s exactly, so the running sum also gives beta's
denominator. The loss must be a mean over the batch (plus terms that do not depend on
the batch, such as the squared SVM's (l2/2)||w||^2). torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict

from .. import contract as C
from ..records import to_record
from .batches import batch_indices, client_seed
from .data import loader_batch_size, tensors_for

BETA_MODES = ("same-batch", "literal")
DEFAULT_LR = 0.01  # eta when neither the config nor the caller gives ``lr``
DEFAULT_BATCH_SIZE = 32  # B when neither the config, the caller nor a DataLoader gives one

LossFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class FedVecaResult:
    """What a FedVeca client sends back (Alg. 2 lines 10, 12 and 19).

    ``arrays``: the local model's state_dict after the steps (CPU tensors).
    ``grad``: grad F_i(w_k) keyed like ``arrays``, floating entries only (zeros for
    buffers that are not parameters). ``beta`` / ``delta``: None when not estimated.
    """

    arrays: dict[str, Any]
    grad: dict[str, Any]
    beta: float | None
    delta: float | None
    local_steps: int
    num_examples: int
    train_loss: float
    loss_at_global: float


def is_fedveca_round(config: Mapping) -> bool:
    """True when a train message's config comes from a FedVeca server (estimator keys)."""
    return C.FEDVECA_ESTIMATE in config or C.GNORM2_PREV in config


def default_loss(model: Any) -> LossFn:
    """The model's own ``loss(outputs, targets)`` when it has one, else mean cross-entropy."""
    import torch.nn.functional as F  # noqa: PLC0415, N812

    own = getattr(model, "loss", None)
    return own if callable(own) else F.cross_entropy


def subsample_seed(seed: int) -> int:
    """A seed for the gradient subsample, independent of the minibatch stream's."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint64)[0] >> 1)


def _sq_norm(tensors) -> float:
    import torch  # noqa: PLC0415

    return float(sum(torch.sum(t.detach().double() ** 2) for t in tensors))


def _sq_norm_diff(a, b) -> float:
    import torch  # noqa: PLC0415

    return float(sum(torch.sum((x.detach().double() - y.detach().double()) ** 2)
                     for x, y in zip(a, b)))


def _objective(model: Any, loss_fn: LossFn) -> Any:
    """loss_fn(model(x), y) as a module, so that torch.func.functional_call can evaluate
    it at other parameter values (also where the loss itself reads parameters)."""
    from torch import nn  # noqa: PLC0415

    class Objective(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x, y):
            return loss_fn(self.model(x), y)

    return Objective()


def local_gradient(model: Any, x: Any, y: Any, loss_fn: LossFn | None = None,
                   chunk_size: int = 1000) -> tuple[list[Any], float]:
    """grad F_i(w) and F_i(w) at the model's current parameters over all of (x, y), in chunks.

    Returns one gradient per ``model.parameters()`` entry that requires grad, and the loss.
    """
    import torch  # noqa: PLC0415

    loss_fn = loss_fn or default_loss(model)
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n = len(y)
    loss_sum = 0.0
    for start in range(0, n, chunk_size):
        xb, yb = x[start:start + chunk_size], y[start:start + chunk_size]
        loss = loss_fn(model(xb), yb) * (len(yb) / n)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc.add_(g)
        loss_sum += float(loss.detach())
    return total, loss_sum


def _check(mode: str, beta_mode: str, tau: int, lr: float, n: int) -> None:
    if mode not in BETA_MODES:
        raise ValueError(f"beta_mode {beta_mode!r} is not known; "
                         f"use one of {', '.join(BETA_MODES)}")
    if tau < 1:
        raise ValueError(f"tau must be >= 1 local step, got {tau}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if n == 0:
        raise ValueError("FedVeca needs at least one local example")


def fedveca_steps(
    model: Any,
    x: Any,
    y: Any,
    *,
    tau: int,
    lr: float,
    batch_size: int,
    beta_mode: str = "same-batch",
    gnorm2_prev: float = 0.0,
    estimate: bool | None = None,
    grad_subsample: int = 0,
    seed: int = 0,
    loss_fn: LossFn | None = None,
    chunk_size: int = 1000,
) -> FedVecaResult:
    """One FedVeca client round (Alg. 2) on tensors: ``tau`` plain SGD steps, in place.

    Parameters
    ----------
    model, x, y
        The received global model w_k (trained in place) and the local data, on one device.
    tau
        Local steps tau_(k,i) >= 1 (the server's ``local-steps``).
    lr, batch_size
        eta and B; a fresh minibatch of B examples per step (B = 0 or >= n: full batch),
        cut from one permutation per epoch (:func:`strategies.client.batches.batch_indices`).
    beta_mode
        ``"same-batch"`` (default) or ``"literal"`` (``"same_batch"`` is accepted too).
    gnorm2_prev
        ||grad F(w_{k-1})||^2 from the server (``gnorm2-prev``); 0 when unknown.
    estimate
        Compute beta and delta (the server's ``fedveca-estimate``); default: gnorm2_prev > 0.
        Needs tau >= 2 and gnorm2_prev > 0; otherwise beta and delta are None.
    grad_subsample
        0: grad F_i(w_k) over all local examples (the paper); k > 0: over k random ones.
    seed
        Seeds the minibatch order and the subsample.
    loss_fn
        ``loss_fn(outputs, targets)``, a batch mean; default: ``model.loss`` or cross-entropy.
    """
    import torch  # noqa: PLC0415

    mode = str(beta_mode).replace("_", "-")
    n = len(y)
    _check(mode, beta_mode, tau, lr, n)
    loss_fn = loss_fn or default_loss(model)
    if estimate is None:
        estimate = gnorm2_prev > 0
    estimate = bool(estimate) and tau >= 2 and np.isfinite(gnorm2_prev) and gnorm2_prev > 0
    model.train()
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]

    # h_i = grad F_i(w_k) (Alg. 2 line 9), before the steps: it only depends on w_k.
    if 0 < grad_subsample < n:
        generator = torch.Generator().manual_seed(subsample_seed(seed))
        pick = torch.randperm(n, generator=generator)[:grad_subsample].to(x.device)
        h, loss_at_global = local_gradient(model, x[pick], y[pick], loss_fn, chunk_size)
    else:
        h, loss_at_global = local_gradient(model, x, y, loss_fn, chunk_size)

    objective = _objective(model, loss_fn)
    anchor = None
    if estimate and mode == "same-batch":  # w_k, for grad F_i(w_k; b_lambda)
        anchor = {f"model.{name}": p.detach().clone().requires_grad_(True) for name, p in named}
    running = [torch.zeros_like(p) for p in params]  # sum_{s < lambda} g^s
    beta, delta = 0.0, 0.0
    batches = batch_indices(n, batch_size, torch.Generator().manual_seed(seed))
    loss_sum = 0.0
    for lam in range(tau):
        idx = next(batches).to(x.device)
        xb, yb = x[idx], y[idx]
        loss = loss_fn(model(xb), yb)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        g = [gi if gi is not None else torch.zeros_like(p) for gi, p in zip(grads, params)]
        loss_sum += float(loss.detach())
        if estimate and lam >= 1:
            distance = lr * _sq_norm(running) ** 0.5  # ||w_k - w^lambda|| for plain SGD
            if distance > 1e-12:
                if anchor is None:  # literal: ||h_i - g^lambda||
                    numerator = _sq_norm_diff(h, g) ** 0.5
                else:  # same-batch: ||grad F_i(w_k; b) - grad F_i(w^lambda; b)||
                    at_anchor = torch.autograd.grad(
                        torch.func.functional_call(objective, anchor, (xb, yb), strict=False),
                        list(anchor.values()), allow_unused=True)
                    at_anchor = [a if a is not None else torch.zeros_like(p)
                                 for a, p in zip(at_anchor, params)]
                    numerator = _sq_norm_diff(at_anchor, g) ** 0.5
                beta = max(beta, numerator / distance)
        with torch.no_grad():
            for r, gi in zip(running, g):
                r.add_(gi)
            if estimate and lam >= 1:  # ||sum_{s<=lambda} g^s||^2 / ((lambda + 1) g2)
                delta = max(delta, _sq_norm(running) / ((lam + 1) * gnorm2_prev))
            for p, gi in zip(params, g):  # eq. (1): w <- w - eta g
                p.add_(gi, alpha=-lr)

    by_name = {name: hi for (name, _), hi in zip(named, h)}
    state = model.state_dict()
    grad = {key: (by_name[key] if key in by_name else torch.zeros_like(value)).detach().cpu()
            for key, value in state.items() if torch.is_floating_point(value)}
    return FedVecaResult(
        arrays={k: v.detach().cpu() for k, v in state.items()},
        grad=grad,
        beta=beta if estimate else None,
        delta=delta if estimate else None,
        local_steps=tau,
        num_examples=n,
        train_loss=loss_sum / tau,
        loss_at_global=loss_at_global,
    )


def fedveca_train(
    model: Any,
    data: Any,
    config: Mapping,
    *,
    partition_id: int | None = None,
    seed: int | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    beta_mode: str = "same-batch",
    grad_subsample: int = 0,
    loss_fn: LossFn | None = None,
    chunk_size: int = 1000,
) -> RecordDict:
    """The whole FedVeca client side of one train message, as the reply's RecordDict.

    Parameters
    ----------
    model
        A torch ``nn.Module`` holding the received model w_k; trained in place.
    data
        The local training set: ``(x, y)`` tensors or a DataLoader
        (:func:`strategies.client.data.as_tensors`); moved to the model's device.
    config
        The message's ConfigRecord ``msg.content["config"]``. Its ``local-steps`` is this
        client's tau; ``gnorm2-prev`` and ``fedveca-estimate`` ask for beta and delta;
        ``lr``, ``batch-size``, ``beta-mode``, ``grad-subsample`` and ``seed`` there win
        over the keyword arguments below, which are fallbacks.
    partition_id
        Added to the metrics as ``partition-id`` and used in the default seed.
    seed
        The minibatch-order seed; default ``client_seed(config seed or 0, server-round,
        partition_id or 0)``: a fresh, reproducible order every round.
    lr, batch_size
        eta and B when the config has none; B then falls back to the DataLoader's
        ``batch_size``, then to 32; eta to 0.01.
    beta_mode, grad_subsample, loss_fn, chunk_size
        As :func:`fedveca_steps`.

    Returns
    -------
    RecordDict
        ``"arrays"`` (the local model), ``"grad"`` (grad F_i(w_k)) and ``"metrics"`` with
        ``num-examples``, ``train-loss``, ``local-steps``, ``loss-at-global`` and, when the
        server asked for estimates, ``beta`` and ``delta`` (plus ``partition-id``). Reply
        with ``Message(content, reply_to=msg)``.
    """
    if C.LOCAL_STEPS not in config:
        raise ValueError(f"a FedVeca train config carries '{C.LOCAL_STEPS}' (tau); this one has "
                         f"{sorted(config)}: is the server a strategies.FedVeca?")
    x, y = tensors_for(model, data)
    if seed is None:
        seed = client_seed(int(config.get(C.SEED, 0)), int(config.get(C.SERVER_ROUND, 0)),
                           int(partition_id or 0))
    fallback_b = batch_size if batch_size is not None else loader_batch_size(data)
    result = fedveca_steps(
        model, x, y,
        tau=int(config[C.LOCAL_STEPS]),
        lr=float(config.get(C.LR, DEFAULT_LR if lr is None else lr)),
        batch_size=int(config.get(C.BATCH_SIZE, fallback_b or DEFAULT_BATCH_SIZE)),
        beta_mode=str(config.get(C.BETA_MODE, beta_mode)),
        gnorm2_prev=float(config.get(C.GNORM2_PREV, 0.0)),
        estimate=bool(config.get(C.FEDVECA_ESTIMATE, False)),
        grad_subsample=int(config.get(C.GRAD_SUBSAMPLE, grad_subsample)),
        seed=seed, loss_fn=loss_fn, chunk_size=chunk_size,
    )
    metrics = {
        C.NUM_EXAMPLES: result.num_examples,
        C.TRAIN_LOSS: result.train_loss,
        C.LOCAL_STEPS_TAKEN: result.local_steps,
        C.LOSS_AT_GLOBAL: result.loss_at_global,
    }
    if partition_id is not None:
        metrics[C.PARTITION_ID] = int(partition_id)
    if result.beta is not None:
        metrics[C.BETA] = result.beta
        metrics[C.DELTA] = result.delta
    return RecordDict({
        C.ARRAYS: to_record({k: np.asarray(v) for k, v in result.arrays.items()}),
        C.GRAD: to_record({k: np.asarray(v) for k, v in result.grad.items()}),
        C.METRICS: MetricRecord(metrics),
    })
