"""The simulation federation's options (``flwr run --federation-config``), checked before
``flwr run`` starts.

Flower 1.41 types them as its ``flwr federation simulation-config`` options do: whole
numbers for ``num-supernodes``, ``client-resources-num-cpus`` and ``init-args-num-*``, a
GPU share for ``client-resources-num-gpus``. A value of the wrong type reaches its
protobuf message and ``flwr run`` stops with ``'float' object cannot be interpreted as an
integer`` (even for ``2.0``); here a whole float becomes an int and anything else is an
error that names the key, the value and the fix. :func:`refuse_unfittable` refuses, before
anything starts, a ClientApp that asks for more CPUs or GPUs than Ray will have here: Flower
would start the SuperLink and Ray and then stop with ``ActorPool is empty``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

# key -> smallest value Flower accepts
WHOLE_NUMBER_KEYS = {"num-supernodes": 1, "client-resources-num-cpus": 1,
                     "init-args-num-cpus": 1, "init-args-num-gpus": 0}
GPU_SHARE_KEY = "client-resources-num-gpus"
NOTHING_RAN = "(checked before flwr run started; nothing ran)"  # ends every such refusal

WHOLE_CPUS_HINT = (
    "Flower's simulation reserves whole CPUs per ClientApp; to run more ClientApps at once "
    "than there are cores, keep 1 and give Ray more CPUs than the machine has (flwr run . "
    "--federation-config \"init-args-num-cpus=N\")"
)


class FederationConfigError(ValueError):
    """A federation option Flower's simulation would refuse: ``key``, ``value`` and
    ``reason`` (what to give instead), for callers that name the option their own way."""

    def __init__(self, key: str, value: object, reason: str):
        super().__init__(f"{key}={value!r}: {reason}")
        self.key, self.value, self.reason = key, value, reason


def federation_value(key: str, value: object) -> object:
    """``value`` as Flower's simulation takes it for ``key`` (``2.0`` -> ``2`` for a whole
    number), or a :class:`FederationConfigError` naming the key and value and what to give
    instead. Keys this module does not type pass through unchanged."""
    try:
        return _typed(key, value)
    except _Refused as refused:
        raise FederationConfigError(key, value, str(refused)) from None


def checked_federation(config: Mapping[str, object]) -> dict[str, object]:
    """Every value of ``config`` through :func:`federation_value`."""
    return {key: federation_value(key, value) for key, value in config.items()}


def client_resources(num_supernodes: int, cpus_per_client: int,
                     gpus_per_client: float = 0) -> dict[str, object]:
    """The federation options of our commands' ``--num-supernodes``, ``--cpus-per-client``
    and ``--gpus-per-client`` (the GPU share only when one is given: Flower's default)."""
    config: dict[str, object] = {"num-supernodes": num_supernodes,
                                 "client-resources-num-cpus": cpus_per_client}
    if gpus_per_client:
        config[GPU_SHARE_KEY] = gpus_per_client
    return config


def refuse_unfittable(config: Mapping[str, object], ray_address: str | None = None) -> None:
    """A :class:`FederationConfigError` when no ClientApp of ``config`` fits the private Ray
    that ``flwr run`` starts on this machine: more CPUs per ClientApp than Ray gets (its
    ``init-args-num-cpus``, else this machine's CPUs), or a GPU share where no GPU is
    visible (unless ``init-args-num-gpus`` says how many Ray has). On a Ray cluster
    (``ray_address``) the cluster's resources count, not this machine's: nothing is checked."""
    if ray_address:
        return
    cpus = federation_value("client-resources-num-cpus", config.get("client-resources-num-cpus", 1))
    given_cpus = config.get("init-args-num-cpus")
    ray_cpus = federation_value("init-args-num-cpus", given_cpus) if given_cpus else os.cpu_count()
    if ray_cpus and cpus > ray_cpus:
        source = "init-args-num-cpus" if given_cpus else "this machine's CPUs"
        raise FederationConfigError(
            "client-resources-num-cpus", cpus,
            f"no ClientApp can start: Ray gets {ray_cpus} CPUs ({source}); give at most "
            f"{ray_cpus}, or raise init-args-num-cpus (Ray then shares the cores)")
    gpus = federation_value(GPU_SHARE_KEY, config.get(GPU_SHARE_KEY, 0))
    if gpus and config.get("init-args-num-gpus") is None:
        visible = visible_gpus()
        if visible is not None and gpus > visible:
            raise FederationConfigError(
                GPU_SHARE_KEY, gpus,
                f"no ClientApp can start: {visible} GPU(s) visible here (torch.cuda); give 0 "
                f"to train on the CPU" + (f" or at most {visible}" if visible else ""))


def unused_gpus_note(config: Mapping[str, object], ray_address: str | None = None) -> str | None:
    """A line for the user when this machine has NVIDIA GPUs (Linux's
    ``/proc/driver/nvidia/gpus``, no torch import) but ``config`` gives the ClientApps no
    share of one: Ray hides the GPUs from them and they train on the CPU. None otherwise."""
    if ray_address or config.get(GPU_SHARE_KEY):
        return None
    count = nvidia_gpus()
    if not count:
        return None
    return (f"note: this machine has {count} NVIDIA GPU(s), but the ClientApps ask for no "
            f"share of one ({GPU_SHARE_KEY}), so Ray hides them and they train on the CPU; "
            f"--gpus-per-client 0.25 (a sweep file's gpus-per-client = 0.25) puts four on a GPU")


def nvidia_gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """NVIDIA GPUs the kernel driver lists (0 without the driver or off Linux)."""
    try:
        return sum(1 for _ in driver.iterdir())
    except OSError:
        return 0


def visible_gpus() -> int | None:
    """GPUs torch sees here (Ray counts the same devices), or None without torch."""
    try:
        import torch  # noqa: PLC0415 - only when a GPU share is asked for
    except ImportError:
        return None
    return torch.cuda.device_count()


def option_type(key: str) -> Callable[[str], object]:
    """An argparse ``type`` for a command-line option that sets federation option ``key``
    (argparse names the option; the message names Flower's key and the fix)."""

    def parse(text: str) -> object:
        try:
            return _typed(key, text)
        except _Refused as refused:
            raise argparse.ArgumentTypeError(
                f"{text!r} (Flower's federation option {key}): {refused}") from None

    parse.__name__ = key  # argparse names the type in some messages
    return parse


class _Refused(Exception):
    """Why a value is refused (the callers add the key and value)."""


def _typed(key: str, value: object) -> object:
    if key in WHOLE_NUMBER_KEYS:
        minimum = WHOLE_NUMBER_KEYS[key]
        number = _number(value)
        if number != int(number) or number < minimum:
            hint = f"; {WHOLE_CPUS_HINT}" if key == "client-resources-num-cpus" else ""
            raise _Refused(f"give a whole number >= {minimum} (e.g. {max(minimum, 1)}){hint}")
        return int(number)
    if key == GPU_SHARE_KEY:
        number = _number(value)
        if number < 0 or (number > 1 and number != int(number)):
            raise _Refused("give a share of one GPU between 0 and 1 (0.25: four ClientApps "
                           "share a GPU) or a whole number of GPUs")
        return number
    return value


def _number(value: object) -> float:
    """A finite number from an int, a float or their text (not a bool)."""
    if isinstance(value, bool):
        raise _Refused("give a number, not true / false")
    try:
        number = float(value if isinstance(value, (int, float)) else str(value))
    except ValueError:
        raise _Refused("give a number") from None
    if not math.isfinite(number):
        raise _Refused("give a finite number")
    return number
