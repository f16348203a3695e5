"""PNG figures of what each rule selects (matplotlib, Agg), from a run's kept batches.

- `selection-quadrant-<run>.png`: per rule, the tokens of the last kept batch in the (entropy,
  surprisal) plane, selected ones coloured by advantage sign (STARE's quadrant view); dashed lines
  at the batch medians split the four quadrants.
- `selection-steps-<run>.png`: per rule, the selected fraction and the Jaccard overlap with the
  run's own rule over the kept steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stare_lab.record import run_label  # noqa: E402
from stare_lab.viewer.batch import BATCH_DIR, Batch, BatchError, kept_steps, load_run_batch  # noqa: E402
from stare_lab.viewer.selection import RuleView, apply_all_rules, jaccard, one_thread, selected_fraction  # noqa: E402

DPI = 100
COLOURS = {"A > 0": "#2ca02c", "A < 0": "#d62728", "A = 0": "#7f7f7f"}


def _stem(run_dir: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", run_dir.name).strip("_") or "run"


def find_runs(run_dir_or_runs: Path | str | Iterable[Path | str]) -> list[Path]:
    """Run directories with kept batches: the given ones, or those at most 3 levels below a folder."""
    roots = [run_dir_or_runs] if isinstance(run_dir_or_runs, (str, Path)) else list(run_dir_or_runs)
    found: list[Path] = []
    for root in map(Path, roots):
        candidates = (
            [root]
            if (root / BATCH_DIR).is_dir()
            else sorted(
                p.parent for depth in ("*", "*/*", "*/*/*") for p in root.glob(f"{depth}/{BATCH_DIR}") if p.is_dir()
            )
        )
        found += [d for d in candidates if kept_steps(d)]
    return sorted(dict.fromkeys(found))


def quadrant_figure(batch: Batch, views: list[RuleView], path: Path, title: str) -> Path | None:
    """Selected tokens of each computable rule in the (entropy, surprisal) plane, split by advantage sign."""
    if "entropy" not in batch.stats:
        return None
    shown = [v for v in views if v.computable]
    valid = batch.mask > 0
    H, s = batch.stats["entropy"][valid].numpy(), (-batch.stats["logp"])[valid].numpy()
    adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand_as(batch.mask)
    a = adv[valid].numpy()
    cols = 4
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), sharex=True, sharey=True, squeeze=False)
    h_mid, s_mid = float(_median(H)), float(_median(s))
    for ax, view in zip(axes.flat, shown, strict=False):  # the grid may have more axes than views
        sel = view.selected[valid].numpy()
        ax.scatter(H, s, s=3, c="#d0d0d0", linewidths=0, rasterized=True)
        for label, keep in (("A > 0", a > 0), ("A < 0", a < 0), ("A = 0", a == 0)):
            m = sel & keep
            ax.scatter(H[m], s[m], s=5, c=COLOURS[label], linewidths=0, label=label, rasterized=True)
        ax.axvline(h_mid, ls="--", lw=0.7, c="#555")
        ax.axhline(s_mid, ls="--", lw=0.7, c="#555")
        ax.set_title(f"{view.label}: {selected_fraction(view, batch.mask):.0%}", fontsize=9)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("surprisal −log π")
    for ax in axes[-1, :]:
        ax.set_xlabel("entropy H")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, markerscale=3)
    fig.suptitle(f"{title}: selected tokens at step {batch.step} (dashed: batch medians)", fontsize=10)
    return _save(fig, path)


def _median(x):
    import numpy as np

    return np.median(x) if len(x) else 0.0


def selection_over_steps(run_dir: Path, path: Path, title: str) -> Path | None:
    """Selected fraction of each rule and its Jaccard overlap with the run's rule over the kept steps."""
    steps, frac, overlap = [], {}, {}
    for step in kept_steps(run_dir):
        try:
            batch = load_run_batch(run_dir, step)
        except BatchError:
            continue  # a torn file does not hide the other steps; `stare-lab view` names it
        views = apply_all_rules(batch)
        own = views[0]
        steps.append(step)
        for v in views[1:]:
            frac.setdefault(v.key, []).append(selected_fraction(v, batch.mask) if v.computable else float("nan"))
            ok = v.computable and own.computable
            overlap.setdefault(v.key, []).append(jaccard(v.selected, own.selected) if ok else float("nan"))
    if not steps:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.8, 4.2))
    palette = plt.get_cmap("tab20")
    for i, key in enumerate(frac):  # 20 distinct colours, dashed from the 11th rule on
        style = dict(marker="o", ms=3, label=key, color=palette((2 * i) % 20 + (i >= 10)), ls="-" if i < 10 else "--")
        ax1.plot(steps, frac[key], **style)
        ax2.plot(steps, overlap[key], **style)
    ax1.set(title="selected fraction", xlabel="step", ylabel="fraction of valid tokens", ylim=(0, 1.05))
    ax2.set(
        title=f"Jaccard overlap with this run's rule ({views[0].name})", xlabel="step", ylabel="Jaccard", ylim=(0, 1.05)
    )
    ax2.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.suptitle(f"{title}: kept batches", fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_selection(run_dir_or_runs: Path | str | Iterable[Path | str], out_dir: Path | str) -> list[Path]:
    """Both figures for every run with kept batches (a run dir, a folder of runs, or a list); the PNG paths."""
    out_dir = Path(out_dir)
    with one_thread():
        return [p for run_dir in find_runs(run_dir_or_runs) for p in _run_figures(run_dir, out_dir)]


def _run_figures(run_dir: Path, out_dir: Path) -> list[Path]:
    stem, label = _stem(run_dir), run_label(run_dir)  # files named by run id, figures titled by label
    written: list[Path | None] = []
    try:
        batch = load_run_batch(run_dir)
        written.append(
            quadrant_figure(batch, apply_all_rules(batch), out_dir / f"selection-quadrant-{stem}.png", label)
        )
    except BatchError:
        pass  # the last kept batch is unreadable: the over-steps figure still shows the others
    written.append(selection_over_steps(run_dir, out_dir / f"selection-steps-{stem}.png", label))
    return [p for p in written if p is not None]
