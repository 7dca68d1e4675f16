"""The suite's three kinds of test (tests/conftest.py): each module is classified by what
it runs, so ``make test-fast`` (``pytest -m unit``) starts no SuperLink, app or process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import kind_of

TESTS = Path(__file__).parent
pytestmark = pytest.mark.unit  # its own source names the other kinds' files: marked by hand


@pytest.mark.parametrize("module, kind", [
    ("test_deploy_e2e.py", "deploy"), ("test_warm_superexec.py", "deploy"),
    ("test_flwr_run.py", "app"), ("test_user_project.py", "app"),
    ("test_reliability_resume.py", "app"), ("test_heap.py", "app"),
    ("test_aggregate.py", "unit"), ("test_trust_gate.py", "unit"),
])
def test_modules_are_classified_by_what_they_run(module, kind):
    assert kind_of(str(TESTS / module)) == kind


def test_every_collected_test_has_exactly_one_kind(request):
    kinds = {"unit", "app", "deploy"}
    for item in request.session.items:
        assert len(kinds & {m.name for m in item.iter_markers()}) == 1, item.nodeid
