"""Malformed replies are rejected one by one, with one log line naming the node and the
problem, and never change the global model: for every registered strategy, a run in which
partition 1 sends a differently malformed reply each round ends with the model (equal up to
float rounding) and failure counts of a run in which partition 1 simply failed in those rounds."""

from __future__ import annotations

import logging

import pytest
import torch
from flwr.app import Error, Message

from simulation.reliability import CORRUPTIONS, kinds_for
from strategies import contract as C
from tests.reliability_common import ALL_STRATEGIES, run

pytestmark = pytest.mark.usefixtures("processes")

PROBLEM_WORDS = {  # what the one log line must say
    "num-examples-missing": "num-examples",
    "num-examples-zero": "num-examples",
    "num-examples-negative": "num-examples",
    "num-examples-fraction": "num-examples",
    "nan-array": "NaN or Inf",
    "inf-array": "NaN or Inf",
    "nan-metric": "NaN or Inf",
    "inf-metric": "NaN or Inf",
    "wrong-key": "keys differ",
    "extra-key": "keys differ",
    "wrong-shape": "expected",
    "wrong-dtype": "expected",
    "no-arrays": "arrays",
    "strategy-metrics-missing": "needs the metric 'local-steps'",
    "scaffold-delta-c-missing": "needs an ArrayRecord 'scaffold-delta-c'",
    "scaffold-delta-c-nan": "NaN or Inf",
    "scaffold-delta-c-wrong-shape": "expected",
    "client-state-round-wrong": "started from its state of round 99",
    "client-state-echo-missing": "needs the metrics 'state-round' and 'state-digest'",
}


def per_round_hook(kinds: list[str], partition_id: int = 1):
    """Round i (1-based) corrupts partition 1's first train reply with kinds[i-1];
    'error' = a failure."""
    seen = set()

    def hook(msg, reply, context):
        if (
            msg.metadata.message_type != "train"
            or context.node_config["partition-id"] != partition_id
        ):
            return reply
        server_round = int(msg.content["config"]["server-round"])
        if server_round in seen or reply.has_error():
            return reply
        seen.add(server_round)
        kind = kinds[server_round - 1]
        if kind == "error":
            return Message(Error(code=0, reason="failed"), reply_to=msg)
        return CORRUPTIONS[kind](reply, msg)

    return hook


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_each_malformed_reply_rejected_with_one_line_model_untouched(strategy, tmp_path, caplog):
    kinds = kinds_for(strategy)  # the generic kinds, then the strategy's own
    rounds_cfg = {"num-server-rounds": len(kinds)}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        grid, _, bad_rounds, bad_model = run(
            strategy,
            tmp_path / "bad",
            3,
            grid_kwargs={"reply_hook": per_round_hook(kinds)},
            **rounds_cfg,
        )
    node = next(n for n, c in grid.contexts.items() if c.node_config["partition-id"] == 1)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and f"node {node}" in r.getMessage().lower()
    ]
    assert len(lines) == len(kinds), lines
    for kind, line in zip(kinds, lines):
        assert PROBLEM_WORDS[kind] in line, (kind, line)
    _, _, failed_rounds, failed_model = run(
        strategy,
        tmp_path / "failed",
        3,
        grid_kwargs={"reply_hook": per_round_hook(["error"] * len(kinds))},
        **rounds_cfg,
    )
    # FedAvg-family strategies find NaN / Inf in arrays while streaming (no second deserialisation),
    # after the weights were normalised over all checked replies; the renormalisation over the
    # accepted ones is exact in math but not in float32, so the models agree to rounding error only.
    assert list(bad_model) == list(failed_model)
    assert all(
        torch.allclose(bad_model[k], failed_model[k], rtol=1e-5, atol=1e-6) for k in bad_model
    )
    counts = (C.LOG_ROUND, C.LOG_CLIENTS_SAMPLED, C.LOG_CLIENTS_RECEIVED, C.LOG_CLIENTS_FAILED,
              C.LOG_MODEL_KEPT)
    assert [{k: r.get(k) for k in counts} for r in bad_rounds] == [
        {k: r.get(k) for k in counts} for r in failed_rounds
    ]
    assert all(abs(a["loss"] - b["loss"]) < 1e-4 for a, b in zip(bad_rounds, failed_rounds))
    assert all(r[C.LOG_CLIENTS_FAILED] == 1 for r in bad_rounds[1:])


@pytest.mark.parametrize("strategy", ["fedavg", "fednova"])
def test_missing_optional_metrics_are_not_an_error(strategy, tmp_path):
    """local-steps is optional outside FedVeca (FedNova derives tau_i with one warning)."""
    hook = per_round_hook(["strategy-metrics-missing"])
    _, _, rounds, _ = run(
        strategy, tmp_path, 3, grid_kwargs={"reply_hook": hook}, **{"num-server-rounds": 1}
    )
    assert rounds[1][C.LOG_CLIENTS_FAILED] == 0
