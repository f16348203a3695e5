"""The modules a viewer refusal reads (`stare-lab view` on a run that kept no batch) import torch only
inside the functions that write or read tensors, so the refusal itself need not load it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import stare_lab

PACKAGE = Path(stare_lab.__file__).parent


def module_level_torch_imports(path: Path) -> list[int]:
    """Line numbers of `import torch…` / `from torch… import` run at import time (TYPE_CHECKING blocks excluded)."""
    lines = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            names = [a.name for a in sub.names] if isinstance(sub, ast.Import) else []
            if isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in ("torch", "safetensors"):
                lines.append(sub.lineno)
            elif any(n.split(".")[0] in ("torch", "safetensors") for n in names):
                lines.append(sub.lineno)
    return lines


@pytest.mark.parametrize("relative", ["stats.py", "record/kept_batch.py"])
def test_module_imports_torch_only_inside_functions(relative):
    assert module_level_torch_imports(PACKAGE / relative) == []


def test_importing_the_statistics_table_leaves_torch_unloaded():
    code = "import sys, stare_lab.stats; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr
