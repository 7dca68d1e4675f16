"""docs/first-hour.md's recipes, as the page writes them (#58 item 2): each
``fedhetero run --quick ...`` command, with the quick preset (simulation/quick.py) and its
``-c`` overrides, runs on real Fashion-MNIST with the app's ServerApp and ClientApps (in
process, the 4 SuperNodes of --quick as 4 in-process ClientApps) and must end at or above
the accuracy the page says to expect."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fedapp.run_log import read_rounds
from simulation.quick import QUICK_SUPERNODES, quick_overrides
from simulation.reliability import run_inprocess
from simulation.runtime import parse_overrides

PAGE = Path(__file__).resolve().parents[1] / "docs" / "first-hour.md"
RECIPE = re.compile(r"<!-- recipe: (\S+) accuracy >= ([0-9.]+) -->\s*```bash\n(.*?)```", re.S)


def recipes() -> list[tuple[str, float, str]]:
    """(name, expected accuracy, command) of every recipe on the page."""
    return [(name, float(floor), command.strip())
            for name, floor, command in RECIPE.findall(PAGE.read_text())]


def run_config_of(command: str) -> dict:
    """The run config ``fedhetero run`` builds from ``command`` (--quick and -c only)."""
    argv = shlex.split(command)
    assert argv[:3] == ["fedhetero", "run", "--quick"], command
    pairs = [argv[k + 1] for k, arg in enumerate(argv) if arg == "-c"]
    assert len(argv) == 3 + 2 * len(pairs), f"only --quick and -c here: {command}"
    overrides, _ = quick_overrides(parse_overrides(pairs), QUICK_SUPERNODES)
    return overrides


def test_the_page_has_its_three_recipes():
    assert [name for name, _, _ in recipes()] == ["drift-correction", "asynchronous", "width"]


@pytest.mark.parametrize("name, floor, command", recipes(), ids=[r[0] for r in recipes()])
@pytest.mark.usefixtures("processes", "one_torch_thread")
def test_a_recipe_reaches_the_accuracy_the_page_says(name, floor, command, tmp_path):
    config = {**run_config_of(command), "output-dir": str(tmp_path), "run-plots": False}
    _, run_dir = run_inprocess(config, QUICK_SUPERNODES)
    rounds = read_rounds(run_dir)
    assert len(rounds) == config["num-server-rounds"] + 1
    assert rounds[-1]["accuracy"] >= floor, (name, [r.get("accuracy") for r in rounds])
