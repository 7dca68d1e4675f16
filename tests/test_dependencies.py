"""Declared dependencies and the dependency direction of ARCHITECTURE.md.

* pyproject's core dependencies are flwr and numpy only; everything else is an extra;
* every third-party module imported anywhere in the tree is declared;
* ``strategies`` loads nothing of ours and no torch; ``task`` loads only ``strategies``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

import pytest

from tests.user_project import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OURS = {"strategies", "task", "fedapp", "simulation", "deploy",
        "tests", "stockapp", "barefedavg"}
SOURCES = ["strategies", "task", "fedapp", "simulation", "deploy",
           "tests", "examples"]
# import name -> distribution name, where they differ
DISTRIBUTION = {"flwr_datasets": "flwr-datasets", "tomli_w": "tomli-w", "PIL": "pillow",
                "yaml": "pyyaml", "mlflow": "mlflow-skinny"}


def requirement_name(spec: str) -> str:
    return re.split(r"[\[<>=!~;\s]", spec, maxsplit=1)[0].lower().replace("_", "-")


def declared(group: str | None = None) -> set[str]:
    if group is None:
        return {requirement_name(s) for s in PYPROJECT["project"]["dependencies"]}
    return {requirement_name(s) for s in PYPROJECT["project"]["optional-dependencies"][group]}


def third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over the tree (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for root in SOURCES:
        single = REPO / root
        for path in [single] if single.is_file() else sorted(single.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OURS:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_core_dependencies_are_flwr_and_numpy_only():
    assert declared() == {"flwr", "numpy"}
    assert set(PYPROJECT["project"]["optional-dependencies"]) >= {"app", "dev"}


def test_every_third_party_import_is_declared():
    everything = declared() | declared("app") | declared("dev") | declared("tracking")
    missing = {top: files for top, files in third_party_imports().items()
               if DISTRIBUTION.get(top, top).lower().replace("_", "-") not in everything}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_install_commands_install_the_extras():
    assert '-e ".[app,dev]"' in (REPO / "Makefile").read_text()
    # dev brings the tracking extra, so CI runs tests/test_tracking.py instead of failing it
    assert "fedhetero[tracking]" in PYPROJECT["project"]["optional-dependencies"]["dev"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=120)
    return set(out.stdout.split())


@pytest.mark.usefixtures("processes")
def test_strategies_import_only_flwr_and_numpy():
    loaded = modules_after("import strategies, strategies.client")
    assert "torch" not in loaded and "task" not in loaded and "fedapp" not in loaded
    ours = {m for m in loaded if m.split(".")[0] in OURS}
    assert ours == {m for m in ours if m.startswith("strategies")}


@pytest.mark.usefixtures("processes")
def test_task_imports_no_flower_server_code_and_of_ours_only_strategies():
    loaded = modules_after("import task.data, task.models, task.partition, task.evaluate")
    assert not any(m.startswith(("flwr.serverapp", "flwr.server", "strategies", "fedapp"))
                   for m in loaded)
    loaded = modules_after("import task.train")  # shares its batch order with strategies.client
    assert {m.split(".")[0] for m in loaded} & OURS == {"task", "strategies"}


BLOCK_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torchvision'):
            raise ImportError('torch is not installed in this environment')
sys.meta_path.insert(0, _NoTorch())
"""


@pytest.mark.usefixtures("processes")
def test_every_strategy_works_where_torch_cannot_be_imported():
    code = BLOCK_TORCH + (
        "from strategies import FedAvg, FedProx, FedNova, FedVeca, DynamicFL\n"
        "import strategies.client\n"
        "for cls in (FedAvg, FedProx, FedNova, FedVeca, DynamicFL):\n"
        "    cls(query_client_info=True)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
