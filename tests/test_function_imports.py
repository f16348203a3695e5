"""Imports of stare_lab modules sit at the top of a module, where a reader sees what it depends on. One
inside a function is kept only where it defers something heavy that the module's other callers need not
load (torch, transformers, TRL, matplotlib, W&B...), and says what on its own line, in the repository's
words: `# deferred: <what>`. The command line (cli/, cli/sweep.py) defers nearly everything so that a
refusal imports no torch (docs/design.md, "Fast refusals"); it is left out of the count, not of the
layers (tests/test_layers.py)."""

from __future__ import annotations

import ast
import re

from import_graph import PACKAGE, imported_names, module_name

COMMAND_LINE = ("stare_lab.cli",)  # its commands (cli/sweep.py included) defer nearly everything
LIMIT = 10  # issue 36: 21 outside the command line before it
# What a deferral may be for: the packages whose import costs a refusal, a reading command or a worker seconds.
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "peft",
    "vllm",
    "matplotlib",
    "wandb",
    "pandas",
    "scipy",
    "submitit",
    "optuna",
)
REASON = re.compile(r"#\s*deferred:\s*(.+)$")


def function_imports(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, text) of each import statement of a stare_lab module inside a function (a method, a
    nested function) of module `name`, once each."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and in_function:
            if any(m == "stare_lab" or m.startswith("stare_lab.") for m in imported_names(node, name, is_package)):
                found.append((node.lineno, lines[node.lineno - 1].strip()))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def heavy_reason(line: str) -> str | None:
    """The `# deferred:` reason of an import line when it names a heavy package, else None."""
    m = REASON.search(line)
    if m is None:
        return None
    words = set(re.findall(r"[a-z_]+", m.group(1).lower()))
    return m.group(1) if words & set(HEAVY) else None


def package_function_imports() -> list[str]:
    """`path:line: text` of every stare_lab import inside a function outside the command line."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if any(name == c or name.startswith(c + ".") for c in COMMAND_LINE):
            continue
        for line, text in function_imports(path.read_text(), name, path.name == "__init__.py"):
            out.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text}")
    return out


def test_the_finder_counts_each_import_inside_a_function_once_and_reads_its_reason():
    source = """
import stare_lab.record
from stare_lab.core import utils


def outer():
    from stare_lab.plan import run_plan as plan  # deferred: submitit
    import torch  # deferred: torch (not a stare_lab module: not counted)

    def inner():
        from . import page  # deferred: as in outer

    return inner


class Reader:
    def read(self):
        import stare_lab.analysis.tables as tables  # deferred: pandas
"""
    found = function_imports(source, "stare_lab.viewer.thing")
    assert [line for line, _ in found] == [7, 11, 18]
    assert [heavy_reason(text) for _, text in found] == ["submitit", None, "pandas"]
    assert heavy_reason("from stare_lab.x import y") is None
    assert heavy_reason("from stare_lab.x import y  # deferred: a cycle with z") is None  # names nothing heavy


def test_imports_inside_functions_are_few_and_each_defers_something_heavy():
    found = package_function_imports()
    unexplained = [f for f in found if heavy_reason(f) is None]
    assert unexplained == [], "move these to the top of their module, or say what heavy import each defers"
    assert len(found) <= LIMIT, "\n".join(found)


def test_what_is_left_out_is_the_command_line_that_exists():
    names = {module_name(p) for p in PACKAGE.rglob("*.py")}
    for prefix in COMMAND_LINE:
        assert any(n == prefix or n.startswith(prefix + ".") for n in names), f"{prefix} is gone: update COMMAND_LINE"
