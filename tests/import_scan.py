"""Every import of a Python source tree, read with ``ast`` (nothing is imported).

An import is any of: ``import a.b``, ``from a import b`` (relative ones resolved), at module
level or inside a function or an ``if TYPE_CHECKING:`` block; ``importlib.import_module("a.b")``,
``import_module("a.b")`` or ``__import__("a.b")`` with a string literal; and a string
literal that is exactly the dotted name of a module of the tree (``"deploy.__main__"`` in a
command table that is later passed to ``import_module``: a dispatch by module name is an
import too). ``tests/test_layers.py`` checks them against ARCHITECTURE.md's arrows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

IMPORT_FUNCTIONS = {"import_module", "__import__"}


@dataclass(frozen=True)
class Import:
    """One import: where it is, what it imports, and how."""

    path: str  # the file, relative to the scanned root
    line: int
    importer: str  # dotted name of the importing module
    target: str  # dotted name of the module imported (a from-import's module, or its submodule)
    name: str | None  # the name a from-import takes from ``target`` when it is no module
    how: str  # "import", "from", "call" (import_module / __import__), "module name"
    in_function: bool  # inside a function body (a lazy import)

    def __str__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        where = " (inside a function)" if self.in_function else ""
        return f"{self.path}:{self.line}: {self.how} {what}{where}"


@dataclass(frozen=True)
class SourceRoot:
    """A folder whose top-level packages / modules are importable by their dotted names."""

    folder: Path

    def module_of(self, path: Path) -> str:
        """Dotted module name of a file below :attr:`folder`."""
        parts = list(path.relative_to(self.folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def has_module(self, dotted: str) -> bool:
        """Whether ``dotted`` names a module or package below :attr:`folder`."""
        if not dotted or any(not part.isidentifier() for part in dotted.split(".")):
            return False
        base = self.folder.joinpath(*dotted.split("."))
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def package_of(importer: str, path: Path) -> str:
    """The package a relative import in ``path`` (module ``importer``) starts from."""
    return importer if path.name == "__init__.py" else importer.rpartition(".")[0]


def resolve_relative(module: str | None, level: int, package: str) -> str:
    """``from <level dots><module> import ...`` inside ``package``, as an absolute name."""
    if level == 0:
        return module or ""
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        raise ValueError(f"relative import beyond the top-level package in {package!r}")
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def is_import_call(node: ast.Call) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in IMPORT_FUNCTIONS


class ImportVisitor(ast.NodeVisitor):
    """Collects :class:`Import` records of one module."""

    def __init__(self, root: SourceRoot, path: Path, is_module) -> None:
        self.root, self.path, self.is_module = root, path, is_module
        self.rel = str(path.relative_to(root.folder))
        self.importer = root.module_of(path)
        self.package = package_of(self.importer, path)
        self.depth = 0  # function nesting
        self.seen_strings: set[int] = set()  # string nodes already read as call arguments
        self.found: list[Import] = []

    def add(self, node: ast.AST, target: str, name: str | None, how: str) -> None:
        self.found.append(Import(self.rel, node.lineno, self.importer, target, name, how,
                                 self.depth > 0))

    def visit_function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(node, alias.name, None, "import")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve_relative(node.module, node.level, self.package)
        for alias in node.names:
            sub = f"{base}.{alias.name}" if base else alias.name
            if alias.name != "*" and self.is_module(sub):
                self.add(node, sub, None, "from")
            else:
                self.add(node, base, alias.name, "from")

    def visit_Call(self, node: ast.Call) -> None:
        if is_import_call(node) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self.seen_strings.add(id(node.args[0]))
            name = node.args[0].value
            if name.startswith("."):
                package = node.args[1].value if len(node.args) > 1 and isinstance(
                    node.args[1], ast.Constant) else self.package
                level = len(name) - len(name.lstrip("."))
                name = resolve_relative(name.lstrip(".") or None, level, package)
            self.add(node, name, None, "call")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if (isinstance(node.value, str) and id(node) not in self.seen_strings
                and "." in node.value and self.is_module(node.value)):
            self.add(node, node.value, None, "module name")


def module_imports(root: SourceRoot, path: Path, is_module=None) -> list[Import]:
    """Every import in the file ``path`` below ``root``; ``is_module(dotted)`` says which
    names are modules (default: the ones below ``root``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    visitor = ImportVisitor(root, path, is_module or root.has_module)
    visitor.visit(tree)
    return visitor.found


def python_files(root: Path, names: Iterable[str], skip: Iterable[Path] = ()) -> Iterator[Path]:
    """The ``.py`` files of the packages / modules ``names`` below ``root``, minus ``skip``
    (folders), in a stable order."""
    skipped = [Path(s).resolve() for s in skip]
    for name in names:
        single = root / f"{name}.py"
        files = [single] if single.is_file() else sorted((root / name).rglob("*.py"))
        for path in files:
            if not any(path.resolve().is_relative_to(s) for s in skipped):
                yield path
