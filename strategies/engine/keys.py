"""Run-config keys as their readers declare them: an algorithm's keys stand beside it.

A :class:`Key` is one ``[tool.flwr.app.config]`` key: its default, what it accepts (an
:class:`Interval`, ``choices`` or a ``check``), one line of doc, and, for an algorithm's own
key, the constructor argument it sets (``arg``; ``auto`` is the value that leaves that
argument at the class's default, ``convert`` turns the run-config value into the
argument). :class:`Only` says which values a key may take with given strategies (what a
strategy cannot honour, and why); a :class:`Rule` is a condition across keys. The app
assembles its one table from these declarations (:mod:`fedapp.config_keys`) and validates
each value once, against the declaration. Plain Python: no Flower, no numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["APP", "BELOW_ONE", "FRACTION", "Interval", "Key", "Only", "Rule", "UNIT", "Value",
           "above", "at_least"]

Value = bool | int | float | str
APP = "app"  # ``used_by`` marker: the app itself (data, client training, ServerApp) reads it


@dataclass(frozen=True)
class Interval:
    """The numbers from ``low`` to ``high`` (None: unbounded), each end closed or open."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, value: float) -> bool:
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.open_high else
                                        value <= self.high)
        return low_ok and high_ok

    def words(self, integer: bool) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ..."""
        noun = "an integer" if integer else "a number"
        show = str if integer else "{:g}".format
        if self.high is None:
            return f"{noun} {'>' if self.open_low else '>='} {show(self.low)}"
        return (f"{noun} in {'(' if self.open_low else '['}{show(self.low)}, "
                f"{show(self.high)}{')' if self.open_high else ']'}")


def at_least(low: float) -> Interval:
    return Interval(low)


def above(low: float) -> Interval:
    return Interval(low, open_low=True)


UNIT = Interval(0.0, 1.0)  # [0, 1]
FRACTION = Interval(0.0, 1.0, open_low=True)  # (0, 1]
BELOW_ONE = Interval(0.0, 1.0, open_high=True)  # [0, 1)


@dataclass(frozen=True)
class Only:
    """With ``strategies``, the key may only take ``values`` (the first is the fix unless
    the default is among them); ``why`` says what the strategy cannot honour."""

    strategies: tuple[str, ...]
    values: tuple[Value, ...]
    why: str


@dataclass(frozen=True)
class Rule:
    """A condition across ``keys`` (kebab-case values in, True when it holds)."""

    keys: tuple[str, ...]
    holds: Callable[[Mapping[str, Value]], bool]
    allowed: str


@dataclass(frozen=True)
class Key:
    """One run-config key (module docstring). ``note`` follows the allowed values in
    messages and docs (what a special value means, or, with ``check``, what it allows);
    ``used_by`` and ``only`` are filled in when the app assembles its table."""

    name: str
    default: Value
    doc: str
    used_by: tuple[str, ...] = (APP,)
    interval: Interval | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[object], object] | None = None
    note: str = ""
    only: tuple[Only, ...] = ()
    arg: str | None = None
    auto: Value | None = None
    convert: Callable[[Value], object] | None = None

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def field(self) -> str:
        """The run config's field: kebab-case key -> snake_case."""
        return self.name.replace("-", "_")

    def allowed(self) -> str:
        """What the key accepts, in words (for messages and the docs)."""
        if self.interval is not None:
            said = self.interval.words(self.type is int)
        elif self.choices:
            said = f"one of {', '.join(self.choices)}"
        else:
            said = ""
        return " ".join(part for part in (said, self.note) if part) or f"a {self.type.__name__}"

    def refusal(self, value: Value) -> str | None:
        """None if ``value`` (already of the key's type) is allowed, else why not ('' when
        the allowed values say it all)."""
        if self.interval is not None and value not in self.interval:
            return ""
        if self.choices and value not in self.choices:
            return ""
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                return str(exc)
        return None

    def arguments(self, value: Value, arg: str | None = None) -> dict[str, object]:
        """The constructor argument ``value`` sets: ``{arg: value}`` (converted; ``arg``
        defaults to the key's own), or none when the value is ``auto`` (the class's own
        default) or there is no argument."""
        arg = arg or self.arg
        if arg is None or (self.auto is not None and value == self.auto):
            return {}
        return {arg: self.convert(value) if self.convert is not None else value}
