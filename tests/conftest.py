"""Shared pytest fixtures, and the suite's three kinds of test.

Every test is marked ``unit`` (in one process: strategies, helpers, files; the fast
target ``make test-fast`` = ``pytest -m unit``), ``app`` (runs the ServerApp and
ClientApps: in-process runs, user projects, ``flwr run``; or starts fresh processes) or
``deploy`` (starts a SuperLink and SuperNodes). A module is classified by what its source calls (:data:`KINDS`, first match
wins); a module that sets one of the three marks itself keeps it. ``make test`` runs all.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest
import torch

from simulation.runtime.flwr_cli import CONTROL_PORT_ENV, HTTP_PORT_ENV
from simulation.runtime.processes import free_port
from task.cache import ROOT_ENV


@pytest.fixture(autouse=True, scope="session")
def private_data_cache(tmp_path_factory):
    """The on-disk data cache of every ClientApp a test runs (in-process, flwr run, deployed)
    lives in a folder of this session, never in the user's ~/.cache."""
    previous = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(tmp_path_factory.mktemp("data-cache"))
    yield
    if previous is None:
        os.environ.pop(ROOT_ENV, None)
    else:
        os.environ[ROOT_ENV] = previous


@pytest.fixture(autouse=True)
def own_local_superlink_ports(monkeypatch):
    """Every test's ``flwr run`` (``run_app``, with or without ``isolate_ports``) gets free
    ports for the local SuperLink that flwr starts, never Flower's default 39091, which
    another SuperLink on the machine may hold (a test that sets its own keeps them)."""
    monkeypatch.setenv(HTTP_PORT_ENV, str(free_port()))
    monkeypatch.setenv(CONTROL_PORT_ENV, str(free_port()))


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (as a Ray actor with one CPU gets): on two cores shared with
    other jobs, one thread is ~20x faster than two contended ones, and results do not depend on it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


KINDS = (
    ("deploy", re.compile(r"LocalDeployment|tests\.deployed|from deploy import cluster|"
                          r"deploy\.warm_superexec|run_on_connection")),
    ("app", re.compile(r"run_inprocess|submit_run|flwr_run_command|run_app\(|user_project|"
                       r"stock_app|FaultGrid|fedapp\.server_app|\"-m\", \"simulation|"
                       r"subprocess|multiprocessing|get_context\(")),  # fresh processes
)
KIND_DOCS = {"unit": "in one process: strategies, helpers, files (make test-fast)",
             "app": "runs the ServerApp and ClientApps (in-process, user projects, flwr run)",
             "deploy": "starts a SuperLink and SuperNodes"}


@functools.lru_cache(maxsize=None)
def kind_of(path: str) -> str:
    """``deploy``, ``app`` or ``unit`` for the test module at ``path`` (module docstring)."""
    source = Path(path).read_text()
    for kind, pattern in KINDS:
        if pattern.search(source):
            return kind
    return "unit"


def pytest_configure(config):
    for kind, doc in KIND_DOCS.items():
        config.addinivalue_line("markers", f"{kind}: {doc}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(kind) for kind in KIND_DOCS):
            item.add_marker(getattr(pytest.mark, kind_of(str(item.fspath))))
