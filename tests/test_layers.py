"""Dependencies point one way: every stare_lab module belongs to one layer, and imports (function
level and `if TYPE_CHECKING:` ones included: tests/support/import_graph.py) only from its own layer or
the layers below it. The three readers of the run record (viewer, analysis, dashboard) share a layer and
do not import one another, except what sits in a lower layer under their names (the kept-batch file
format, the trainer's batch hook, the record reader of analysis).

The layers, bottom up (docs/design.md, "Layers"):

1. core types and the record: the token rules and their types, the statistics, the loss types and
   surrogate, the run record's files, the tasks, the kept-batch file format;
2. configuration and plans: a run's config, its checks, the built-in model's loading, where a vLLM
   server sits in a job, what a sweep file means (its schema, grid and plan, and its launchers: what a
   `launcher:` block means and how its jobs are submitted and watched) and the sweep's record on disk,
   the records read as tables;
3. training: the statistics of a batch, the trainer and TRL's internals, the evaluation, vLLM,
   W&B tracking;
4. readers of records: the token page and figures, the tables and plots, the W&B dashboard;
5. one run: the runner (train, evaluate, draw, publish);
6. sweeps: workers, the driver, search, the server task;
7. the command line.
"""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import import_graph

LAYERS: dict[int, tuple[str, ...]] = {
    1: (
        "stare_lab.utils",
        "stare_lab.controls",
        "stare_lab.stats",
        "stare_lab.loss_types",
        "stare_lab.surrogate",
        "stare_lab.record",
        "stare_lab.figure_stamps",
        "stare_lab.rule_imports",
        "stare_lab.methods",
        "stare_lab.tasks",
        "stare_lab.viewer.batch",
    ),
    2: (
        "stare_lab.config_schema",
        "stare_lab.config",
        "stare_lab.inputs",
        "stare_lab.models",
        "stare_lab.server_layout",
        "stare_lab.sweep.launchers",
        "stare_lab.sweep.jobs",
        "stare_lab.sweep.ranks",
        "stare_lab.sweep.errors",
        "stare_lab.sweep.keys",
        "stare_lab.sweep.schema",
        "stare_lab.sweep.search_spec",
        "stare_lab.sweep.run_spec",
        "stare_lab.sweep.expand",
        "stare_lab.sweep.plan",
        "stare_lab.sweep.records",
        "stare_lab.sweep.status",
        "stare_lab.sweep.threads",
        "stare_lab.sweep.liveness",
        "stare_lab.sweep.lock",
        "stare_lab.analysis.arms",
        "stare_lab.analysis.collect",
        "stare_lab.sweep.claim_spec",
    ),
    3: (
        "stare_lab.signals",
        "stare_lab.token_weights",
        "stare_lab.objective",
        "stare_lab.learning_signal",
        "stare_lab.distributed",
        "stare_lab.trl_internals",
        "stare_lab.trl_loss",
        "stare_lab.trainer",
        "stare_lab.evaluation",
        "stare_lab.vllm_engine",
        "stare_lab.vllm_server",
        "stare_lab.tracking",
        "stare_lab.eval_run",
        "stare_lab.viewer.collect",
    ),
    4: ("stare_lab.viewer", "stare_lab.analysis", "stare_lab.dashboard"),
    5: ("stare_lab.runner",),
    6: ("stare_lab.sweep",),
    7: ("stare_lab.cli", "stare_lab"),
}
READERS = ("stare_lab.viewer", "stare_lab.analysis", "stare_lab.dashboard")

# Imports that go up, each to be removed by the change that moves the code (none today).
KNOWN: set[tuple[str, str]] = set()


def home(module: str) -> tuple[int, str]:
    """(layer, the longest prefix of LAYERS that names `module`)."""
    found = [
        (len(p), layer, p) for layer, ps in LAYERS.items() for p in ps if module == p or module.startswith(p + ".")
    ]
    assert found, f"{module} is in no layer: add it to LAYERS"
    _, layer, prefix = max(found)
    return layer, prefix


def _reader(prefix: str) -> str | None:
    return next((r for r in READERS if prefix == r), None)


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs that go to a higher layer, or across readers."""
    found = set()
    for module, deps in graph.items():
        layer, prefix = home(module)
        for dep in deps:
            if dep == "stare_lab":
                continue
            dep_layer, dep_prefix = home(dep)
            across = _reader(prefix) and _reader(dep_prefix) and _reader(prefix) != _reader(dep_prefix)
            if dep_layer > layer or across:
                found.add((module, dep))
    return found


def test_every_module_has_a_layer():
    for module in import_graph():
        home(module)


def test_the_layer_check_sees_an_upward_import_and_one_across_readers():
    graph = {
        "stare_lab.trainer": {"stare_lab.runner", "stare_lab.methods"},
        "stare_lab.viewer.page": {"stare_lab.analysis.plots"},
    }
    assert upward(graph) == {
        ("stare_lab.trainer", "stare_lab.runner"),
        ("stare_lab.viewer.page", "stare_lab.analysis.plots"),
    }
    assert upward({"stare_lab.viewer.page": {"stare_lab.analysis.collect", "stare_lab.viewer.batch"}}) == set()


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
