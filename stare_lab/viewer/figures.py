"""PNG figures of what each rule selects (matplotlib, Agg), from a run's kept batches.

- `selection-quadrant-<run>.png`: per rule, the tokens of the last kept batch in the (entropy,
  surprisal) plane, selected ones coloured by advantage sign (STARE's quadrant view); dashed lines
  at the batch medians split the four quadrants.
- `selection-steps-<run>.png`: per rule, the trained and touched fractions (docs/run_record.md, "Token
  fractions") and the Jaccard overlap of its selected set with the run's own rule over the kept steps.

The run's own rule is the one it trained with: for a rule choosing its tokens in the loss or changing
it, its first recorded pass of the loss over the batch (selection.own_views). A run without a kept
batch gets no figure and one line on stderr naming it and why (`batch.why_no_batch`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stare_lab.record import CONFIG_FILE, run_label  # noqa: E402
from stare_lab.viewer.batch import (  # noqa: E402
    BATCH_DIR,
    Batch,
    BatchError,
    kept_steps,
    load_run_batch,
    why_no_batch,
)
from stare_lab.viewer.selection import (  # noqa: E402
    RuleView,
    apply_all_rules,
    fractions,
    jaccard,
    one_thread,
    selected_fraction,
)

DPI = 100
COLOURS = {"A > 0": "#2ca02c", "A < 0": "#d62728", "A = 0": "#7f7f7f"}


def _stem(run_dir: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", run_dir.name).strip("_") or "run"


def find_runs(run_dir_or_runs: Path | str | Iterable[Path | str]) -> list[Path]:
    """Run directories with kept batches: the given ones, or those at most 3 levels below a folder."""
    return [d for d in all_runs(run_dir_or_runs) if kept_steps(d)]


def all_runs(run_dir_or_runs: Path | str | Iterable[Path | str]) -> list[Path]:
    """Run directories, with kept batches or not: the given ones, or those at most 3 levels below a
    folder (a folder holding a run's config.yaml or a batches/ folder)."""
    roots = [run_dir_or_runs] if isinstance(run_dir_or_runs, (str, Path)) else list(run_dir_or_runs)
    found: list[Path] = []
    for root in map(Path, roots):
        if isinstance(run_dir_or_runs, (str, Path)) and not _is_run(root):
            found += sorted(
                {
                    p.parent
                    for depth in ("*", "*/*", "*/*/*")
                    for name in (BATCH_DIR, CONFIG_FILE)
                    for p in root.glob(f"{depth}/{name}")
                }
            )
        else:
            found.append(root)
    return sorted(dict.fromkeys(found))  # a run of the plan not started yet has no folder: named all the same


def _is_run(d: Path) -> bool:
    return (d / BATCH_DIR).is_dir() or (d / CONFIG_FILE).is_file()


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
    """Trained and touched fractions of each rule and the Jaccard overlap of its selected set with the
    run's rule (as it trained) over the kept steps."""
    steps: list[int] = []
    trained: dict[str, list[float]] = {}
    touched: dict[str, list[float]] = {}
    overlap: dict[str, list[float]] = {}
    for step in kept_steps(run_dir):
        try:
            batch = load_run_batch(run_dir, step)
        except BatchError:
            continue  # a torn file does not hide the other steps; `stare-lab view` names it
        views = apply_all_rules(batch)
        own = views[0]
        steps.append(step)
        for v in views:
            if v is own:
                continue
            tr, to = fractions(v, batch.mask) or (float("nan"), float("nan"))
            trained.setdefault(v.label, []).append(tr)
            touched.setdefault(v.label, []).append(to)
            ok = v.computable and own.computable
            overlap.setdefault(v.label, []).append(jaccard(v.selected, own.selected) if ok else float("nan"))
        own_tr, own_to = fractions(own, batch.mask) or (float("nan"), float("nan"))
        trained.setdefault(own.label, []).append(own_tr)
        touched.setdefault(own.label, []).append(own_to)
    if not steps:
        return None
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16.8, 4.2))
    palette = plt.get_cmap("tab20")
    for i, key in enumerate(trained):  # 20 distinct colours, dashed from the 11th rule on
        style = dict(marker="o", ms=3, label=key, color=palette((2 * i) % 20 + (i >= 10)), ls="-" if i < 10 else "--")
        for ax, values in ((ax1, trained), (ax2, touched), (ax3, overlap)):
            if len(values.get(key, [])) == len(steps):
                ax.plot(steps, values[key], **style)
    ax1.set(title="trained fraction (weight ≠ 0)", xlabel="step", ylabel="fraction of valid tokens", ylim=(0, 1.05))
    ax2.set(title="touched fraction (objective ≠ full's)", xlabel="step", ylim=(0, 1.05))
    ax3.set(title=f"Jaccard of the selected sets with {own.label}", xlabel="step", ylabel="Jaccard", ylim=(0, 1.05))
    ax3.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.suptitle(f"{title}: kept batches", fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def plot_selection(
    run_dir_or_runs: Path | str | Iterable[Path | str], out_dir: Path | str, say: Callable[[str], None] = _say
) -> list[Path]:
    """Both figures for every run with kept batches (a run dir, a folder of runs, or a list); the PNG paths.
    Every other run is named, with the reason it has no figure, in one line through `say` (stderr)."""
    out_dir = Path(out_dir)
    paths = []
    with one_thread():
        for run_dir in all_runs(run_dir_or_runs):
            drawn = _run_figures(run_dir, out_dir) if kept_steps(run_dir) else []
            if not drawn:
                reason = why_no_batch(run_dir) if not kept_steps(run_dir) else "none of its kept batches is readable"
                say(f"stare-lab plot: no selection figures for {run_label(run_dir)} ({run_dir}): {reason}")
            paths += drawn
    return paths


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
