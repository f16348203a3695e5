"""Layer 4, a reader of records: tables, differences between arms, plots, the declared claims' verdicts.
May import layers 1-3; never viewer or dashboard.

Run directories → DataFrames, tables (markdown, LaTeX, CSV) and plots (PNG).

The names below are imported from their modules when first used (PEP 562), so that `stare-lab
table` does not pay for matplotlib and `stare-lab plot` not for what only tables need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "collect_problems": "stare_lab.record.frames",
    "collect_runs": "stare_lab.record.frames",
    "collect_training": "stare_lab.record.frames",
    "run_states": "stare_lab.record.frames",
    "compare_arms": "stare_lab.analysis.compare",
    "holm": "stare_lab.analysis.compare",
    "seeds_needed": "stare_lab.analysis.power",
    "plot_forest": "stare_lab.analysis.plots",
    "plot_passk": "stare_lab.analysis.plots",
    "plot_training": "stare_lab.analysis.plots",
    "Table": "stare_lab.analysis.tables",
    "passk_table": "stare_lab.analysis.tables",
    "results_table": "stare_lab.analysis.tables",
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
    from stare_lab.analysis.compare import compare_arms, holm
    from stare_lab.analysis.plots import plot_forest, plot_passk, plot_training
    from stare_lab.analysis.power import seeds_needed
    from stare_lab.analysis.tables import Table, passk_table, results_table
    from stare_lab.record.frames import collect_problems, collect_runs, collect_training, run_states


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stare_lab.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
