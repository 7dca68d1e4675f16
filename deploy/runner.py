"""``flwr run . <connection> --stream`` against a running SuperLink, then its final status."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from simulation.runtime import PROJECT_ROOT, AppRun, flwr_run_command, submit_run


def run_on_connection(connection: str, env: Mapping[str, str],
                      run_config: Mapping[str, object] | None = None, timeout: float = 600.0,
                      capture: bool = False, app_dir: Path = PROJECT_ROOT) -> AppRun:
    """Submit the app, stream its log, and read ``finished:*`` with ``flwr ls``.

    ``env`` must carry the FLWR_HOME whose config.toml has ``connection`` as its default
    (:func:`deploy.connection.write_connection` does that): the status poll uses the
    default connection. ``flwr run`` is killed after ``timeout`` seconds; the result is
    then not ``finished:completed``.
    """
    cmd = flwr_run_command(run_config, app_dir=app_dir, connection=connection)
    return submit_run(cmd, env, app_dir, timeout, capture,
                      timeout_note="give it more time (--timeout)")
