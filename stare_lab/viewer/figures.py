"""PNG figures of what each rule selects (matplotlib, Agg), from a run's kept batches.

- `selection-quadrant-<run>.png`: per rule, the tokens of the last kept batch in the (entropy,
  surprisal) plane, selected ones coloured by advantage sign (STARE's quadrant view); dashed lines
  at the batch medians split the four quadrants.
- `selection-steps-<run>.png`: per rule, the trained and touched fractions (docs/run_record.md, "Token
  fractions") and the Jaccard overlap of its selected set with the run's own rule over the kept steps.

The run's own rule is the one it trained with: for a rule choosing its tokens in the loss or changing
it, its first recorded pass of the loss over the batch (selection.own_views). A run without a kept
batch gets no figure and one line on stderr naming it and why (`batch.why_no_batch`); a run of 0 steps
(`method=base`) has none to keep and gets no line.

Only what changed is drawn: each PNG carries the stamp of what it was drawn from (the run's kept
batch files and config.yaml, by name, size and modification time; the drawing code; matplotlib's
version: `run_stamp`, stare_lab.record.figure_stamps). A run whose figures in the output folder bear its
current stamp is left as it is; one whose own figures (<run>/figures/, drawn when the run published
its token page) bear it has them copied; the others are drawn, in parallel over the cores this process
may use (forked processes, one thread each). The figures in a folder that bear a stamp but belong to
no run plotted now are `stale_figures` (`stare-lab plot` removes them).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from stare_lab.core.utils import start_forked  # noqa: E402
from stare_lab.launchers.threads import busy_elsewhere, decide_threads, usable_cpus  # noqa: E402
from stare_lab.record import CONFIG_FILE, run_label  # noqa: E402
from stare_lab.record.figure_stamps import (  # noqa: E402
    code_stamp,
    config_stamp,
    current,
    digest,
    files_stamp,
    metadata,
    read_stamp,
)
from stare_lab.record.kept_batch import (  # noqa: E402
    BATCH_DIR,
    UNTRAINED,
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


def quadrant_figure(
    batch: Batch, views: list[RuleView], path: Path, title: str, stamp: str | None = None
) -> Path | None:
    """Selected tokens of each computable rule in the (entropy, surprisal) plane, split by advantage sign.

    Every panel has the same limits (those of the batch), so only the outer panels carry tick labels;
    limits, ticks and title positions are set, not searched for (a grid of 21 panels otherwise spent
    most of its ~2 s of CPU laying out shared axes)."""
    if "entropy" not in batch.stats:
        return None
    shown = [(v, c[1]) for v in views if (c := v.computed) is not None]  # (view, its selected tokens)
    valid = batch.mask > 0
    H, s = batch.stats["entropy"][valid].numpy(), (-batch.stats["logp"])[valid].numpy()
    adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand_as(batch.mask)
    a = adv[valid].numpy()
    cols = 4
    rows = max(1, (len(shown) + cols - 1) // cols)
    width, height = 3.2 * cols, 2.8 * rows
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(  # margins in inches, whatever the number of rows
        rows, cols, left=0.75 / width, right=1 - 0.2 / width, bottom=0.55 / height, top=1 - 0.75 / height,
        wspace=0.08, hspace=0.3,
    )  # fmt: skip
    (x_lo, x_hi), (y_lo, y_hi) = _limits(H), _limits(s)
    x_ticks, y_ticks = _ticks(x_lo, x_hi), _ticks(y_lo, y_hi)
    h_mid, s_mid = float(_median(H)), float(_median(s))
    colour = np.array([COLOURS["A < 0"], COLOURS["A = 0"], COLOURS["A > 0"]])[np.sign(a).astype(int) + 1]
    for i, (view, selected) in enumerate(shown):
        row, col = divmod(i, cols)
        ax = fig.add_subplot(grid[row, col])
        sel = selected[valid].numpy()
        ax.scatter(H, s, s=3, c="#d0d0d0", linewidths=0)
        ax.scatter(H[sel], s[sel], s=5, c=colour[sel], linewidths=0)
        ax.axvline(h_mid, ls="--", lw=0.7, c="#555")
        ax.axhline(s_mid, ls="--", lw=0.7, c="#555")
        ax.set(xlim=(x_lo, x_hi), ylim=(y_lo, y_hi))
        # ticks on the outer panels only: the inner ones share their limits, and matplotlib's tick
        # objects were half of the figure's ~0.65 s (a run draws it at its end)
        left, bottom = col == 0, i + cols >= len(shown)  # bottom: nothing below it in its column
        ax.set_xticks(x_ticks if bottom else [])
        ax.set_yticks(y_ticks if left else [])
        ax.set_title(f"{view.label}: {selected_fraction(view, batch.mask):.0%}", fontsize=9, y=1.0, pad=3)
        if left:
            ax.set_ylabel("surprisal −log π")
        if bottom:
            ax.set_xlabel("entropy H")
    handles = [Line2D([], [], ls="", marker="o", ms=4, color=c) for c in COLOURS.values()]
    fig.legend(handles, list(COLOURS), loc="upper right", fontsize=8)
    fig.suptitle(f"{title}: selected tokens at step {batch.step} (dashed: batch medians)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata=metadata(stamp))
    return path


def _limits(x) -> tuple[float, float]:
    """The data range with 5 % margins (matplotlib's own autoscale margins)."""
    lo, hi = (float(np.min(x)), float(np.max(x))) if len(x) else (0.0, 1.0)
    pad = 0.05 * (hi - lo) if hi > lo else 0.5
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float) -> list[float]:
    return [float(t) for t in MaxNLocator(5).tick_values(lo, hi) if lo <= t <= hi]


def _median(x):
    return np.median(x) if len(x) else 0.0


def selection_over_steps(
    run_dir: Path,
    path: Path,
    title: str,
    stamp: str | None = None,
    known: dict[int, tuple[Batch, list[RuleView]]] | None = None,
) -> Path | None:
    """Trained and touched fractions of each rule and the Jaccard overlap of its selected set with the
    run's rule (as it trained) over the kept steps. `known`: {step: (batch, views)} already computed
    (the quadrant view's last step), not computed again."""
    steps: list[int] = []
    trained: dict[str, list[float]] = {}
    touched: dict[str, list[float]] = {}
    overlap: dict[str, list[float]] = {}
    for step in kept_steps(run_dir):
        if known and step in known:
            batch, views = known[step]
        else:
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
            theirs, ours = v.computed, own.computed
            overlap.setdefault(v.label, []).append(
                jaccard(theirs[1], ours[1]) if theirs is not None and ours is not None else float("nan")
            )
        own_tr, own_to = fractions(own, batch.mask) or (float("nan"), float("nan"))
        trained.setdefault(own.label, []).append(own_tr)
        touched.setdefault(own.label, []).append(own_to)
    if not steps:
        return None
    fig = Figure(figsize=(16.8, 4.2), dpi=DPI)
    FigureCanvasAgg(fig)
    # margins set, not searched for (tight_layout was a third of the figure's ~0.3 s): room on the right
    # for the legend of up to 21 rules
    fig.subplots_adjust(left=0.045, right=0.855, bottom=0.13, top=0.8, wspace=0.22)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    palette = matplotlib.colormaps["tab20"]
    for i, key in enumerate(trained):  # 20 distinct colours, dashed from the 11th rule on
        style = dict(marker="o", ms=3, label=key, color=palette((2 * i) % 20 + (i >= 10)), ls="-" if i < 10 else "--")
        for ax, values in ((ax1, trained), (ax2, touched), (ax3, overlap)):
            if len(values.get(key, [])) == len(steps):
                ax.plot(steps, values[key], **style)
    ax1.set(title="trained fraction (weight ≠ 0)", xlabel="step", ylabel="fraction of valid tokens", ylim=(0, 1.05))
    ax2.set(title="touched fraction (objective ≠ full's)", xlabel="step", ylim=(0, 1.05))
    ax3.set(title=f"Jaccard of the selected sets\nwith {own.label}", xlabel="step", ylabel="Jaccard", ylim=(0, 1.05))
    ax3.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.suptitle(f"{title}: kept batches", fontsize=10)
    return _save(fig, path, stamp)


def _save(fig, path: Path, stamp: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata=metadata(stamp))
    return path


def _say(line: str) -> None:
    print(line, file=sys.stderr)


# What a selection figure is drawn from besides the run's files: these modules' code (and the rules').
_DRAWING_CODE = ("viewer/figures.py", "viewer/selection.py", "record/kept_batch.py")  # under stare_lab/


def run_stamp(run_dir: Path) -> str:
    """The stamp of a run's two selection figures: its kept batch files and config.yaml (the label,
    the rule; by content, without the runs folder's path), the code that draws them and applies every
    rule, and matplotlib's version."""
    package = Path(__file__).parents[1]
    code = code_stamp(*(str(package / name) for name in _DRAWING_CODE), str(package / "methods"))
    inputs = files_stamp((run_dir / BATCH_DIR).glob("*.safetensors"))
    return digest("selection", inputs, config_stamp(run_dir / CONFIG_FILE), code)


KINDS = ("quadrant", "steps")


def figure_paths(run_dir: Path, out_dir: Path) -> list[Path]:
    stem = _stem(run_dir)
    return [out_dir / f"selection-{kind}-{stem}.png" for kind in KINDS]


def stale_figures(run_dir_or_runs: Path | str | Iterable[Path | str], out_dir: Path | str) -> dict[str, list[Path]]:
    """{run's file stem: its figures} of the selection figures in `out_dir` that were drawn here (they
    bear a stamp: `read_stamp`) for runs other than these (a run that left the sweep's plan, or whose
    folder was removed). A PNG without the stamp, a user's own, is never among them, whatever its name."""
    out_dir = Path(out_dir)
    wanted = {p.name for run_dir in all_runs(run_dir_or_runs) for p in figure_paths(run_dir, out_dir)}
    stale: dict[str, list[Path]] = {}
    for kind in KINDS:
        prefix = f"selection-{kind}-"
        for path in sorted(out_dir.glob(f"{prefix}*.png")):
            if path.name not in wanted and read_stamp(path) is not None:
                stale.setdefault(path.name[len(prefix) : -len(".png")], []).append(path)
    return stale


def plot_selection(
    run_dir_or_runs: Path | str | Iterable[Path | str],
    out_dir: Path | str,
    say: Callable[[str], None] = _say,
    processes: int | None = None,
) -> list[Path]:
    """Both figures for every run with kept batches (a run dir, a folder of runs, or a list); the PNG paths.
    Every other run is named, with the reason it has no figure, in one line through `say` (stderr).
    Figures already current (in `out_dir`, or the run's own) are kept or copied, not drawn again; the
    others are drawn by `processes` processes at once (default: the usable cores other processes leave
    free)."""
    return start_selection(run_dir_or_runs, out_dir, say, processes)()


def start_selection(
    run_dir_or_runs: Path | str | Iterable[Path | str],
    out_dir: Path | str,
    say: Callable[[str], None] = _say,
    processes: int | None = None,
) -> Callable[[], list[Path]]:
    """`plot_selection` begun: the figures to keep or copy are settled and those to draw are being drawn
    by forked processes when this returns, so the caller can draw others meanwhile; the function it
    returns waits for them and gives `plot_selection`'s answer."""
    out_dir = Path(out_dir)
    runs = all_runs(run_dir_or_runs)
    found: dict[Path, list[Path]] = {}
    draw: list[tuple[Path, str]] = []
    for run_dir in runs:
        if not kept_steps(run_dir):
            if (reason := why_no_batch(run_dir)) != UNTRAINED:
                say(f"stare-lab plot: no selection figures for {run_label(run_dir)} ({run_dir}): {reason}")
            continue
        stamp = run_stamp(run_dir)
        kept = _current_figures(run_dir, out_dir, stamp)
        if kept is None:
            draw.append((run_dir, stamp))
        else:
            found[run_dir] = kept
    drawing = _draw_runs(draw, out_dir, processes)

    def finish() -> list[Path]:
        for (run_dir, _), drawn in zip(draw, drawing(), strict=True):
            if not drawn:
                reason = "none of its kept batches is readable"
                say(f"stare-lab plot: no selection figures for {run_label(run_dir)} ({run_dir}): {reason}")
            found[run_dir] = drawn
        return [p for run_dir in runs for p in found.get(run_dir, [])]

    return finish


def _current_figures(run_dir: Path, out_dir: Path, stamp: str) -> list[Path] | None:
    """The run's two figures in `out_dir` when both bear `stamp` there, or once copied from the run's
    own figures folder where both bear it; None: they are to be drawn."""
    wanted = figure_paths(run_dir, out_dir)
    if all(current(p, stamp) for p in wanted):
        return wanted
    own = figure_paths(run_dir, run_dir / "figures")
    if own != wanted and all(current(p, stamp) for p in own):
        out_dir.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copyfile(src, dst)) for src, dst in zip(own, wanted, strict=True)]
    return None


def _draw_runs(draw: list[tuple[Path, str]], out_dir: Path, processes: int | None) -> Callable[[], list[list[Path]]]:
    """`_run_figures` of each (run, stamp), in order, from the function returned: started now in forked
    processes when there are several runs and free cores (Linux: the usable cores other processes
    leave free, stare_lab.launchers.threads), else drawn here, one thread, when it is called."""
    if processes is None and len(draw) > 1 and usable_cpus() > 1:
        processes = decide_threads(None, {}, usable_cpus(), 1, busy_elsewhere()).threads
    n = min(len(draw), processes or 1)
    return start_forked(_draw_forked, [(run_dir, out_dir, stamp) for run_dir, stamp in draw], n if n > 1 else 0)


def _draw_forked(run_dir: Path, out_dir: Path, stamp: str) -> list[Path]:
    with one_thread():  # n processes on n cores: one thread each
        return _run_figures(run_dir, out_dir, stamp)


def _run_figures(run_dir: Path, out_dir: Path, stamp: str | None = None) -> list[Path]:
    quadrant, steps = figure_paths(run_dir, out_dir)
    label = run_label(run_dir)  # files named by run id, figures titled by label
    written: list[Path | None] = []
    known: dict[int, tuple[Batch, list[RuleView]]] = {}
    try:
        batch = load_run_batch(run_dir)
        known[batch.step] = (batch, apply_all_rules(batch))
        written.append(quadrant_figure(batch, known[batch.step][1], quadrant, label, stamp))
    except BatchError:
        pass  # the last kept batch is unreadable: the over-steps figure still shows the others
    written.append(selection_over_steps(run_dir, steps, label, stamp, known))
    return [p for p in written if p is not None]
