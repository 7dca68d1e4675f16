"""The trust-gate matrix (issue 41, Deliver 5): every malformed-reply class x every strategy.

One in-process run per strategy through its public API (the registry's strategy,
``strategy.start``, the real ClientApp, :class:`simulation.reliability.FaultGrid`): in round
t partition 1's train reply is malformed with class t (simulation.reliability.trust_matrix).
Each class must leave the round's global model finite and be named in a WARNING with the
hostile node and the field; the run must complete. The client-info query classes all go in
one run per querying strategy (node k + 1 answers with class k), the evaluate classes one
per round.
"""

from __future__ import annotations

import pytest

from simulation.reliability.corruptions import gate_kinds_for
from simulation.reliability.trust_matrix import (
    EVALUATE_CORRUPTIONS,
    MATRIX_STRATEGIES,
    QUERY_CORRUPTIONS,
    QUERYING_STRATEGIES,
    run_evaluate_matrix,
    run_query_matrix,
    run_strategy,
)


def test_the_matrix_has_at_least_20_classes_for_every_strategy():
    assert len(MATRIX_STRATEGIES) == 12
    assert all(len(gate_kinds_for(s)) >= 20 for s in MATRIX_STRATEGIES)


@pytest.mark.parametrize("strategy", MATRIX_STRATEGIES)
@pytest.mark.usefixtures("apps")
def test_every_malformed_train_reply_class(strategy):
    row = run_strategy(strategy)
    assert row.completed, row.error
    kinds = gate_kinds_for(strategy)
    assert [r.kind for r in row.results] == kinds
    failed = {r.kind: (r.model_finite, r.lines) for r in row.results if not r.passed}
    assert not failed, failed
    print(f"\n{strategy}: {row.passed}/{len(kinds)} classes pass")


@pytest.mark.parametrize("strategy", QUERYING_STRATEGIES)
def test_every_malformed_client_info_answer_at_once(strategy):
    run = run_query_matrix(strategy)
    assert run.completed, run.error
    assert run.finite
    assert run.named == {kind: True for kind in QUERY_CORRUPTIONS}


@pytest.mark.parametrize("strategy", ["fedavg", "dynamicfl", "fedadam"])
@pytest.mark.usefixtures("apps")
def test_every_malformed_evaluate_reply_class(strategy):
    # the three aggregate_evaluate implementations: FedAvg family, DynamicFL, Flower's classes
    row = run_evaluate_matrix(strategy)
    assert row.completed, row.error
    assert [r.kind for r in row.results] == list(EVALUATE_CORRUPTIONS)
    assert all(r.passed for r in row.results), [(r.kind, r.lines) for r in row.results]
