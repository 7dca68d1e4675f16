"""Shared setup of the tests/test_reliability_*.py files: a tiny, fast run config for
every registered strategy, in-process runs on simulation.reliability.FaultGrid."""

from __future__ import annotations

import logging

import torch

from fedapp.run_log import TIMING_KEYS, read_rounds
from simulation.reliability import run_inprocess
from simulation.reliability.common import MODEL_FOR, OWN_STRATEGIES
from strategies import contract as C

# fedhetero's own strategies (Flower's fedavgm, ... have tests/test_server_optimizers.py)
ALL_STRATEGIES = OWN_STRATEGIES
ASYNC_STRATEGIES = ["fedasync", "fedbuff"]  # no round to fail: a failed task frees its client
SYNC_STRATEGIES = [s for s in ALL_STRATEGIES if s not in ASYNC_STRATEGIES]

BASE = {
    "dataset": "synthetic",
    "model": "mlp-2nn",
    "partition": "iid",
    "local-steps": 3,
    "batch-size": 10,
    "lr": 0.05,
    "eval-batch-size": 2000,
    "fedveca-tau-init": 2,
    "fedveca-tau-max": 4,
    "dynamicfl-local-steps": 4,
    "dynamicfl-intervals": "1-4",
    "round-timeout": 0.3,
    "drift-diagnostics": False,
    "run-plots": False,  # the plots cost ~0.5 s a run; tests/test_run_outputs.py draws them
}


def config(strategy: str, out, **overrides) -> dict:
    model = {"model": MODEL_FOR[strategy]} if strategy in MODEL_FOR else {}
    rc = {**BASE, "strategy": strategy, "output-dir": str(out), **model, **overrides}
    return {k: v for k, v in rc.items() if k != "dynamicfl-intervals" or strategy == "dynamicfl"}


def run(strategy: str, out, num_nodes: int = 3, grid_kwargs: dict | None = None, **overrides):
    """(grid, run_dir, rounds, final state_dict) of one in-process run."""
    grid, run_dir = run_inprocess(
        config(strategy, out, **overrides), num_nodes, **(grid_kwargs or {})
    )
    return grid, run_dir, read_rounds(run_dir), torch.load(run_dir / "final_model.pt")


def without_timings(rounds: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rounds]


def resend_aside(full: list[dict], resumed: list[dict], first_round: int) -> int:
    """Drop the resend keys (strategies.contract.LOG_RESEND_KEYS) from round ``first_round``
    of both run logs (in place): after a resume the server resends its copies of the
    client state. Returns how many more copies the resumed run sent in that round."""
    extra = 0
    for key in C.LOG_RESEND_KEYS:
        a = full[first_round].pop(key, None)
        b = resumed[first_round].pop(key, None)
        if key == C.LOG_CLIENT_STATE_ATTACHED and a is not None:
            extra = b - a
    return extra


def same_model(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
