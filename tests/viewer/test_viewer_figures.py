"""Selection figures: one quadrant and one over-steps PNG per run with kept batches, with content."""

from __future__ import annotations

import numpy as np
from matplotlib.image import imread
from synthetic_batch import write_random_batch

from stare_lab.viewer import plot_selection


def test_plot_selection_writes_both_figures_per_run_with_batches(tmp_path):
    root = tmp_path / "runs" / "sweep"
    for k, name in enumerate(["aaa", "bbb"]):
        for step in (0, 4, 8):
            write_random_batch(root / name, step, B=8, T=12, seed=k)
    (root / "no_batches").mkdir()
    paths = plot_selection(tmp_path / "runs", tmp_path / "figs")
    names = sorted(p.name for p in paths)
    assert names == [
        "selection-quadrant-aaa.png",
        "selection-quadrant-bbb.png",
        "selection-steps-aaa.png",
        "selection-steps-bbb.png",
    ]
    for p in paths:
        img = imread(p)[..., :3]
        assert img.shape[0] > 300 and img.std() > 0.05
    # the green of positive-advantage selections is drawn in the quadrant view
    quad = imread(tmp_path / "figs" / "selection-quadrant-aaa.png")[..., :3]
    green = (np.abs(quad - np.array([0x2C, 0xA0, 0x2C]) / 255).sum(-1) < 0.05).sum()
    assert green > 50
    assert plot_selection(root / "aaa", tmp_path / "one") and plot_selection(root / "no_batches", tmp_path / "x") == []
