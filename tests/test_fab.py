"""The app's FAB (what `flwr run` and a deployment ship): Flower builds it under its 10 MB limit,
without the docs' run logs and results."""

from __future__ import annotations

import io
import zipfile

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.common.constant import FAB_MAX_SIZE

from fedapp.flower_patches import collect_files_pruned
from simulation.runtime import PROJECT_ROOT


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # Flower's pathspec use
def test_the_fab_builds_small_and_holds_the_code_not_the_docs(monkeypatch):
    from flwr.cli import build  # noqa: PLC0415

    # the walk every `flwr run` of ours takes (simulation.runtime.flwr_command): the same FAB,
    # without walking the venv (tests/test_flower_patches.py compares the two builds' bytes)
    monkeypatch.setattr(build, "collect_files", collect_files_pruned)
    fab = build_fab_from_disk(PROJECT_ROOT)
    assert len(fab) < FAB_MAX_SIZE / 2, f"FAB of {len(fab)} bytes (Flower's limit {FAB_MAX_SIZE})"
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert not [n for n in names if n.startswith("docs/")]
    for package in ("fedapp/", "strategies/", "task/", "simulation/"):
        assert any(n.startswith(package) for n in names), package
    # the flash fleet's measured data, with its licence (strategies.engine.flash_fleet)
    data = "strategies/engine/flash_data/"
    assert {n for n in names if n.startswith(data)} == {
        f"{data}{f}" for f in ("real2benchmark.json", "benchmark2score.json",
                               "speed_distri.json", "LICENSE.md", "README.md")}
