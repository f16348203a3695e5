"""Token viewer: kept generation batches, every rule applied to one batch, the HTML page, figures, W&B.

from stare_lab.viewer import render_run, main_view, plot_selection, collect_for_trainer
"""

from stare_lab.viewer.batch import Batch, BatchError, batch_path, kept_steps, load_batch, load_run_batch, save_batch
from stare_lab.viewer.collect import collect_for_trainer, keep_due, stats_for_all_rules
from stare_lab.viewer.page import ViewError, main_view, render_run, render_sweep

__all__ = [
    "Batch",
    "BatchError",
    "ViewError",
    "batch_path",
    "collect_for_trainer",
    "keep_due",
    "kept_steps",
    "load_batch",
    "load_run_batch",
    "main_view",
    "plot_selection",
    "render_run",
    "render_sweep",
    "save_batch",
    "stats_for_all_rules",
]


def plot_selection(run_dir_or_runs, out_dir):
    """PNG figures of rule selections (see stare_lab.viewer.figures.plot_selection); matplotlib is imported lazily."""
    from stare_lab.viewer.figures import plot_selection as _plot  # deferred: matplotlib

    return _plot(run_dir_or_runs, out_dir)
