"""The arithmetic behind two figures ``python -m simulation bench efficiency`` prints."""

from __future__ import annotations

import math
import sys

import pytest

from simulation.bench.common import torch_import_mb
from simulation.bench.efficiency import evaluation_bound


def test_the_evaluation_bound_adds_the_evaluation_cpu_split_over_the_workers():
    # 84.9 s ideal, 15.6 s of evaluation on 2 workers: 84.9 / (84.9 + 7.8) = 0.91586...
    assert evaluation_bound(84.9, 15.6, 2) == pytest.approx(84.9 / 92.7)
    assert evaluation_bound(84.9, 15.6, 2) == pytest.approx(0.915857605, abs=1e-9)
    assert evaluation_bound(50.0, 0.0, 4) == 1.0
    # more workers share the same evaluation: the bound rises toward 1
    assert evaluation_bound(50.0, 10.0, 1) < evaluation_bound(50.0, 10.0, 8) < 1.0


def test_torch_import_memory_is_measured_in_a_fresh_process():
    measured = torch_import_mb()
    assert set(measured) == {"peak", "anonymous", "file"}
    assert measured["peak"] > 50  # torch and its libraries, whatever the build
    if sys.platform.startswith("linux"):
        assert measured["anonymous"] > 0 and measured["file"] > 0
        assert measured["anonymous"] + measured["file"] <= measured["peak"] + 1
    else:
        assert math.isnan(measured["anonymous"])
