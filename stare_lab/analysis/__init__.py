"""Run directories → DataFrames, tables (markdown, LaTeX, CSV) and plots (PNG)."""

from stare_lab.analysis.collect import collect_runs, collect_training, run_states
from stare_lab.analysis.plots import plot_passk, plot_training
from stare_lab.analysis.tables import Table, passk_table, results_table

__all__ = [
    "Table",
    "collect_runs",
    "collect_training",
    "passk_table",
    "plot_passk",
    "plot_training",
    "results_table",
    "run_states",
]
