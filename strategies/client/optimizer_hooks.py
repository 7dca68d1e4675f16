"""Wrapping the user's own optimiser: a strategy's work before or after each of its steps.

A helper that changes every local step (FedProx's proximal term, FedDyn's linear term,
SCAFFOLD's correction) installs itself on the optimiser the user already built
(``torch.optim.Optimizer.register_step_pre_hook`` / ``register_step_post_hook``, hooks of
that one optimiser object, nothing process-wide). The user's momentum, Adam moments,
weight decay and learning-rate schedule stay as they are; whatever loop calls
``optimizer.step()`` (the user's, or :func:`strategies.client.sgd_steps`) now takes the
strategy's step. :class:`StepHooks` keeps the handles so the helper can take itself off
again (``unwrap``; the helpers' ``finish`` does it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepHooks:
    """The hooks one helper installed on one optimiser."""

    def __init__(self) -> None:
        self._handles: list[Any] = []

    @property
    def installed(self) -> bool:
        """Whether the helper is on an optimiser now."""
        return bool(self._handles)

    def install(self, owner: str, optimizer: Any, *, before: Callable[[], None] | None = None,
                after: Callable[[], None] | None = None) -> None:
        """Run ``before()`` at the start and ``after()`` at the end of every
        ``optimizer.step()``; ``owner`` names the helper in errors."""
        if self._handles:
            raise ValueError(f"{owner} already wraps an optimizer; call {owner}.wrap once per "
                             f"round (unwrap() first to move it to another optimizer)")
        if not callable(getattr(optimizer, "register_step_pre_hook", None)):
            raise TypeError(f"{owner}.wrap needs a torch.optim.Optimizer (it installs step "
                            f"hooks on it), got {type(optimizer).__name__}")
        if before is not None:
            self._handles.append(optimizer.register_step_pre_hook(
                lambda _optimizer, _args, _kwargs: before()))
        if after is not None:
            self._handles.append(optimizer.register_step_post_hook(
                lambda _optimizer, _args, _kwargs: after()))

    def remove(self) -> None:
        """Take the hooks off the optimiser (no-op when none are installed)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def learning_rates(optimizer: Any) -> set[float]:
    """The distinct ``lr`` of the optimiser's parameter groups."""
    return {float(group["lr"]) for group in optimizer.param_groups if "lr" in group}
