"""A run's config checked in the driver before ``flwr run`` starts, by the rules the
ServerApp applies before training (:func:`fedapp.registry.check_run_config`: the keys'
types and values, the strategy's own checks; the data, a checkpoint to resume and the
tracking packages are still checked where the ServerApp runs). A typo then fails at once,
not after the SuperLink, Ray and the ServerApp have started, and a sweep checks every run
before its first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedapp.registry import check_run_config

from .runtime import NOTHING_RAN


def refuse_bad_run_configs(runs: Iterable[tuple[str, Mapping[str, object]]],
                           federation: Mapping[str, object] | None = None) -> None:
    """SystemExit with the ServerApp's own message, prefixed by ``what``, for the first
    ``(what, run_config)`` pair whose run config (overrides of pyproject.toml's defaults)
    would stop the run; nothing has started yet. With the runs' ``federation``, also a
    ``device`` of ``cuda`` for ClientApps that ask for no GPU share: Ray hides the GPU from
    them, and every ClientApp would fail on its first message; and a federation smaller
    than ``min-available-nodes``, for which the ServerApp would wait forever."""
    gpu_share = bool((federation or {}).get("client-resources-num-gpus"))
    nodes = (federation or {}).get("num-supernodes")
    for what, run_config in runs:
        try:
            cfg = check_run_config(run_config)
        except ValueError as exc:  # ConfigError and the strategies' own checks
            raise SystemExit(f"{what}: {exc}\n{NOTHING_RAN}") from None
        if isinstance(nodes, int) and cfg.min_available_nodes > nodes:
            raise SystemExit(
                f"{what}: min-available-nodes={cfg.min_available_nodes}, but the federation "
                f"has {nodes} SuperNode(s) (num-supernodes): the ServerApp would wait for "
                f"nodes forever. Give -c min-available-nodes={nodes}, or --num-supernodes "
                f"{cfg.min_available_nodes} (a sweep file's num-supernodes)\n{NOTHING_RAN}")
        device = str(run_config.get("device", ""))
        if federation is not None and not gpu_share and device.startswith("cuda"):
            raise SystemExit(
                f"{what}: device={device!r}, but the ClientApps ask for no GPU share and Ray "
                f"hides the GPU from them: give them one (fedhetero run --gpus-per-client "
                f"0.25, a sweep file's gpus-per-client = 0.25), or device='auto'\n{NOTHING_RAN}")
