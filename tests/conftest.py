"""Shared pytest fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (as a Ray actor with one CPU gets): on two cores shared with
    other jobs, one thread is ~20x faster than two contended ones, and results do not depend on it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
