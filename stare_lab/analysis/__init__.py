"""Run directories → DataFrames, tables (markdown, LaTeX, CSV) and plots (PNG).

The names below are imported from their modules when first used (PEP 562), so that `stare-lab
table` does not pay for matplotlib and `stare-lab plot` not for what only tables need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "collect_problems": "collect",
    "collect_runs": "collect",
    "collect_training": "collect",
    "run_states": "collect",
    "compare_arms": "compare",
    "holm": "compare",
    "seeds_needed": "power",
    "plot_forest": "plots",
    "plot_passk": "plots",
    "plot_training": "plots",
    "Table": "tables",
    "passk_table": "tables",
    "results_table": "tables",
}
__all__ = [
    "Table",
    "collect_problems",
    "collect_runs",
    "collect_training",
    "compare_arms",
    "holm",
    "passk_table",
    "plot_forest",
    "plot_passk",
    "plot_training",
    "results_table",
    "run_states",
    "seeds_needed",
]

if TYPE_CHECKING:
    from stare_lab.analysis.collect import collect_problems, collect_runs, collect_training, run_states
    from stare_lab.analysis.compare import compare_arms, holm
    from stare_lab.analysis.plots import plot_forest, plot_passk, plot_training
    from stare_lab.analysis.power import seeds_needed
    from stare_lab.analysis.tables import Table, passk_table, results_table


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stare_lab.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stare_lab.analysis.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
