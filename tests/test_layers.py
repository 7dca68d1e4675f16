"""ARCHITECTURE.md's layers, read from the source with ``ast`` (tests/import_scan.py).

```
deploy/ ──► simulation.runtime ──► (flwr CLI, processes, Ray)
simulation.runtime ──► fedapp.flower_patches (the flwr CLI it launches, its FAB walk pruned)
deploy/ ──► the app's public entry points (fedapp.__all__, fedapp.flower_patches)
simulation/ ──► fedapp ──► task ──► strategies.contract      strategies ──► flwr, numpy only
fedapp.flower_patches ──► flwr only (the one opt-in module of Flower patches)
```

(``fedhetero deploy`` and ``bench deploy`` run ``python -m deploy`` as a child process: no
module state is shared, so no arrow.)

A layer may import its own modules and whatever its arrows reach, following them on
(``simulation`` reaches ``strategies`` through ``fedapp``); deploy/'s arrow into the app
stops at the names ``fedapp/__init__.py`` lists in ``__all__``. Every import counts:
module level, inside functions, under ``TYPE_CHECKING``, ``import_module("...")`` and a
string that names a module (a dispatch table). And nobody imports a ``_private`` name or
module from another module. A failure names the file, the line and the import.

Flower's internals are patched only in ``fedapp.flower_patches`` (tests/test_flower_patches.py
pins them): no other module assigns to, ``setattr``s or ``delattr``s a name in a flwr
module, nor touches a function's ``__kwdefaults__`` / ``__defaults__`` / ``__code__``.
(Setting a property of a Flower object through its setter, e.g. ``TaskIdentity.run_id``
in an in-process harness as Flower's own runtime does, or ``FLOWER_LOGGER.disabled``, is
using Flower, not patching it.)
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from tests.import_scan import Import, SourceRoot, module_imports, python_files

REPO = Path(__file__).resolve().parents[1]
APP = SourceRoot(REPO)
BARE_APP = SourceRoot(REPO / "simulation" / "bench" / "bare_app")  # a Flower app of its own
LAYERED = ["strategies", "task", "fedapp", "simulation", "deploy"]

# layer -> the layers its arrows point at (ARCHITECTURE.md, "Layers"; module docstring)
ARROWS = {
    "deploy": {"simulation.runtime", "fedapp.flower_patches"},  # + fedapp's public names
    "simulation": {"fedapp", "simulation.runtime"},
    "simulation.runtime": {"fedapp.flower_patches"},  # simulation.runtime.flwr_command
    "fedapp": {"task", "strategies", "fedapp.flower_patches"},
    "task": {"strategies.contract"},
    "strategies": {"strategies.contract"},
    "strategies.contract": set(),
    "fedapp.flower_patches": set(),
    "barefedavg": set(),  # the bench's bare Flower app: nothing of ours
}
PUBLIC_APP_IMPORTERS = {"deploy"}  # may take fedapp.__all__'s names, and only those
# third-party imports a layer may make, where the architecture limits them
THIRD_PARTY = {
    "strategies": {"flwr", "numpy"},
    "strategies.contract": {"flwr", "numpy"},
    "fedapp.flower_patches": {"flwr"},
}
LAZY_THIRD_PARTY = {"strategies.client": {"torch", "torchvision"}}  # inside functions only

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()  # none: every import follows the arrows


def layer_of(module: str) -> str | None:
    """The layer (a key of :data:`ARROWS`) a module of ours belongs to; None: not ours."""
    for layer in ("simulation.runtime", "strategies.contract", "fedapp.flower_patches"):
        if module == layer or module.startswith(f"{layer}."):
            return layer
    top = module.split(".")[0]
    return top if top in ARROWS else None


def reachable(layer: str) -> set[str]:
    """``layer`` and every layer its arrows reach, followed on."""
    seen, todo = {layer}, [layer]
    while todo:
        for nxt in ARROWS[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def public_app_names(root: SourceRoot = APP) -> set[str]:
    """The names ``fedapp/__init__.py`` lists in ``__all__`` (read, not imported)."""
    init = root.folder / "fedapp" / "__init__.py"
    if not init.is_file():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_import(imp: Import) -> str | None:
    """Why ``imp`` takes a private name or module from another module, or None."""
    parts = imp.target.split(".")
    if imp.how in ("import", "from", "call") and any(is_private(p) for p in parts):
        return f"{imp.target} is a private module"
    if imp.name and is_private(imp.name):
        return f"{imp.name} is private to {imp.target}"
    return None


def forbidden(imp: Import, public: set[str]) -> str | None:
    """Why ARCHITECTURE.md forbids ``imp``, or None."""
    importer = layer_of(imp.importer)
    if importer is None:
        return None
    top = imp.target.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return None
    target = layer_of(imp.target)
    if target is None:  # third party
        allowed = THIRD_PARTY.get(importer)
        for prefix, lazy in LAZY_THIRD_PARTY.items():
            if imp.importer.startswith(prefix) and imp.in_function:
                allowed = (allowed or set()) | lazy
        if allowed is not None and top not in allowed:
            return f"{importer} imports only {sorted(allowed)} of other distributions"
        return None
    if target in reachable(importer):
        return None
    if (importer in PUBLIC_APP_IMPORTERS and imp.target == "fedapp"
            and imp.name in public):
        return None
    where = (f"; of the app only fedapp's public names {sorted(public)}"
             if importer in PUBLIC_APP_IMPORTERS else "")
    return (f"{importer} may import only {sorted(reachable(importer) - {importer})}"
            f"{where}")


def tree_imports(root: SourceRoot = APP, bare: SourceRoot | None = BARE_APP,
                 layered=LAYERED) -> list[Import]:
    """Every import of the layered packages (and of the bare app, scanned as its own root)."""
    def is_module(dotted: str) -> bool:
        return root.has_module(dotted) or (bare is not None and bare.has_module(dotted))

    skip = [bare.folder] if bare is not None else []
    found = [imp for path in python_files(root.folder, layered, skip)
             for imp in module_imports(root, path, is_module)]
    if bare is not None:
        found += [imp for path in python_files(bare.folder, ["barefedavg"])
                  for imp in module_imports(bare, path, is_module)]
    return found


def violations(imports: list[Import], public: set[str]) -> list[str]:
    lines = []
    for imp in imports:
        for reason in (forbidden(imp, public), private_import(imp)):
            if reason and (imp.path, imp.target) not in KNOWN_EXCEPTIONS:
                lines.append(f"{imp}: {reason}")
    return lines


# ------------------------------------------------------------------ the tree
@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return tree_imports()


def test_every_import_follows_the_layers(imports):
    assert len({imp.path for imp in imports}) > 100  # the whole tree was read
    bad = violations(imports, public_app_names())
    assert not bad, "imports ARCHITECTURE.md forbids:\n" + "\n".join(bad)


def test_the_known_exception_is_still_needed(imports):
    """Delete an entry of KNOWN_EXCEPTIONS once the import it excuses is gone."""
    present = {(imp.path, imp.target) for imp in imports
               if forbidden(imp, public_app_names())}
    stale = KNOWN_EXCEPTIONS - present
    assert not stale, f"no longer imported, delete from KNOWN_EXCEPTIONS: {sorted(stale)}"


def test_the_apps_public_names_exist():
    import fedapp  # noqa: PLC0415

    assert public_app_names() == set(fedapp.__all__) >= {"check_run_config"}  # deploy run's
    for name in fedapp.__all__:
        assert callable(getattr(fedapp, name)), name
    with pytest.raises(AttributeError, match="no attribute 'registry_probe'"):
        fedapp.registry_probe  # noqa: B018


def test_every_dispatch_table_entry_is_read_as_an_import(imports):
    """The CLIs' command and bench tables name modules; the scan sees each as an import."""
    strings = {(imp.importer, imp.target) for imp in imports if imp.how == "module name"}
    assert ("simulation.bench", "simulation.bench.deploy") in strings
    assert ("simulation.__main__", "simulation.run") in strings
    assert ("simulation.bench", "simulation.bench.efficiency") in strings


# ------------------------------------------------------------------ Flower patches
FUNCTION_INTERNALS = {"__kwdefaults__", "__defaults__", "__code__"}
PATCH_MODULE = "fedapp/flower_patches.py"


def is_flower_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:  # a name in a module, not a module
        return False


def flower_modules(tree: ast.AST) -> set[str]:
    """Names a module binds to a flwr module (``import flwr.x``, ``from flwr.a import b``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names
                      if a.name.split(".")[0] == "flwr"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or "").split(".")[0] == "flwr":
            names |= {a.asname or a.name for a in node.names
                      if is_flower_module(f"{node.module}.{a.name}")}
    return names


def root_name(node: ast.AST) -> str | None:
    """``a`` of ``a.b.c`` (or of ``a``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def flower_patches_in(path: Path, rel: str) -> list[str]:
    """Every place ``path`` patches a flwr module or a function's internals."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    flower = flower_modules(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = getattr(node, "targets", None) or [node.target]
        targets = [t for target in targets
                   for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        for target in targets:
            if isinstance(target, ast.Attribute) and root_name(target) in flower:
                found.append((node.lineno, f"{rel}:{node.lineno}: assigns {ast.unparse(target)}"))
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "setattr", "delattr") and node.args and root_name(node.args[0]) in flower):
            found.append((node.lineno, f"{rel}:{node.lineno}: {ast.unparse(node)}"))
        if isinstance(node, ast.Attribute) and node.attr in FUNCTION_INTERNALS:
            found.append((node.lineno, f"{rel}:{node.lineno}: touches {ast.unparse(node)}"))
    return [line for _, line in sorted(found)]


def test_flower_is_patched_only_in_flower_patches():
    paths = [p for p in python_files(REPO, LAYERED) if p != REPO / PATCH_MODULE]
    patches = [line for p in paths for line in flower_patches_in(p, str(p.relative_to(REPO)))]
    assert not patches, ("Flower patched outside flower_patches.py (move it there, opt-in, "
                         "with a pin in tests/test_flower_patches.py):\n" + "\n".join(patches))
    assert flower_patches_in(REPO / PATCH_MODULE, PATCH_MODULE)  # the scan sees its patches


def test_a_patch_of_flower_elsewhere_is_named(tmp_path):
    path = tmp_path / "grid.py"
    path.write_text(textwrap.dedent("""\
        import time
        import flwr.supercore.superexec.run_superexec
        from flwr.supercore.inflatable import inflatable_utils as u
        from flwr.supernode import start_client_internal
        from flwr.supercore.task_identity import TaskIdentity

        def fast(executor):
            u.pull_objects.__kwdefaults__.update(initial_backoff=0.05)
            start_client_internal.time, x = None, 1
            setattr(u, "pull_objects", None)
            flwr.supercore.superexec.run_superexec.get_executor = lambda *a: executor
            TaskIdentity.run_id = 1  # Flower's own setter: no patch
            time.sleep = None  # not Flower
        """))
    assert flower_patches_in(path, "grid.py") == [
        "grid.py:8: touches u.pull_objects.__kwdefaults__",
        "grid.py:9: assigns start_client_internal.time",
        "grid.py:10: setattr(u, 'pull_objects', None)",
        "grid.py:11: assigns flwr.supercore.superexec.run_superexec.get_executor"]


# ------------------------------------------------------------------ the scan itself
def write(root: Path, files: dict[str, str]) -> None:
    for name, code in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))


def scan(tmp_path: Path, files: dict[str, str], public: set[str] = frozenset()) -> list[str]:
    packages = {"strategies", "task", "fedapp", "simulation", "deploy"}
    write(tmp_path, {f"{p}/__init__.py": "" for p in packages}
          | {"simulation/runtime/__init__.py": "", "strategies/client/__init__.py": ""}
          | files)
    found = tree_imports(SourceRoot(tmp_path), None, sorted(packages))
    return violations(found, set(public))


def test_a_lazy_import_in_task_of_a_strategies_module_is_named(tmp_path):
    bad = scan(tmp_path, {
        "strategies/engine/devices.py": "", "strategies/contract.py": "",
        "task/plot.py": """\
            from strategies import contract
            from strategies.contract import KEY

            def draw():
                from strategies.engine.devices import DeviceProfile
            """})
    assert bad == ["task/plot.py:5: from strategies.engine.devices.DeviceProfile (inside a function): "
                   "task may "
                   "import only ['strategies.contract']"]


def test_import_module_literals_and_dispatch_strings_into_deploy_are_named(tmp_path):
    bad = scan(tmp_path, {
        "deploy/run.py": "", "simulation/run.py": "",
        "simulation/cli.py": """\
            import importlib
            COMMANDS = {"run": "simulation.run", "deploy": "deploy.run"}
            def load():
                return importlib.import_module("deploy.run")
            """})
    assert bad == [
        "simulation/cli.py:2: module name deploy.run: simulation may import only "
        "['fedapp', 'fedapp.flower_patches', 'simulation.runtime', 'strategies', "
        "'strategies.contract', 'task']",
        "simulation/cli.py:4: call deploy.run (inside a function): simulation may import only "
        "['fedapp', 'fedapp.flower_patches', 'simulation.runtime', 'strategies', "
        "'strategies.contract', 'task']"]


def test_relative_imports_are_resolved_before_they_are_judged(tmp_path):
    bad = scan(tmp_path, {
        "simulation/sweep.py": "",
        "simulation/runtime/flwr_cli.py": "from ..sweep import run_sweep\nfrom . import x\n",
        "simulation/runtime/x.py": ""})
    assert bad == ["simulation/runtime/flwr_cli.py:1: from simulation.sweep.run_sweep: "
                   "simulation.runtime may import only ['fedapp.flower_patches']"]


def test_deploy_takes_only_the_apps_public_names(tmp_path):
    files = {"fedapp/registry.py": "", "simulation/runtime/procs.py": "",
             "deploy/run.py": """\
                 from fedapp import check_run_config
                 from fedapp.registry import check_run_config as direct
                 from simulation.runtime import procs
                 from typing import TYPE_CHECKING
                 if TYPE_CHECKING:
                     from fedapp import build_strategy
                 """}
    bad = scan(tmp_path, files, public={"check_run_config"})
    reason = ("deploy may import only ['fedapp.flower_patches', 'simulation.runtime']; of the app "
              "only fedapp's public names ['check_run_config']")
    assert bad == [f"deploy/run.py:2: from fedapp.registry.check_run_config: {reason}",
                   f"deploy/run.py:6: from fedapp.build_strategy: {reason}"]


def test_private_names_and_modules_from_elsewhere_are_named(tmp_path):
    bad = scan(tmp_path, {
        "strategies/records.py": "", "strategies/_impl.py": "",
        "strategies/fedavg.py": """\
            import time as _time
            from .records import _check
            from . import _impl
            from flwr.common.constant import __version__
            """})
    assert bad == ["strategies/fedavg.py:2: from strategies.records._check: _check is "
                   "private to strategies.records",
                   "strategies/fedavg.py:3: from strategies._impl: strategies._impl is a "
                   "private module"]


def test_strategies_import_torch_only_inside_client_helpers(tmp_path):
    bad = scan(tmp_path, {
        "strategies/client/sgd.py": "import numpy\n\ndef step():\n    import torch\n",
        "strategies/aggregate.py": "def f():\n    import torch\n",
        "strategies/client/data.py": "import pandas\n"})
    assert bad == [
        "strategies/aggregate.py:2: import torch (inside a function): strategies imports only "
        "['flwr', 'numpy'] of other distributions",
        "strategies/client/data.py:1: import pandas: strategies imports only "
        "['flwr', 'numpy'] of other distributions"]


def test_the_bare_flower_app_imports_nothing_of_ours(tmp_path):
    app = tmp_path / "bare"
    write(app, {"barefedavg/__init__.py": "", "barefedavg/task.py": "",
                "barefedavg/server_app.py": "from barefedavg.task import MODELS\n"
                                            "from strategies import FedAvg\n"})
    found = [imp for path in python_files(app, ["barefedavg"])
             for imp in module_imports(SourceRoot(app), path)]
    assert violations(found, set()) == [
        "barefedavg/server_app.py:2: from strategies.FedAvg: barefedavg may import only []"]


# ------------------------------------------------------------------ strategies' own layers
# top to bottom: a module may import its own layer and those below it (docs/architecture.md);
# strategies/__init__.py, the package's face, may import any
STRATEGY_LAYERS = ["strategies.client", "strategies.algorithms", "strategies.engine",
                   "strategies.selection", "strategies.contract"]


def strategy_layer(module: str) -> int | None:
    for rank, layer in enumerate(STRATEGY_LAYERS):
        if module == layer or module.startswith(f"{layer}."):
            return rank
    return None


def upward_strategy_imports(imports: list[Import]) -> list[str]:
    """Imports of a higher layer; a registration's ``client_side="strategies.client.x"`` names
    the module the ClientApp imports (a string the server never imports) and is not one."""
    bad = []
    for imp in imports:
        importer, target = strategy_layer(imp.importer), strategy_layer(imp.target)
        if imp.how == "module name" and imp.target.startswith("strategies.client."):
            continue
        if importer is not None and target is not None and target < importer:
            bad.append(f"{imp}: {STRATEGY_LAYERS[importer]} may import only "
                       f"{STRATEGY_LAYERS[importer:]}")
    return bad


def test_strategies_layers_import_only_downwards(imports):
    assert {strategy_layer(imp.importer) for imp in imports} >= set(range(len(STRATEGY_LAYERS)))
    bad = upward_strategy_imports(imports)
    assert not bad, "imports against strategies' layers:\n" + "\n".join(bad)


def test_an_upward_import_in_strategies_is_named():
    up = Import(path="strategies/engine/x.py", line=3, importer="strategies.engine.x",
                target="strategies.algorithms.fedprox", name="Proximal", how="from",
                in_function=True)
    named = Import(path="strategies/algorithms/y.py", line=9, importer="strategies.algorithms.y",
                   target="strategies.client.y", name=None, how="module name", in_function=False)
    down = Import(path="strategies/selection/z.py", line=1, importer="strategies.selection.z",
                  target="strategies.contract", name="Section", how="from", in_function=False)
    [line] = upward_strategy_imports([up, named, down])
    assert line.startswith("strategies/engine/x.py:3") and "strategies.engine may import" in line
