"""Dependencies point one way: every folder of stare_lab/ (and each of its few top-level modules)
lies in one layer, and imports (function level and `if TYPE_CHECKING:` ones included:
tests/support/import_graph.py) go only to its own folder, a folder of its own layer below it in
LAYERS' order, or a lower layer. No circle joins two folders. The three readers of the run record
(viewer, analysis, dashboard) share a layer and do not import one another.

The layers, bottom up (docs/design.md, "Layers"); inside a layer, a folder may import those listed
before it:

1. core types and the record: `core/` (helpers, the controls' names), `stats.py` (TokenStats),
   `methods/` (the token rules, their types, the loss types and surrogate, rules kept outside the
   package), `record/` (the run record's files, the kept-batch format, the records read as tables),
   `tasks/`;
2. configuration and plans: `models/` (the packaged models, loading any causal LM, the LoRA section),
   `config/` (a run's config and its checks, its inputs, where a vLLM server sits), `launchers/` (what a
   `launcher:` block means; local and Slurm jobs), `plan/` (what a sweep file means, its declared claims,
   its plan and record on disk);
3. one step: `signals/` (the statistics of a batch, across ranks), `training/` (the trainer, the
   objective, TRL's internals, tracking, the kept batches), `evaluation/`, `serving/` (the vLLM server);
4. readers of records: `viewer/`, `analysis/`, `dashboard/`;
5. one run: `run/`;
6. sweeps: `sweep/` (workers, the driver, search, the server task);
7. the command line: `cli/`.
"""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import PACKAGE, import_graph

# layer -> its folders (and top-level modules), bottom up; inside a layer, in the order they may import
LAYERS: dict[int, tuple[str, ...]] = {
    1: ("core", "stats", "methods", "record", "tasks"),
    2: ("models", "config", "launchers", "plan"),
    3: ("signals", "training", "evaluation", "serving"),
    4: ("viewer", "analysis", "dashboard"),
    5: ("run",),
    6: ("sweep",),
    7: ("cli",),
}
TOP_MODULES = {"stats"}  # stare_lab/*.py besides __init__.py (the package's own: layer 7)
READERS = ("stare_lab.viewer", "stare_lab.analysis", "stare_lab.dashboard")

READERS = ("viewer", "analysis", "dashboard")

# Imports that go up, each to be removed by the change that moves the code (none today).
KNOWN: set[tuple[str, str]] = set()

RANK = {folder: (layer, i) for layer, folders in LAYERS.items() for i, folder in enumerate(folders)}


def folder_of(module: str) -> str:
    """The folder (or top-level module) of a stare_lab module; "" for the package itself."""
    parts = module.split(".")
    assert parts[0] == "stare_lab", module
    return parts[1] if len(parts) > 1 else ""


def home(module: str) -> tuple[int, int]:
    """(layer, place inside the layer) of a module's folder; the package itself is the top (7)."""
    folder = folder_of(module)
    if not folder:
        return (7, len(LAYERS[7]))
    assert folder in RANK, f"stare_lab/{folder} is in no layer: add it to LAYERS"
    return RANK[folder]


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs that leave the importer's folder for one at or above it, or go across
    the readers."""
    found = set()
    for module, deps in graph.items():
        here = folder_of(module)
        for dep in deps:
            there = folder_of(dep)
            if dep == "stare_lab" or there == here:
                continue
            across = here in READERS and there in READERS
            if home(dep) >= home(module) or across:
                found.add((module, dep))
    return found


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        here = folder_of(module)
        out.setdefault(here, set()).update(folder_of(d) for d in deps if folder_of(d) != here)
    return out


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_map_names_every_folder_once():
    on_disk = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    mapped = [f for folders in LAYERS.values() for f in folders]
    assert len(mapped) == len(set(mapped)), mapped
    assert set(mapped) == on_disk | top, (sorted(on_disk | top), sorted(mapped))
    assert top == TOP_MODULES and len(top) <= 3, top  # stare_lab/ holds folders and at most three small modules


def test_every_folder_says_what_it_holds_and_may_import():
    for folder in sorted(f for f in RANK if f not in TOP_MODULES):
        doc = (PACKAGE / folder / "__init__.py").read_text().split('"""')[1].splitlines()
        layer = next(n for n, folders in LAYERS.items() if folder in folders)
        assert doc[0].startswith(f"Layer {layer}, "), (folder, doc[0])  # what it holds, in its layer
        assert doc[1].startswith(("May import", "Imports")) or "May import" in doc[1], (folder, doc[1])


def test_every_module_has_a_layer():
    for module in import_graph():
        home(module)


def test_the_layer_check_sees_an_import_that_climbs_one_across_readers_and_a_circle():
    graph = {
        "stare_lab.training.trainer": {"stare_lab.run.runner", "stare_lab.methods"},  # layer 3 -> 5
        "stare_lab.viewer.page": {"stare_lab.analysis.plots"},  # across readers
        "stare_lab.plan.schema": {"stare_lab.launchers.base"},  # down inside layer 2: allowed
        "stare_lab.launchers.base": {"stare_lab.plan.keys", "stare_lab.launchers.jobs"},  # up inside layer 2
        "stare_lab.record.files": {"stare_lab.record.status", "stare_lab.core.utils"},
    }
    assert upward(graph) == {
        ("stare_lab.training.trainer", "stare_lab.run.runner"),
        ("stare_lab.viewer.page", "stare_lab.analysis.plots"),
        ("stare_lab.launchers.base", "stare_lab.plan.keys"),
    }
    assert circles(folder_graph(graph)) == [{"launchers", "plan"}]
    assert upward({"stare_lab.viewer.page": {"stare_lab.record.frames", "stare_lab.record.kept_batch"}}) == set()


def test_no_circle_joins_two_folders():
    assert circles(folder_graph(import_graph())) == []


def test_imports_point_down():
    found = upward(import_graph())
    assert found <= KNOWN, f"imports to a higher layer: {sorted(found - KNOWN)}"
    assert not KNOWN - found, f"KNOWN lists imports that are gone; remove them: {sorted(KNOWN - found)}"


def test_no_test_file_imports_another_test_file():
    """Shared set-ups live in tests/support (or conftest.py fixtures), never in a test_*.py that others
    import: a test file can be read, moved or deleted on its own."""
    tests = Path(__file__).parent
    pattern = re.compile(r"^\s*(?:from|import)\s+(?:tests\.)?(?:\w+\.)*test_\w*", re.M)
    found = [
        f"{path.relative_to(tests)}: {m.group(0).strip()}"
        for path in sorted(tests.rglob("*.py"))
        if "trl_vendor" not in path.parts
        for m in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
