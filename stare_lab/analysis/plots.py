"""Training curves, pass@k curves and forest plots as PNG (matplotlib, Agg canvas, no pyplot state).

Every figure is FIGSIZE at DPI (640 × 400 px): one line per arm (mean over seeds), a shaded band
over seeds (min..max by default, or mean ± std), the baseline drawn black and dashed so it reads
the same in every figure. A forest plot draws each arm's difference to the baseline with its
per-comparison interval (compare.compare_arms), coloured by the verdict after Holm, with a legend.

Each PNG carries a stamp of the rows it plots, its options and this module's code
(stare_lab.record.figure_stamps): a figure already in the folder with the same stamp is kept, not drawn again.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from stare_lab.core.controls import BASE
from stare_lab.record.figure_stamps import code_stamp, current, digest, frame_stamp, metadata
from stare_lab.record.frames import select_settings

FIGSIZE = (6.4, 4.0)  # inches
DPI = 100  # → 640 × 400 px
DEFAULT_TRAINING_METRICS = ("reward", "entropy", "tokens/trained_frac", "tokens/touched_frac")
_PASS_METRIC = re.compile(r"^pass@(\d+)$")
_LABELS = {
    "reward": "reward (mean)",
    "entropy": "entropy (nats/token)",
    "tokens/selected_frac": "fraction of tokens in the rule's selected set",
    "tokens/trained_frac": "fraction of tokens trained (weight ≠ 0)",
    "tokens/touched_frac": "fraction of tokens touched (objective ≠ full's)",
}


def file_stem(name: str) -> str:
    """A metric or benchmark name as a file name: "tokens/selected_frac" → "tokens_selected_frac"."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_")


def _arm_column(df: pd.DataFrame) -> str:
    return "arm" if "arm" in df.columns else "rule"


def _styles(arms: list[str], baseline: str | None) -> dict[str, dict]:
    """Stable colour per arm (sorted names → tab10/tab20), the baseline black and dashed, base grey and dotted."""
    others = sorted(a for a in arms if a != baseline)
    palette = colormaps["tab10" if len(others) <= 10 else "tab20"]
    styles = {a: {"color": palette(i % palette.N), "linestyle": "-"} for i, a in enumerate(others)}
    if baseline in arms:
        styles[baseline] = {"color": "black", "linestyle": "--"}
    if BASE in arms:  # the untrained model: the level every trained arm starts from
        styles[BASE] = {"color": "grey", "linestyle": ":"}
    return styles


def _band(ax, x, wide: pd.DataFrame, style: dict, label: str, band: str) -> None:
    """wide: x × run values. Line = mean over runs; band where at least two runs have a value."""
    mean = wide.mean(axis=1)
    ax.plot(x, mean, label=f"{label} (n={wide.shape[1]})", linewidth=1.6, **style)
    counts = wide.notna().sum(axis=1).to_numpy()
    if wide.shape[1] < 2:
        return
    if band == "std":
        sd = wide.std(axis=1, ddof=1)
        lo, hi = mean - sd, mean + sd
    else:
        lo, hi = wide.min(axis=1), wide.max(axis=1)
    ax.fill_between(x, lo, hi, where=counts >= 2, color=style["color"], alpha=0.18, linewidth=0, interpolate=False)


def _save(fig: Figure, path: Path, stamp: str | None = None) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata=metadata(stamp))
    return path


def _stamp(rows: pd.DataFrame, path: Path, *options) -> str:
    """The stamp of the figure at `path`: the rows it plots, its options and this module's code."""
    return digest(path.name, frame_stamp(rows), options, code_stamp(__file__))


def _new_axes(title: str, xlabel: str, ylabel: str):
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_training(
    train_df: pd.DataFrame,
    out_dir: Path | str,
    metrics: tuple[str, ...] | list[str] | None = None,
    baseline: str | None = "full",
    band: str = "minmax",
) -> list[Path]:
    """One PNG per training metric (`train_<metric>.png`), x = optimizer step.

    train_df: `collect_training` output. metrics: default reward, entropy, tokens/selected_frac
    and every rule/* metric present; default metrics absent from the data are skipped, an
    explicitly requested absent one is a ValueError. band: "minmax" or "std" (over seeds).
    """
    present = list(dict.fromkeys(train_df["metric"])) if len(train_df) else []
    if metrics is None:
        metrics = [m for m in DEFAULT_TRAINING_METRICS if m in present]
        metrics += sorted(m for m in present if m.startswith("rule/"))
    else:
        absent = [m for m in metrics if m not in present]
        if absent:
            raise ValueError(f"no training metric {', '.join(absent)}; present: {', '.join(sorted(present))}")
    arm_col = _arm_column(train_df)
    styles = _styles(sorted(set(train_df[arm_col].astype(str))) if len(train_df) else [], baseline)
    out, paths = Path(out_dir), []
    for metric in metrics:
        rows = train_df[train_df["metric"] == metric]
        path = out / f"train_{file_stem(metric)}.png"
        stamp = _stamp(rows, path, sorted(styles), baseline, band)
        if current(path, stamp):
            paths.append(path)
            continue
        fig, ax = _new_axes(f"Training: {metric}", "optimizer step", _LABELS.get(metric, metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 0.5 ticks on a short run
        for arm, group in sorted(rows.groupby(rows[arm_col].astype(str)), key=lambda kv: (kv[0] != baseline, kv[0])):
            wide = group.pivot_table(index="step", columns="run", values="value", aggfunc="last").sort_index()
            _band(ax, wide.index.to_numpy(), wide, styles[arm], arm, band)
        ax.legend(fontsize=8, loc="best")
        paths.append(_save(fig, path, stamp))
    return paths


def plot_passk(
    df: pd.DataFrame,
    out_dir: Path | str,
    benchmarks: list[str] | None = None,
    baseline: str | None = "full",
    band: str = "minmax",
) -> list[Path]:
    """Per benchmark, pass@k vs k (log2 x axis) per arm with seed bands: `passk_<benchmark>.png`.

    df: `collect_runs` output; final evaluations only; pass@k in percent. A run evaluated under
    several settings is drawn with the setting its benchmark's runs share (collect.select_settings).
    """
    final = df[df["final"].astype(bool)] if len(df) else df
    final, _ = select_settings(final, mix=True)
    rows = final[final["metric"].astype(str).str.match(_PASS_METRIC)] if len(final) else final
    rows = rows.assign(k=rows["metric"].str.extract(_PASS_METRIC, expand=False).astype(int))
    if benchmarks is None:
        benchmarks = sorted(rows["benchmark"].unique())
    arm_col = _arm_column(rows)
    styles = _styles(sorted(set(rows[arm_col].astype(str))), baseline)
    out, paths = Path(out_dir), []
    for bench in benchmarks:
        sub = rows[rows["benchmark"] == bench]
        path = out / f"passk_{file_stem(bench)}.png"
        stamp = _stamp(sub, path, sorted(styles), baseline, band)
        if current(path, stamp):
            paths.append(path)
            continue
        fig, ax = _new_axes(f"pass@k on {bench}", "k (samples)", "pass@k (%)")
        for arm, group in sorted(sub.groupby(sub[arm_col].astype(str)), key=lambda kv: (kv[0] != baseline, kv[0])):
            wide = group.pivot_table(index="k", columns="run", values="value", aggfunc="last").sort_index() * 100
            _band(ax, wide.index.to_numpy(), wide, styles[arm], arm, band)
        ks = sorted(sub["k"].unique())
        ax.set_xscale("log", base=2)
        if ks:
            ax.set_xticks(ks, [str(k) for k in ks])
        ax.legend(fontsize=8, loc="lower right")
        paths.append(_save(fig, path, stamp))
    return paths


# What a forest plot's colours say (its legend): the verdict after Holm, and the per-comparison interval
FOREST_STYLES = {
    "better": ("better: Holm p < {alpha:g}", {"color": "tab:green", "marker": "o", "mfc": "tab:green"}),
    "worse": ("worse: Holm p < {alpha:g}", {"color": "tab:red", "marker": "o", "mfc": "tab:red"}),
    "not_after_holm": (
        "interval excludes 0, n.s. after Holm",
        {"color": "tab:orange", "marker": "o", "mfc": "white"},
    ),
    "n.s.": ("n.s.: interval holds 0", {"color": "dimgray", "marker": "o", "mfc": "dimgray"}),
    "no_interval": ("no interval", {"color": "dimgray", "marker": "x", "mfc": "dimgray"}),
}


def forest_rows(comparison: pd.DataFrame) -> pd.DataFrame:
    """compare_arms' rows with what a forest plot draws: lo, hi (the per-comparison interval, or the
    difference where there is none) and `style`, a key of FOREST_STYLES."""
    rows = comparison.dropna(subset=["delta"]).copy()
    has = rows["ci_lo"].notna() & rows["ci_hi"].notna()
    excludes = has & ((rows["ci_lo"] > 0) | (rows["ci_hi"] < 0))
    verdict = rows["verdict"].astype(str)
    style = np.where(verdict.isin(["better", "worse"]), verdict, np.where(excludes, "not_after_holm", "n.s."))
    rows["style"] = np.where(has, style, "no_interval")
    rows["lo"] = rows["ci_lo"].where(has, rows["delta"])
    rows["hi"] = rows["ci_hi"].where(has, rows["delta"])
    return rows


def forest_figure(rows: pd.DataFrame, bench: str, baseline: str, metric: str, confidence: float, arms: int) -> Figure:
    """One column's forest plot (rows: `forest_rows` of that column); the title says the intervals are per
    comparison, the legend what each colour means."""
    alpha = 1 - confidence
    rows = rows.sort_values(["delta", "arm"])
    fig, ax = _new_axes(
        f"{metric}: difference to {baseline} on {bench}\n"
        f"per-comparison {confidence:.0%} intervals; colour: Holm over {arms} arm{'s' * (arms != 1)}",
        f"difference to {baseline} (points)",
        "",
    )
    y = list(range(len(rows)))
    for yi, r in zip(y, rows.itertuples(index=False), strict=True):
        _, style = FOREST_STYLES[str(r.style)]
        xerr = [[r.delta - r.lo], [r.hi - r.delta]]
        ax.errorbar(
            r.delta, yi, xerr=xerr, fmt=style["marker"], color=style["color"], mfc=style["mfc"], capsize=3, ms=4
        )
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(y, [str(a) for a in rows["arm"]], fontsize=7 if len(rows) > 14 else 9)
    ax.grid(alpha=0.3, axis="y")
    shown = [k for k in FOREST_STYLES if (rows["style"] == k).any()]
    handles = [
        Line2D([], [], linestyle="-", color=FOREST_STYLES[k][1]["color"], marker=FOREST_STYLES[k][1]["marker"],
               mfc=FOREST_STYLES[k][1]["mfc"], ms=4)
        for k in shown
    ]  # fmt: skip
    labels = [FOREST_STYLES[k][0].format(alpha=alpha) for k in shown]
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 3), fontsize=7, frameon=False)
    return fig


def plot_forest(
    comparison: pd.DataFrame,
    out_dir: Path | str,
    baseline: str = "full",
    metric: str = "avg@n",
    confidence: float = 0.95,
) -> list[Path]:
    """Per column of `comparison` (compare_arms' frame: benchmarks and "Avg."), each arm's difference
    to the baseline in points with its per-comparison interval (not adjusted for the other arms), arms
    sorted by difference, coloured by the verdict after Holm; an interval that excludes 0 while Holm's
    p is not below 1 − confidence is drawn hollow and orange, and the legend says so: `forest_<column>.png`."""
    out, paths = Path(out_dir), []
    for bench, rows in comparison.groupby("benchmark", sort=True):
        arms = int(rows["p_value"].notna().sum())  # the tests Holm corrected over
        path = out / f"forest_{file_stem(str(bench)).strip('.')}.png"
        stamp = _stamp(rows, path, baseline, metric, confidence)
        if current(path, stamp):
            paths.append(path)
            continue
        fig = forest_figure(forest_rows(rows), str(bench), baseline, metric, confidence, arms)
        paths.append(_save(fig, path, stamp))
    return paths
