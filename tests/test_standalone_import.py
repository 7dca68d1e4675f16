"""``strategies`` stands alone: every module imports where torch cannot be imported.

In a fresh interpreter ``sys.modules['torch'] = None`` makes any ``import torch`` fail;
then ``import strategies`` and every module ``pkgutil.walk_packages`` finds under it,
including the client helpers (which import torch only inside their functions).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.user_project import REPO

pytestmark = pytest.mark.usefixtures("processes")

CODE = """
import importlib, pkgutil, sys
sys.modules['torch'] = None
sys.modules['torchvision'] = None
import strategies

names = [m.name for m in pkgutil.walk_packages(strategies.__path__, 'strategies.')]
for name in names:
    importlib.import_module(name)
ours = sorted({m.split('.')[0] for m in sys.modules} & {'task', 'fedapp', 'simulation', 'deploy'})
print('ok', len(names), 'strategies.client.fedveca' in names, ours)
"""


def test_every_strategies_module_imports_without_torch():
    out = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "ok", out.stdout
    # the helpers are walked, and none of our other packages is loaded
    assert out.stdout.strip().endswith("True []"), out.stdout


def test_a_client_helper_says_it_needs_torch_only_when_called():
    code = CODE + (
        "from strategies.client import fedveca_train\n"
        "try:\n"
        "    fedveca_train(None, (None, None), {'local-steps': 2})\n"
        "except ImportError as exc:\n"
        "    print('needs torch:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "needs torch:" in out.stdout
