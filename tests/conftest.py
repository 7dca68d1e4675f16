"""Shared pytest fixtures."""

from __future__ import annotations

import os

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
