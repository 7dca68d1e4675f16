"""Shared pytest fixtures, and the suite's three kinds of test.

A test's kind comes from what it uses, the fixtures it requests (directly, through another
fixture, or with ``pytest.mark.usefixtures``; a module fixture that starts a process asks
for ``processes`` itself):

* ``deploy``: it uses ``deployment`` (it starts a SuperLink and SuperNodes);
* ``app``: it uses ``apps`` (it runs the Flower apps in this process: fedapp's ServerApp or
  ClientApp, a user project's) or ``processes`` (it starts processes: ``flwr run``, the
  ServerApp's evaluation process, a fresh interpreter);
* ``unit``: neither; strategies, helpers and files in this one process, on hand-written
  ClientApps at most (``make test-fast`` = ``pytest -m unit``).

The kinds are checked while the tests run (:func:`kinds_are_kept`): a unit test that starts
a process (``subprocess``, ``multiprocessing``) or runs the apps (any ServerApp, fedapp's
ClientApp training) fails, naming the fixture to request. Set
``FEDHETERO_KIND_PROBE=1`` to apply that check to every test (which tests need what).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest
import torch
from flwr.serverapp import ServerApp

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


KIND_DOCS = {"unit": "in one process: strategies, helpers, files (make test-fast)",
             "app": "runs the ServerApp and ClientApps (in-process, user projects, flwr run) "
                    "or starts processes: uses the `processes` fixture",
             "deploy": "starts a SuperLink and SuperNodes: uses the `deployment` fixture"}
PROBE_ENV = "FEDHETERO_KIND_PROBE"


@pytest.fixture(scope="session")
def processes():
    """What a test uses to run the Flower apps or start processes: it makes the test ``app``
    (module docstring)."""


@pytest.fixture(scope="session")
def apps():
    """What a test uses to run the Flower apps in this process (fedapp's ServerApp or
    ClientApp, a user project's): it makes the test ``app``."""


@pytest.fixture(scope="session")
def deployment(processes):
    """What a test uses to start a SuperLink and SuperNodes: it makes the test ``deploy``."""


def kind_of(item: pytest.Item) -> str:
    """``deploy``, ``app`` or ``unit``: the fixtures the test uses (module docstring)."""
    names = set(getattr(item, "fixturenames", ()))
    if "deployment" in names:
        return "deploy"
    return "app" if names & {"processes", "apps"} else "unit"


class ProcessInUnitTest(RuntimeError):
    """A unit test started a process or ran the apps."""


@pytest.fixture(autouse=True)
def kinds_are_kept(request, monkeypatch):
    """A unit test may start no process: ``subprocess`` and ``multiprocessing`` refuse, with
    the fixture that makes the test ``app`` (every test with FEDHETERO_KIND_PROBE=1)."""
    if kind_of(request.node) != "unit" and not os.environ.get(PROBE_ENV):
        yield
        return

    def refuse(*args, **kwargs):
        raise ProcessInUnitTest(
            f"{request.node.nodeid} starts a process but uses no `processes` fixture: it is "
            f"not a unit test; request `processes` (`deployment` for a SuperLink)")

    def refuse_app(*args, **kwargs):
        raise ProcessInUnitTest(
            f"{request.node.nodeid} runs the Flower apps but uses no `apps` fixture: it is "
            f"not a unit test; request `apps`")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr("tests.warm_runner.run_script", refuse)  # a fork of a warm interpreter
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(ServerApp, "__call__", refuse_app)  # any ServerApp: ours, a user's
    monkeypatch.setattr("fedapp.client_app.local_data", refuse_app)  # our ClientApp trains
    yield


def pytest_configure(config):
    for kind, doc in KIND_DOCS.items():
        config.addinivalue_line("markers", f"{kind}: {doc}")


KIND_ORDER = {"deploy": 0, "app": 1, "unit": 2}  # the slowest modules first


def pytest_collection_modifyitems(config, items):
    """Mark each test with its kind, and run the modules with deployments first, then those
    that run apps, then the unit tests, each module's tests together and in their order: with
    ``-n`` workers (``make test``), the long modules start at once and the many short unit
    modules fill the end, instead of one long module starting last."""
    rank: dict[str, int] = {}
    for item in items:
        kind = kind_of(item)
        item.add_marker(getattr(pytest.mark, kind))
        module = item.nodeid.split("::")[0]
        rank[module] = min(rank.get(module, 2), KIND_ORDER[kind])
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (rank[item.nodeid.split("::")[0]], order[id(item)]))
