"""The import graph of stare_lab/: every `import` and `from ... import` statement anywhere in a module
(at its top, in a class, inside a function, under `if TYPE_CHECKING:`) is an arrow to the stare_lab
module it names. An import inside a function still ties the two modules together when it runs, and
one under TYPE_CHECKING names the other module's types in this one's annotations: either way the
importer depends on the imported, so each must point down the layers like any other.

Read by test_import_cycles.py (no ring), test_layers.py (imports point down) and
test_function_imports.py (imports inside functions, each deferring something heavy)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "stare_lab"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a parsed module, wherever it stands."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imported_names(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> set[str]:
    """The dotted names one import statement of module `name` may reach: `from pkg import x` names
    both `pkg` and `pkg.x` (x may be a module); a relative import is resolved from `name`'s package."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    base = node.module or ""
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        parts = package.split(".")
        anchor = parts[: len(parts) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return {base, *(f"{base}.{a.name}" for a in node.names)}


def imports_of(source: str, name: str, modules: set[str], is_package: bool = False) -> set[str]:
    """The modules of `modules` that module `name`, whose text is `source`, imports anywhere."""
    found: set[str] = set()
    for node in import_nodes(ast.parse(source)):
        found |= imported_names(node, name, is_package)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p.read_text(), module_name(p), modules, p.name == "__init__.py") for p in paths}
