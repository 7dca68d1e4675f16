"""The algorithms' registrations: each algorithm module registers its strategy by name.

A :class:`Registration` says what the fedhetero app needs to offer a strategy by the
run-config name ``strategy``: the exported class, a one-line summary, the engine it runs on
(which decides the shared run-config keys it reads), its own keys (declared beside it,
:class:`strategies.engine.keys.Key`), the shared keys it takes as constructor arguments,
the values of shared keys it cannot honour, the rules across its keys, and what the model
must offer. ``strategies.algorithms`` imports every algorithm module, one line each, and
each module calls :func:`register`: that is the whole of adding a strategy to the app.
Plain Python: no Flower, no numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .keys import Key, Rule, Value

__all__ = ["ENGINES", "MODEL_NEEDS", "Registration", "register", "registered"]

ENGINES = ("round", "events", "async", "flower")
"""``round``: :class:`~strategies.engine.round_engine.RoundEngine`; ``events``: DynamicFL's
sync events; ``async``: :class:`~strategies.engine.async_engine.AsyncEngine`; ``flower``:
Flower's own server optimisers behind the trust gate."""
MODEL_NEEDS = ("width", "representation")
"""What a strategy may need of the model: to scale in width (sub-models), or to expose a
representation (a projection head)."""


@dataclass(frozen=True)
class Registration:
    """A strategy as the app offers it (module docstring).

    ``reads`` maps shared run-config keys (the app's, another registration's) to the
    constructor argument each sets; ``only`` holds (key, allowed values, why) for shared keys
    this strategy cannot honour; ``fixed`` are constructor arguments and ``train_config``
    train-config entries this name fixes (a preset: FedSGD, DynamicSGD); ``client_side`` is
    the ``strategies.client`` module that registers its client side
    (:mod:`strategies.client.sides`), None when a stock ClientApp's local training is it.
    """

    name: str
    strategy: type
    summary: str
    engine: str = "round"
    keys: tuple[Key, ...] = ()
    reads: Mapping[str, str] = field(default_factory=dict)
    only: tuple[tuple[str, tuple[Value, ...], str], ...] = ()
    rules: tuple[Rule, ...] = ()
    fixed: Mapping[str, object] = field(default_factory=dict)
    train_config: Mapping[str, object] = field(default_factory=dict)
    model: str | None = None
    client_side: str | None = None


_REGISTRY: dict[str, Registration] = {}


def register(name: str, strategy: type, summary: str, **kwargs) -> Registration:
    """Offer ``strategy`` under the run-config name ``name`` (:class:`Registration`'s
    fields as keywords); a name registered twice is an error naming both classes."""
    registration = Registration(name, strategy, summary, **kwargs)
    if registration.engine not in ENGINES:
        raise ValueError(f"register({name!r}): engine={registration.engine!r} is not one of "
                         f"{', '.join(ENGINES)}")
    if registration.model not in (None, *MODEL_NEEDS):
        raise ValueError(f"register({name!r}): model={registration.model!r} is not one of "
                         f"{', '.join(MODEL_NEEDS)}")
    known = _REGISTRY.get(name)
    if known is not None and known.strategy is not strategy:
        raise ValueError(f"strategy name {name!r} is registered twice: by "
                         f"{known.strategy.__qualname__} and {strategy.__qualname__}")
    _REGISTRY[name] = registration
    return registration


def registered() -> dict[str, Registration]:
    """Every registration, in the order the algorithm modules registered them."""
    return dict(_REGISTRY)
