"""Every exported strategy is a Flower ``Strategy`` whose method resolution order holds at
most two classes of ours: the algorithm and the engine it runs on (a round engine, the
asynchronous engine, or the trust gate around one of Flower's own server optimisers).
DynamicFL runs its own sync events and is one class. Every algorithm object the engines call
implements at most the five methods of its interface.

``python tests/test_strategy_mro.py`` prints the table this test checks."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from flwr.serverapp.strategy import Strategy

import strategies
from strategies.algorithms.flower_optimizers import TrustGated
from strategies.engine.algorithm import Algorithm
from strategies.engine.async_engine import AsyncAlgorithm, AsyncEngine
from strategies.engine.round_engine import RoundEngine

OUR_PACKAGES = ("strategies", "fedapp", "simulation", "task")
ENGINES = (RoundEngine, AsyncEngine, TrustGated)


def exported_strategies() -> dict[str, type]:
    return {name: obj for name in strategies.__all__
            if inspect.isclass(obj := getattr(strategies, name)) and issubclass(obj, Strategy)}


def our_classes(cls: type) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.split(".")[0] in OUR_PACKAGES]


def test_every_exported_strategy_is_the_algorithm_plus_at_most_its_engine():
    found = exported_strategies()
    assert len(found) >= 19, sorted(found)
    for name, cls in found.items():
        ours = our_classes(cls)
        assert ours[0] is cls, name
        assert len(ours) <= 2, (name, ours)
        assert all(engine in ENGINES for engine in ours[1:]), (name, ours)


def classes_in_strategies() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(strategies.__path__, "strategies."):
        module = importlib.import_module(info.name)
        found += [obj for obj in vars(module).values()
                  if inspect.isclass(obj) and obj.__module__ == info.name]
    return found


def test_every_class_name_in_strategies_is_unique():
    seen: dict[str, str] = {}
    for cls in classes_in_strategies():
        assert cls.__name__ not in seen, (
            f"class {cls.__name__} in {seen.get(cls.__name__)} and {cls.__module__}")
        seen[cls.__name__] = cls.__module__


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items()
            if callable(value) and not name.startswith("_")}


@pytest.mark.parametrize("interface", [Algorithm, AsyncAlgorithm], ids=lambda c: c.__name__)
def test_an_algorithm_implements_at_most_the_five_methods_of_its_interface(interface):
    five = public_methods(interface)
    assert len(five) == 5, five
    algorithms = [cls for cls in classes_in_strategies()
                  if issubclass(cls, interface) and cls is not interface]
    assert len(algorithms) >= 2, algorithms
    for cls in algorithms:
        for base in cls.__mro__[:cls.__mro__.index(interface)]:
            assert public_methods(base) <= five, (cls, public_methods(base) - five)


if __name__ == "__main__":
    for name, cls in sorted(exported_strategies().items()):
        ours = our_classes(cls)
        print(f"{name:11s} {len(ours)}  " + " -> ".join(
            f"{c.__module__.removeprefix('strategies.')}.{c.__qualname__}" for c in ours))
