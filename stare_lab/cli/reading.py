"""The commands that read the run record: `table`, `plot`, `view` and `dashboard` (`sweep status`
is stare_lab.cli.sweep's). They read a sweep's current plan from its file, work from the records
alone (no rule kept outside the package is imported: stare_lab.methods.outside.reading), and import
pandas, matplotlib and the viewer's torch only once the target and options have been checked, so
that a refusal never pays for them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from stare_lab.cli.common import OneLineParser, UserError, parse
from stare_lab.core.utils import atomic_write_text
from stare_lab.dashboard import main as dashboard_main
from stare_lab.plan.run_plan import current_runs
from stare_lab.plan.schema import load_sweep
from stare_lab.record import CONFIG_FILE
from stare_lab.record.kept_batch import BATCH_DIR, kept_steps, why_no_batch

if TYPE_CHECKING:
    import pandas as pd

    from stare_lab.analysis.tables import Table

# and `sweep status` (stare_lab.cli.sweep), `claims` (cli/claims.py)
READING_COMMANDS = ("table", "plot", "view", "dashboard", "claims")
Runs = Path | list[Path]  # a folder of run directories, or the run directories of a plan


# -- a sweep's runs ------------------------------------------------------------------------------


def _sweep_root(path: Path) -> Path:
    """A sweep YAML (or a packaged sweep's name) → its run folder (<output>/<name>); a folder is taken as is."""
    return _sweep_runs(path, all_runs=True)[0]


def _sweep_runs(path: Path, all_runs: bool = False) -> tuple[Path, Runs]:
    """(the sweep's run folder, what to read): for a sweep YAML the run directories of its current
    plan (runs left from an earlier grid are left out, said once on stderr), or with `all_runs`
    the whole folder; a folder is taken as is."""
    if path.is_dir():
        return path, path
    if not path.is_file() and (path.suffix or len(path.parts) > 1):
        raise UserError(f"no such sweep file or run folder: {path}")
    spec = load_sweep(path, reading=True)  # from the records: no rule kept outside the package imported
    root = Path(spec.output) / spec.name
    if all_runs or spec.search is not None or not root.is_dir():  # a search's trials are its plan
        return root, root
    from stare_lab.record.frames import find_run_dirs  # deferred: pandas

    plan = current_runs(spec)
    planned = {d.name for _, d in plan}
    present = find_run_dirs(root)
    others = [d for d in present if d.name not in planned]
    if others:
        print(
            f"stare-lab: {len(others)} run(s) under {root} are not in the current plan and are left out "
            "(--all-runs shows them; `sweep status` says how to remove them)",
            file=sys.stderr,
        )
    recorded = {d.name for d in present}
    _say_not_started([label for label, d in plan if d.name not in recorded], root)
    return root, [d for d in present if d.name in planned]


def _say_not_started(labels: list[str], root: Path) -> None:
    """One line naming the planned runs that have no record yet: a table or a figure without them
    says so, it does not leave them out silently."""
    if labels:
        names = ", ".join(labels[:6]) + (f" and {len(labels) - 6} more" if len(labels) > 6 else "")
        print(
            f"stare-lab: {len(labels)} planned run(s) have no record under {root} yet and are not shown: "
            f"{names} (`sweep status` gives their state)",
            file=sys.stderr,
        )


# -- table ---------------------------------------------------------------------------------------


def cmd_table(argv: list[str]) -> int:
    """The sweep's results table (and with --out its files, with --wandb its W&B summary run)."""
    a = parse(_table_parser(), argv)
    where, baseline = _table_options(a)
    root, runs = _sweep_runs(a.sweep, a.all_runs)
    from stare_lab.analysis import collect_runs  # deferred: pandas

    df = collect_runs(runs)
    if df.empty:
        raise UserError(f"no evaluation results under {root} yet")
    table, passk = _tables(a, runs, df, where, baseline)
    if a.seeds_needed is not None:
        print(table.seeds_markdown(a.seeds_needed))
        return 0
    for note in table.notes:
        if note.startswith("Warning: runs come from different code"):
            print(f"stare-lab: {note}", file=sys.stderr)
    rendered = {"md": table.to_markdown(), "latex": table.to_latex(), "csv": table.to_csv()}
    print(rendered[a.format])
    if a.out:
        for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv")):
            atomic_write_text(a.out / f"results.{ext}", rendered[fmt])
        for bench, t in passk.items():
            atomic_write_text(a.out / f"passk_{bench}.md", t.to_markdown())
    if a.wandb:
        _table_to_wandb(root, runs, df, table, passk, baseline)
    return 0


def _table_parser() -> OneLineParser:
    p = OneLineParser(prog="stare-lab table")
    p.add_argument("sweep", type=Path, help="sweep YAML or a folder of run directories")
    p.add_argument("--format", choices=["md", "latex", "csv"], default="md")
    p.add_argument("--baseline", default="full", help="the arm differences are taken against; none: means only")
    p.add_argument("--metric", default=None)
    p.add_argument("--confidence", type=float, default=0.95, help="of the differences' intervals, in (0, 1)")
    p.add_argument(
        "--seeds-needed",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="DELTA",
        help="print only the seeds per arm needed to detect DELTA points (default 2) with power 0.8",
    )
    p.add_argument("--out", type=Path, default=None, help="also write md, tex and csv files to this folder")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only results evaluated with this setting (n, temperature, top_p, max_tokens, verifier)",
    )
    p.add_argument(
        "--mix-settings",
        action="store_true",
        help="allow one column to hold results under different evaluation settings (noted)",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also put the table and the pass@k curves into one summary W&B run of the sweep's group",
    )
    p.add_argument("--all-runs", action="store_true", help="also runs not in the sweep's current plan")
    return p


def _table_options(a: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """(the --where settings, the baseline arm or None), the options refused before any record is read."""
    if not 0 < a.confidence < 1:
        raise UserError(f"--confidence {a.confidence:g}: expected a value in (0, 1)")
    if a.seeds_needed is not None and not a.seeds_needed > 0:
        raise UserError(f"--seeds-needed {a.seeds_needed:g}: expected a difference in points > 0")
    where = dict(w.split("=", 1) for w in a.where if "=" in w)
    if len(where) != len(a.where):
        raise UserError(f"--where: expected KEY=VALUE, got {a.where}")
    return where, None if a.baseline.lower() == "none" else a.baseline


def _tables(
    a: argparse.Namespace, runs: Runs, df: pd.DataFrame, where: dict[str, str], baseline: str | None
) -> tuple[Table, dict[str, Table]]:
    """(the results table, the pass@k table of each benchmark when they are written: --out, --wandb);
    results that can not be compared are refused in one line."""
    from stare_lab.analysis import (  # deferred: pandas, scipy
        collect_problems,
        collect_training,
        passk_table,
        results_table,
        run_states,
    )
    from stare_lab.analysis.compare import ComparisonError
    from stare_lab.record.frames import SettingsMismatch

    try:
        table = results_table(
            df,
            metric=a.metric,
            baseline=baseline,
            expected=run_states(runs),
            where=where,
            mix_settings=a.mix_settings,
            per_problem=collect_problems(runs) if baseline else None,
            confidence=a.confidence,
            training=collect_training(runs) if baseline else None,
        )
        benchmarks = sorted(df["benchmark"].unique()) if a.out or a.wandb else []
        passk = {b: passk_table(df, b, baseline=baseline, where=where, mix_settings=a.mix_settings) for b in benchmarks}
    except (SettingsMismatch, ComparisonError) as e:
        raise UserError(str(e)) from None
    return table, passk


def _table_to_wandb(
    root: Path, runs: Runs, df: pd.DataFrame, table: Table, passk: dict[str, Table], baseline: str | None
) -> None:
    """The finished table, its forest plot and the pass@k curves in one summary run of the sweep's
    W&B group (offline without a key), in the W&B project and entity its runs logged to."""
    from stare_lab.analysis import plot_forest, plot_passk  # deferred: matplotlib; then wandb and the viewer's torch
    from stare_lab.viewer.wandb_export import log_sweep_summary

    figures = plot_passk(df, root / "figures", baseline=baseline)
    if baseline is not None and table.comparison is not None and not table.comparison.empty:  # None: no baseline
        figures += plot_forest(
            table.comparison, root / "figures", baseline=baseline, metric=table.metric, confidence=table.confidence
        )
    log_sweep_summary(root.name, table, passk, figures, out_dir=root, **_wandb_target(runs))
    print(f"stare-lab: W&B summary run of sweep {root.name!r} written under {root / 'wandb'}", file=sys.stderr)


def _wandb_target(runs: Runs) -> dict[str, str]:
    """{project, entity} of the W&B runs of a sweep (its first run's logger config); {} if none says."""
    dirs = runs if isinstance(runs, list) else sorted(p.parent for p in runs.glob(f"*/{CONFIG_FILE}"))
    for d in dirs:
        path = Path(d) / CONFIG_FILE
        if path.is_file():
            logger = (yaml.safe_load(path.read_text()) or {}).get("logger") or {}
            return {k: logger[k] for k in ("project", "entity") if logger.get(k)}
    return {}


# -- plot ----------------------------------------------------------------------------------------


def cmd_plot(argv: list[str]) -> int:
    p = OneLineParser(prog="stare-lab plot")
    p.add_argument("sweep", type=Path)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--baseline", default="full", help="the arm of the forest plot's differences")
    p.add_argument("--all-runs", action="store_true", help="also runs not in the sweep's current plan")
    p.add_argument(
        "--no-selection",
        action="store_true",
        help="leave out the per-run selection figures (two per run that kept batches): none drawn or removed",
    )
    a = parse(p, argv)
    root, runs = _sweep_runs(a.sweep, a.all_runs)
    _plot(runs, a.out or root / "figures", a.baseline, selection=not a.no_selection)
    return 0


def _plot(root: Runs, out: Path, baseline: str, reuse_run_figures: bool = True, selection: bool = True) -> None:
    """Training, pass@k and selection figures of the runs (a folder or a list of run dirs) into
    `out`; prints one line per kind of figure. A figure whose stamp says it was drawn from the same
    records by the same code is kept, not drawn again (stare_lab.record.figure_stamps); the runs' own
    selection figures are reused the same way (`reuse_run_figures` is kept for callers: reuse is
    always on, as it can only give the same bytes). The selection figures to draw are started first,
    in forked processes, and drawn while this process draws the others. `selection`: draw them, and
    remove those of runs no longer plotted (`_remove_stale_figures`); without it they are left alone."""
    selection_figures: Callable[[], list[Path]] = list
    if selection:
        from stare_lab.viewer.figures import start_selection  # deferred: the viewer's torch and matplotlib

        selection_figures = start_selection(root, out)
    from stare_lab.analysis import collect_runs, collect_training, plot_passk, plot_training  # deferred: pandas

    paths = []
    train = collect_training(root)
    if not train.empty:
        paths += plot_training(train, out, baseline=baseline)
    evals = collect_runs(root)
    if not evals.empty:
        paths += plot_passk(evals, out, baseline=baseline)
        paths += _forest(root, evals, out, baseline)
    paths += selection_figures()
    if selection:
        _remove_stale_figures(root, out)
    if not paths:
        raise UserError(f"nothing to plot under {root if isinstance(root, Path) else 'the current plan'}")
    for line in output_lines(paths):
        print(line)


def _remove_stale_figures(runs: Runs, out: Path) -> None:
    """The selection figures this command drew into `out` for runs not plotted now (a run that left the
    sweep's plan, or whose folder was removed) are removed, said in one line on stderr; a file that
    does not bear a figure's stamp (a user's own) is never touched (viewer.figures.stale_figures)."""
    from stare_lab.viewer.figures import stale_figures  # deferred: the viewer's torch and matplotlib

    stale = stale_figures(runs, out)
    figures = [p for paths in stale.values() for p in paths]
    for path in figures:
        path.unlink(missing_ok=True)
    if figures:
        n, k = len(figures), len(stale)
        print(
            f"stare-lab plot: removed {n} selection figure{'s' * (n != 1)} of {k} run{'s' * (k != 1)} "
            f"no longer in the plan from {out}",
            file=sys.stderr,
        )


def _forest(root: Runs, evals: pd.DataFrame, out: Path, baseline: str) -> list[Path]:
    """Forest plots of each arm's difference to `baseline` with its interval; none (said on stderr)
    where the runs can not be compared."""
    from stare_lab.analysis import collect_problems, plot_forest, results_table  # deferred: pandas, scipy, matplotlib
    from stare_lab.analysis.compare import ComparisonError
    from stare_lab.record.frames import SettingsMismatch

    try:
        table = results_table(evals, baseline=baseline, per_problem=collect_problems(root))
    except (SettingsMismatch, ComparisonError) as e:
        print(f"stare-lab plot: no forest plot ({str(e).splitlines()[0]})", file=sys.stderr)
        return []
    if table.comparison is None:
        return []
    return plot_forest(table.comparison, out, baseline=baseline, metric=table.metric, confidence=table.confidence)


# What each kind of output is called, by the start of its file name (one line per kind, not per file).
OUTPUT_KINDS = {
    "results.": "table",
    "passk_*.md": "pass@k tables",
    "train_": "training curves",
    "passk": "pass@k curves",
    "forest": "differences to the baseline",
    "selection-quadrant-": "STARE quadrant views",
    "selection-steps-": "selection over training",
    "tokens.html": "token page",
    "tokens.png": "token page screenshot",
}


def output_lines(paths: list[Path]) -> list[str]:
    """One line per kind of output: what it is, how many files, and where (a glob when there are several)."""
    groups: dict[tuple[str, Path], list[Path]] = {}
    for path in paths:
        prefix = next((p for p in OUTPUT_KINDS if path.match(p) or path.name.startswith(p)), path.stem)
        groups.setdefault((prefix, path.parent), []).append(path)
    lines = []
    for (prefix, folder), files in groups.items():
        kind = OUTPUT_KINDS.get(prefix, prefix)
        suffixes = sorted({f.suffix for f in files})
        glob = prefix if "*" in prefix else f"{prefix}*{suffixes[0] if len(suffixes) == 1 else ''}"
        where = files[0] if len(files) == 1 else folder / glob
        count = f"{len(files)} files" if len(files) > 1 else "1 file"
        lines.append(f"{kind + ':':28s} {count:>9s}  {where}")
    return lines


# -- view and dashboard --------------------------------------------------------------------------


def cmd_view(argv: list[str]) -> int:
    """The token page of a run's (or a sweep's) kept generation batch: one self-contained HTML file.
    What can be refused without reading a batch is refused first (`_view_refusal`), before the viewer
    and torch are imported."""
    _view_refusal(argv)
    from stare_lab.viewer import main_view  # deferred: the viewer's torch

    return main_view(argv)


def _view_refusal(argv: list[str]) -> None:
    """UserError (one line, the viewer's own words) for bad options, a target that is neither a run
    directory nor a sweep YAML, a sweep file that does not load, a run that kept no batch, or a step the
    run did not keep; else nothing (what needs the batches is left to the viewer, and so is `--help`).
    Reads file names and the run's config only: the kept-batch module imports no torch."""
    if "-h" in argv or "--help" in argv:
        return
    # the viewer's own options (viewer/page.py main_view), so that its argparse never refuses with a usage block
    p = OneLineParser(prog="stare-lab view", add_help=False)
    p.add_argument("target")
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--all-runs", action="store_true")
    known = parse(p, argv)
    target = Path(known.target)
    if target.suffix in (".yaml", ".yml") and target.is_file():
        load_sweep(target)  # a SweepError names the file once
    elif target.is_dir():
        steps = kept_steps(target)
        if not steps:  # as load_run_batch says it
            raise UserError(
                f"run {target} has no kept batches ({BATCH_DIR}/step-<N>.safetensors): {why_no_batch(target)}"
            )
        if known.step is not None and known.step not in steps:
            kept = ", ".join(map(str, steps))
            raise UserError(f"step {known.step} was not kept in run {target}; kept steps: {kept}")
    else:
        raise UserError(f"{target} is neither a run directory nor a sweep YAML")


def cmd_dashboard(argv: list[str]) -> int:
    """The sweep's W&B workspace (docs/dashboard.md): saved with a W&B key, else its specification written."""
    return dashboard_main(argv)
