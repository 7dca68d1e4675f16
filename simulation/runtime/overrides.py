"""``-c KEY=VALUE`` run-config overrides, typed as ``flwr run --run-config`` types them."""

from __future__ import annotations

from collections.abc import Mapping


def parse_value(text: str) -> object:
    """A ``KEY=VALUE`` value as ``flwr run --run-config`` types it: int, float, bool or str."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text.strip("'\"")


def parse_overrides(items: list[str]) -> dict[str, object]:
    """['lr=0.05', "strategy=fednova"] -> {'lr': 0.05, 'strategy': 'fednova'}."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--run-config {item!r}: expected KEY=VALUE, "
                             "e.g. -c num-server-rounds=5")
        overrides[key.strip()] = parse_value(value.strip())
    return overrides


def to_flwr_config(values: Mapping[str, object]) -> str:
    """{'strategy': 'fedavg', 'lr': 0.1} -> "strategy='fedavg' lr=0.1" (TOML values)."""
    def toml(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return "'" + value.replace("'", "") + "'"
        return repr(value)
    return " ".join(f"{key}={toml(value)}" for key, value in values.items())
