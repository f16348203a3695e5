"""No import cycle in stare_lab/: the module import graph, every import statement included (at the top,
inside a function, under `if TYPE_CHECKING:`: each ties the two modules together), has no cycle.
The last one, 13 files from the runner through the viewer's W&B export and the sweep plan to the
worker, closed through `if TYPE_CHECKING:` imports in launchers/jobs.py, which a graph without them did
not see."""

from __future__ import annotations

from import_graph import import_graph, imports_of

# Cycles another change removes; each entry is one known cycle's modules. Empty it with that change.
KNOWN: set[frozenset[str]] = set()  # none: methods/microbatch.py became the trainer's training/token_weights.py


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), each a set of modules
    that import one another in a ring."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_ring_and_nothing_in_a_tree():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_imports_at_every_level():
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.sub", "pkg.sub.e"}
    source = """
from typing import TYPE_CHECKING
import pkg.a
if TYPE_CHECKING:
    from pkg.b import Thing
def f():
    from .c import g
class K:
    def m(self):
        import pkg.sub.e
"""
    assert imports_of(source, "pkg.d", modules) == {"pkg.a", "pkg.b", "pkg.c", "pkg.sub.e"}
    graph = import_graph()
    assert "stare_lab.plan.search_spec" in graph["stare_lab.plan.schema"]  # module level
    assert "stare_lab.run.runner" in graph["stare_lab.sweep.worker"]  # inside execute_run()
    assert "stare_lab.launchers" in graph["stare_lab.plan.search_spec"]  # under TYPE_CHECKING only


def test_no_import_cycles_in_the_package():
    found = set(cycles(import_graph()))
    assert found <= KNOWN, f"import cycles: {sorted(sorted(c) for c in found - KNOWN)}"
