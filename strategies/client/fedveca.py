"""FedVeca's client procedure (Luo et al., arXiv 2209.13803, Algorithm 2) for any PyTorch model.

:func:`fedveca_train` is what a ClientApp calls on a FedVeca train message: it runs the
tau_(k,i) local steps the server asked for (eq. 1) from the received model w_k and
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

The steps are those of :func:`strategies.client.local_sgd` (the one local-SGD loop; same
seed, same minibatches), with :class:`GradientCapture` reading each step's gradient
g^lambda after ``backward()``. The optimiser is plain SGD at the config's eta (eq. 1)
unless the caller passes its own. :func:`fedveca_steps` is the same computation on
tensors, returning a :class:`FedVecaResult`. Everything is computed online with O(1)
model-sized buffers: h_i, the running sum sum_s g^s (for plain SGD, eta times it is
w_k - w^lambda exactly, beta's denominator) and, in ``same-batch`` mode or with another
optimiser, a copy of w_k. The loss must be a
mean over the batch (plus terms that do not depend on the batch, such as the squared
SVM's (l2/2)||w||^2). torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import logging

import numpy as np
from flwr.app import MetricRecord, RecordDict

from .. import contract as C
from ..engine.records import sent_config, to_record
from .batches import client_seed
from .data import loader_batch_size, tensors_for
from .optimizer_hooks import learning_rates
from .sgd_loop import default_loss, local_sgd, plain_sgd
from .sides import ClientSide, TrainTask, register_client_side

log = logging.getLogger(__name__)

BETA_MODES = C.BETA_MODES
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


def _check(mode: str, beta_mode: str, tau: int, lr: float | None, optimizer: Any,
           n: int) -> None:
    if mode not in BETA_MODES:
        raise ValueError(f"beta_mode {beta_mode!r} is not known; "
                         f"use one of {', '.join(BETA_MODES)}")
    if tau < 1:
        raise ValueError(f"tau must be >= 1 local step, got {tau}")
    if optimizer is None and not (lr is not None and lr > 0):
        raise ValueError(f"lr must be > 0 (eta of eq. 1) when no optimizer is given, got {lr}")
    if n == 0:
        raise ValueError("FedVeca needs at least one local example")


class GradientCapture:
    """beta and delta of Alg. 2 (lines 15-18), online, from each step's gradient g^lambda.

    Called by the loop after every ``backward()`` (``on_gradients``), while the weights
    are still w^lambda. Keeps h_i = grad F_i(w_k) and sum_{s<lambda} g^s; and a copy of w_k
    where needed (``same-batch`` mode, or a measured denominator).

    Parameters
    ----------
    model
        The model at w_k (before any step).
    h
        grad F_i(w_k), one tensor per trained parameter (:func:`local_gradient`).
    loss_fn
        The loss the steps use (``same-batch`` mode evaluates it at w_k).
    mode
        ``"same-batch"`` or ``"literal"`` (module docstring).
    gnorm2_prev
        ||grad F(w_{k-1})||^2 > 0, delta's normaliser.
    sgd_lr
        eta when the steps are plain SGD (eq. 1): then w_k - w^lambda = eta sum_{s<lambda}
        g^s exactly, and beta's denominator is computed so (no float32 cancellation of
        two nearby weights). None (another optimiser): ||w_k - w^lambda|| is measured.
    """

    def __init__(self, model: Any, h: list[Any], loss_fn: LossFn, mode: str,
                 gnorm2_prev: float, sgd_lr: float | None) -> None:
        import torch  # noqa: PLC0415

        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.h = h
        self.gnorm2_prev = gnorm2_prev
        self.sgd_lr = sgd_lr
        self.start = None  # w_k, for a measured ||w_k - w^lambda||
        if sgd_lr is None:
            self.start = [p.detach().clone() for p in self.params]
        self.anchor = None  # w_k as leaves, for grad F_i(w_k; b_lambda) in same-batch mode
        if mode == "same-batch":
            self.anchor = {f"model.{name}": p.detach().clone().requires_grad_(True)
                           for name, p in named}
            self.objective = _objective(model, loss_fn)
        self.running = [torch.zeros_like(p) for p in self.params]  # sum_{s < lambda} g^s
        self.step = 0  # lambda
        self.beta = 0.0
        self.delta = 0.0

    def distance(self) -> float:
        """||w_k - w^lambda|| at the current weights w^lambda."""
        if self.start is None:
            return self.sgd_lr * _sq_norm(self.running) ** 0.5  # eq. (1)
        return _sq_norm_diff(self.start, self.params) ** 0.5

    def __call__(self, model: Any, xb: Any, yb: Any) -> None:
        import torch  # noqa: PLC0415

        g = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        lam = self.step
        if lam >= 1:
            distance = self.distance()
            if distance > 1e-12:
                if self.anchor is None:  # literal: ||h_i - g^lambda||
                    numerator = _sq_norm_diff(self.h, g) ** 0.5
                else:  # same-batch: ||grad F_i(w_k; b) - grad F_i(w^lambda; b)||
                    at_anchor = torch.autograd.grad(
                        torch.func.functional_call(self.objective, self.anchor, (xb, yb),
                                                   strict=False),
                        list(self.anchor.values()), allow_unused=True)
                    at_anchor = [a if a is not None else torch.zeros_like(p)
                                 for a, p in zip(at_anchor, self.params)]
                    numerator = _sq_norm_diff(at_anchor, g) ** 0.5
                self.beta = max(self.beta, numerator / distance)
        with torch.no_grad():
            for r, gi in zip(self.running, g):
                r.add_(gi)
        if lam >= 1:  # ||sum_{s<=lambda} g^s||^2 / ((lambda + 1) ||grad F(w_{k-1})||^2)
            self.delta = max(self.delta, _sq_norm(self.running) / ((lam + 1) * self.gnorm2_prev))
        self.step += 1


def fedveca_steps(
    model: Any,
    x: Any,
    y: Any,
    *,
    tau: int,
    lr: float | None = None,
    batch_size: int,
    beta_mode: str = "same-batch",
    gnorm2_prev: float = 0.0,
    estimate: bool | None = None,
    grad_subsample: int = 0,
    seed: int = 0,
    loss_fn: LossFn | None = None,
    chunk_size: int = 1000,
    optimizer: Any = None,
) -> FedVecaResult:
    """One FedVeca client round (Alg. 2) on tensors: ``tau`` local steps, in place.

    Parameters
    ----------
    model, x, y
        The received global model w_k (trained in place) and the local data, on one device.
    tau
        Local steps tau_(k,i) >= 1 (the server's ``local-steps``).
    lr, batch_size
        eta and B; a fresh minibatch of B examples per step (B = 0 or >= n: full batch),
        cut from one permutation per epoch (:func:`strategies.client.batches.batch_indices`).
        ``lr`` builds the plain SGD of eq. (1) and is needed only without ``optimizer``.
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
    optimizer
        The caller's own optimiser over ``model``'s parameters (momentum, Adam, ...); None:
        ``torch.optim.SGD(lr)``, the paper's eq. (1), where beta's denominator
        ||w_k - w^lambda|| = eta ||sum_{s<lambda} g^s||; with another optimiser it is
        measured from a copy of w_k.
    """
    import torch  # noqa: PLC0415

    mode = str(beta_mode).replace("_", "-")
    n = len(y)
    _check(mode, beta_mode, tau, lr, optimizer, n)
    loss_fn = loss_fn or default_loss(model)
    if estimate is None:
        estimate = gnorm2_prev > 0
    estimate = bool(estimate) and tau >= 2 and np.isfinite(gnorm2_prev) and gnorm2_prev > 0
    model.train()
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    # h_i = grad F_i(w_k) (Alg. 2 line 9), before the steps: it only depends on w_k.
    if 0 < grad_subsample < n:
        generator = torch.Generator().manual_seed(subsample_seed(seed))
        pick = torch.randperm(n, generator=generator)[:grad_subsample].to(x.device)
        h, loss_at_global = local_gradient(model, x[pick], y[pick], loss_fn, chunk_size)
    else:
        h, loss_at_global = local_gradient(model, x, y, loss_fn, chunk_size)

    capture = None
    if estimate:
        capture = GradientCapture(model, h, loss_fn, mode, gnorm2_prev,
                                  sgd_lr=lr if optimizer is None else None)
    result = local_sgd(model, x, y, batch_size=batch_size, steps=tau, seed=seed,
                       optimizer=plain_sgd(model, lr) if optimizer is None else optimizer,
                       on_gradients=capture, loss_fn=loss_fn)

    by_name = {name: hi for (name, _), hi in zip(named, h)}
    state = model.state_dict()
    grad = {key: (by_name[key] if key in by_name else torch.zeros_like(value)).detach().cpu()
            for key, value in state.items() if torch.is_floating_point(value)}
    return FedVecaResult(
        arrays={k: v.detach().cpu() for k, v in state.items()},
        grad=grad,
        beta=capture.beta if capture is not None else None,
        delta=capture.delta if capture is not None else None,
        local_steps=result.local_steps,
        num_examples=n,
        train_loss=result.train_loss,
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
    optimizer: Any = None,
    metrics: Mapping[str, Any] | None = None,
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
    optimizer
        Your own optimiser over ``model``'s parameters (momentum, Adam, weight decay), run
        for the tau steps as you built it; None: plain SGD at the config's ``lr`` (eq. 1).
        The server's choice of tau (eq. 15) reasons about eta = the ``lr`` it sent: an
        optimiser at another rate is used, with one warning.
    metrics
        Your own metrics for the reply; the FedVeca keys below are added to them.

    Returns
    -------
    RecordDict
        ``"arrays"`` (the local model), ``"grad"`` (grad F_i(w_k)) and ``"metrics"``:
        ``metrics`` plus ``num-examples``, ``train-loss``, ``local-steps``,
        ``loss-at-global`` and, when the server asked for estimates, ``beta`` and ``delta``
        (plus ``partition-id``). Reply with ``Message(content, reply_to=msg)``.
    """
    if C.LOCAL_STEPS not in config:
        raise ValueError(f"a FedVeca train config carries '{C.LOCAL_STEPS}' (tau); this one has "
                         f"{sorted(config)}: is the server a strategies.FedVeca?")
    x, y = tensors_for(model, data)
    if seed is None:
        seed = client_seed(int(config.get(C.SEED, 0)), int(config.get(C.SERVER_ROUND, 0)),
                           int(partition_id or 0))
    fallback_b = batch_size if batch_size is not None else loader_batch_size(data)
    eta = float(config.get(C.LR, DEFAULT_LR if lr is None else lr))
    if optimizer is not None and learning_rates(optimizer) - {eta}:
        log.warning("FedVeca client: the optimizer's lr %s is not the eta = %s the server "
                    "chooses tau by (config '%s'); build it with lr=config['%s']",
                    sorted(learning_rates(optimizer)), eta, C.LR, C.LR)
    result = fedveca_steps(
        model, x, y,
        tau=int(config[C.LOCAL_STEPS]),
        lr=eta, optimizer=optimizer,
        batch_size=int(config.get(C.BATCH_SIZE, fallback_b or DEFAULT_BATCH_SIZE)),
        beta_mode=str(config.get(C.BETA_MODE, beta_mode)),
        gnorm2_prev=float(config.get(C.GNORM2_PREV, 0.0)),
        estimate=bool(config.get(C.FEDVECA_ESTIMATE, False)),
        grad_subsample=int(config.get(C.GRAD_SUBSAMPLE, grad_subsample)),
        seed=seed, loss_fn=loss_fn, chunk_size=chunk_size,
    )
    out = dict(metrics or {})
    out.update({
        C.NUM_EXAMPLES: result.num_examples,
        C.TRAIN_LOSS: result.train_loss,
        C.LOCAL_STEPS_TAKEN: result.local_steps,
        C.LOSS_AT_GLOBAL: result.loss_at_global,
    })
    if partition_id is not None:
        out[C.PARTITION_ID] = int(partition_id)
    if result.beta is not None:
        out[C.BETA] = result.beta
        out[C.DELTA] = result.delta
    return RecordDict({
        C.ARRAYS: to_record({k: np.asarray(v) for k, v in result.arrays.items()}),
        C.GRAD: to_record({k: np.asarray(v) for k, v in result.grad.items()}),
        C.METRICS: MetricRecord(out),
    })


def fedveca_side(task: TrainTask) -> RecordDict:
    """FedVeca's client side (Alg. 2): tau plain SGD steps (eq. 1), grad F_i(w_k), beta and
    delta, as the message asks."""
    return fedveca_train(task.model, (task.x, task.y), task.msg.content[C.CONFIG],
                         partition_id=task.partition_id, seed=task.seed, lr=task.lr,
                         batch_size=task.batch_size)


register_client_side(ClientSide("strategies.client.fedveca_train",
                                lambda msg: is_fedveca_round(sent_config(msg.content) or {}),
                                train=fedveca_side))
