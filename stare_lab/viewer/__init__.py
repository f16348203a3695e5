"""Token viewer: kept generation batches, every rule applied to one batch, the HTML page, figures, W&B.

from stare_lab.viewer import render_run, main_view, plot_selection, collect_for_trainer

The names below are imported from their modules when first used (PEP 562, as stare_lab.analysis
does), so that reading a kept-batch file (stare_lab.viewer.batch) or finding a browser does not
import the page's torch, and drawing the page does not import matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "Batch": "batch",
    "BatchError": "batch",
    "batch_path": "batch",
    "kept_steps": "batch",
    "load_batch": "batch",
    "load_run_batch": "batch",
    "save_batch": "batch",
    "collect_for_trainer": "collect",
    "keep_due": "collect",
    "stats_for_all_rules": "collect",
    "plot_selection": "figures",
    "ViewError": "page",
    "main_view": "page",
    "render_run": "page",
    "render_sweep": "page",
}
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

if TYPE_CHECKING:
    from stare_lab.viewer.batch import (
        Batch,
        BatchError,
        batch_path,
        kept_steps,
        load_batch,
        load_run_batch,
        save_batch,
    )
    from stare_lab.viewer.collect import collect_for_trainer, keep_due, stats_for_all_rules
    from stare_lab.viewer.figures import plot_selection
    from stare_lab.viewer.page import ViewError, main_view, render_run, render_sweep


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stare_lab.viewer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stare_lab.viewer.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
