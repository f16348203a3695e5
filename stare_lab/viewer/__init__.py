"""Layer 4, a reader of records: the token page, its figures and the W&B export of kept batches.
May import layers 1-3; never analysis or dashboard.

Token viewer: kept generation batches, every rule applied to one batch, the HTML page, figures, W&B.

from stare_lab.viewer import render_run, main_view, plot_selection, collect_for_trainer

The names below are imported from their modules when first used (PEP 562, as stare_lab.analysis
does), so that reading a kept-batch file (stare_lab.record.kept_batch) or finding a browser does not
import the page's torch, and drawing the page does not import matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "Batch": "stare_lab.record.kept_batch",
    "BatchError": "stare_lab.record.kept_batch",
    "batch_path": "stare_lab.record.kept_batch",
    "kept_steps": "stare_lab.record.kept_batch",
    "load_batch": "stare_lab.record.kept_batch",
    "load_run_batch": "stare_lab.record.kept_batch",
    "save_batch": "stare_lab.record.kept_batch",
    "collect_for_trainer": "stare_lab.training.kept_batches",
    "keep_due": "stare_lab.training.kept_batches",
    "stats_for_all_rules": "stare_lab.training.kept_batches",
    "plot_selection": "stare_lab.viewer.figures",
    "ViewError": "stare_lab.viewer.page",
    "main_view": "stare_lab.viewer.page",
    "render_run": "stare_lab.viewer.page",
    "render_sweep": "stare_lab.viewer.page",
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
    from stare_lab.record.kept_batch import (
        Batch,
        BatchError,
        batch_path,
        kept_steps,
        load_batch,
        load_run_batch,
        save_batch,
    )
    from stare_lab.training.kept_batches import collect_for_trainer, keep_due, stats_for_all_rules
    from stare_lab.viewer.figures import plot_selection
    from stare_lab.viewer.page import ViewError, main_view, render_run, render_sweep


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stare_lab.viewer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
