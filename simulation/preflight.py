"""A run's config checked in the driver before ``flwr run`` starts, by the rules the
ServerApp applies before training (:func:`fedapp.registry.check_run_config`: the keys'
types and values, the strategy's own checks; the data, a checkpoint to resume and the
tracking packages are still checked where the ServerApp runs). A typo then fails at once,
not after the SuperLink, Ray and the ServerApp have started, and a sweep checks every run
before its first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedapp.registry import check_run_config


def refuse_bad_run_configs(runs: Iterable[tuple[str, Mapping[str, object]]]) -> None:
    """SystemExit with the ServerApp's own message, prefixed by ``what``, for the first
    ``(what, run_config)`` pair whose run config (overrides of pyproject.toml's defaults)
    would stop the run; nothing has started yet."""
    for what, run_config in runs:
        try:
            check_run_config(run_config)
        except ValueError as exc:  # ConfigError and the strategies' own checks
            raise SystemExit(f"{what}: {exc}\n(checked before flwr run started; nothing ran)") \
                from None
