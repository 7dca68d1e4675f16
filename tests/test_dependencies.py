"""The dependency direction of ARCHITECTURE.md, checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

from simulation.launcher import PROJECT_ROOT


def modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    return set(out.stdout.split())


def test_strategies_import_only_flwr_and_numpy():
    loaded = modules_after("import strategies")
    assert "torch" not in loaded and "task" not in loaded and "fedapp" not in loaded
    ours = {m for m in loaded if m.split(".")[0] in {"strategies", "task", "fedapp", "simulation"}}
    assert ours == {m for m in ours if m.startswith("strategies")}


def test_task_imports_no_flower_server_code():
    loaded = modules_after("import task.data, task.models, task.partition, task.train, task.evaluate")
    assert not any(m.startswith(("flwr.serverapp", "flwr.server", "strategies", "fedapp")) for m in loaded)


BLOCK_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torchvision'):
            raise ImportError('torch is not installed in this environment')
sys.meta_path.insert(0, _NoTorch())
"""


def test_every_strategy_works_where_torch_cannot_be_imported():
    code = BLOCK_TORCH + (
        "from strategies import FedAvg, FedProx, FedNova, FedVeca, DynamicFL\n"
        "for cls in (FedAvg, FedProx, FedNova, FedVeca, DynamicFL):\n"
        "    cls()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
