"""Run directories → DataFrames, tables (markdown, LaTeX, CSV) and plots (PNG)."""

from stare_lab.analysis.collect import collect_problems, collect_runs, collect_training, run_states
from stare_lab.analysis.compare import compare_arms, holm, seeds_needed
from stare_lab.analysis.plots import plot_forest, plot_passk, plot_training
from stare_lab.analysis.tables import Table, passk_table, results_table

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
