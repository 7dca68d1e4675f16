"""The suite's three kinds of test (tests/conftest.py) come from the fixtures a test uses, and
hold while it runs: ``make test-fast`` (``pytest -m unit``) starts no SuperLink, app or
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import PROBE_ENV, kind_of


def test_every_collected_test_has_exactly_one_kind(request):
    kinds = {"unit", "app", "deploy"}
    for item in request.session.items:
        marks = kinds & {m.name for m in item.iter_markers()}
        assert marks == {kind_of(item)}, item.nodeid


@pytest.mark.usefixtures("processes")
def test_a_unit_test_that_starts_a_process_fails_naming_the_fixture(tmp_path):
    """A test that starts a process without the ``processes`` fixture fails; with it, or in
    the probe's absence for app tests, it runs."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    (tmp_path / "test_kinds.py").write_text(textwrap.dedent('''
        import subprocess, sys
        import pytest

        def test_sneaky():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        @pytest.mark.usefixtures("processes")
        def test_declared():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_pure():
            assert 1 + 1 == 2
        '''))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rf", str(tmp_path)], capture_output=True, text=True,
                          cwd=request_root(), env=clean_env(), timeout=300)
    assert "1 failed, 2 passed" in done.stdout, done.stdout[-3000:]
    assert "test_sneaky starts a process but uses no `processes` fixture" in done.stdout
    unit = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--co", "-m", "unit", str(tmp_path)], capture_output=True, text=True,
                          cwd=request_root(), env=clean_env(), timeout=300)
    assert "2/3 tests collected" in unit.stdout, unit.stdout[-2000:]


def request_root() -> str:
    from pathlib import Path  # noqa: PLC0415

    return str(Path(__file__).resolve().parents[1])


def clean_env() -> dict:
    import os  # noqa: PLC0415

    return {k: v for k, v in os.environ.items() if k != PROBE_ENV}
