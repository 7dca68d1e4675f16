"""fedhetero's Flower app: ServerApp, ClientApp and the run-config view they share.

The app's public entry points, what a layer that may not import the app's modules (deploy/:
ARCHITECTURE.md, "Layers") may use: Flower loads ``fedapp.server_app:app`` and
``fedapp.client_app:app`` by name (pyproject.toml), and :data:`__all__` lists the rest. They
are imported on first use (PEP 562), so ``import fedapp.client_app`` loads no more than it
needs.
"""

from __future__ import annotations

__all__ = ["check_run_config", "cli_fix", "partition_map_text"]


def __getattr__(name: str) -> object:
    """``check_run_config``: the ServerApp's checks of a run config, before anything starts
    (:func:`fedapp.registry.check_run_config`); ``partition_map_text``: the file run-config
    ``partition-map`` names (:func:`fedapp.partition_map.partition_map_text`)."""
    if name == "check_run_config":
        from .registry import check_run_config  # noqa: PLC0415

        return check_run_config
    if name == "cli_fix":  # a ConfigError's fix as -c key=value (fedapp.config.cli_fix)
        from .config import cli_fix  # noqa: PLC0415

        return cli_fix
    if name == "partition_map_text":
        from .partition_map import partition_map_text  # noqa: PLC0415

        return partition_map_text
    raise AttributeError(f"module 'fedapp' has no attribute {name!r}")
