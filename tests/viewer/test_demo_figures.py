"""The demo's figure step copies each run's own selection figures (drawn by the run's evaluation
step from the same kept batches) instead of drawing them again, and draws only runs whose figures
are missing or older than a kept batch; the result equals drawing them all (`stare-lab plot`)."""

from __future__ import annotations

import os

from synthetic_batch import write_random_batch

from stare_lab.cli import _plot
from stare_lab.viewer import plot_selection


def _runs(root):
    for k, name in enumerate(["aaa", "bbb", "ccc"]):
        for step in (0, 5):
            write_random_batch(root / name, step, B=8, T=12, seed=k)
        plot_selection(root / name, root / name / "figures")  # what the run's publishing step does
    return root / "aaa", root / "bbb", root / "ccc"


def test_demo_copies_current_run_figures_and_draws_the_others(tmp_path, capsys):
    root = tmp_path / "runs" / "demo"
    fresh, stale, missing = _runs(root)
    marker = (fresh / "figures" / "selection-steps-aaa.png").read_bytes() + b"copied"
    (fresh / "figures" / "selection-steps-aaa.png").write_bytes(marker)  # copied, not drawn: kept as is
    old = stale / "figures" / "selection-quadrant-bbb.png"
    old.write_bytes(b"drawn before the last batch")
    os.utime(old, (1_000_000, 1_000_000))
    (missing / "figures" / "selection-quadrant-ccc.png").unlink()

    _plot(root, tmp_path / "demo" / "figures", "full", reuse_run_figures=True)
    _plot(root, tmp_path / "plot" / "figures", "full")  # `stare-lab plot`: all drawn
    demo, drawn = tmp_path / "demo" / "figures", tmp_path / "plot" / "figures"

    printed = capsys.readouterr().out.splitlines()  # one line per kind of figure and folder, not per file
    assert printed == [
        f"{kind + ':':28s}   3 files  {folder}/selection-{name}-*.png"
        for folder in (demo, drawn)
        for kind, name in (("STARE quadrant views", "quadrant"), ("selection over training", "steps"))
    ]
    assert (
        sorted(p.name for p in demo.iterdir())
        == sorted(p.name for p in drawn.iterdir())
        == [f"selection-{kind}-{run}.png" for kind in ("quadrant", "steps") for run in ("aaa", "bbb", "ccc")]
    )
    assert (demo / "selection-steps-aaa.png").read_bytes() == marker
    for name in (
        "selection-quadrant-aaa.png",
        "selection-quadrant-bbb.png",
        "selection-steps-bbb.png",
        "selection-quadrant-ccc.png",
        "selection-steps-ccc.png",
    ):
        assert (demo / name).read_bytes() == (drawn / name).read_bytes(), name
    assert (demo / "selection-quadrant-bbb.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
