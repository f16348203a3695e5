"""stare-lab: the command line (docs/design.md, "Command line").

    stare-lab demo
    stare-lab train [--import MODULE] method=stare seed=1 ...
    stare-lab sweep run sweeps/X.yaml [--import MODULE] [--launcher slurm] [--dry-run]
    stare-lab sweep status sweeps/X.yaml
    stare-lab eval runs/X/<run-id> [--n 32] [--import MODULE]
    stare-lab table sweeps/X.yaml [--format md|latex|csv] [--baseline full|none] [--seeds-needed [DELTA]]
    stare-lab plot sweeps/X.yaml [--no-selection]
    stare-lab view runs/X/<run-id>|sweeps/X.yaml [--step N] [--out FILE]
    stare-lab dashboard sweeps/X.yaml [--offline] [--name NAME] [--out FILE]

User mistakes print one line on stderr and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from stare_lab.deferred import defer
from stare_lab.record import CONFIG_FILE


class UserError(Exception):
    pass


READING_COMMANDS = ("table", "plot", "view", "dashboard")  # and `sweep status` (stare_lab.sweep.cli)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    commands = {
        "train": cmd_train,
        "demo": cmd_demo,
        "sweep": cmd_sweep,
        "eval": cmd_eval,
        "table": cmd_table,
        "plot": cmd_plot,
        "view": cmd_view,
        "dashboard": cmd_dashboard,
    }
    if cmd not in commands:
        return _fail(f"unknown command {cmd!r}; valid: {', '.join(commands)}")
    defer("torch")  # a value the checks refuse exits before torch's ~1.3 s import (stare_lab/deferred.py)
    from contextlib import nullcontext

    from stare_lab.config import ConfigError
    from stare_lab.rule_imports import RuleImportError, reading
    from stare_lab.sweep.schema import SweepError

    try:  # the reading commands work from the records: they import no rule kept outside the package
        with reading() if cmd in READING_COMMANDS else nullcontext():
            return commands[cmd](rest)
    except (UserError, ConfigError, SweepError, RuleImportError, FileNotFoundError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except KeyboardInterrupt:
        print("stare-lab: interrupted", file=sys.stderr)
        return 130


def _fail(msg: str) -> int:
    print(f"stare-lab: error: {msg}", file=sys.stderr)
    return 2


def cmd_train(argv: list[str]) -> int:
    """One run from Hydra overrides; its record goes to <run.root>/<run.sweep>/<run-id>/ (or run_dir=...).
    `--import MODULE` (repeatable): a module of rules kept outside the package, imported first."""
    from omegaconf import open_dict

    from stare_lab.config import compose, save_config
    from stare_lab.inputs import check_inputs, overlap_warnings
    from stare_lab.rule_imports import import_modules, run_entries

    run_dir = None
    overrides, modules = [], []
    args = iter(argv)
    for a in args:
        if a.startswith("run_dir="):
            run_dir = Path(a.split("=", 1)[1])
        elif a == "--import" or a.startswith("--import="):
            module = a.split("=", 1)[1] if "=" in a else next(args, None)
            if not module:
                raise UserError("--import: expected a module name (--import my_rules)")
            modules.append(module)
        elif a.startswith("-"):
            raise UserError(
                f"unknown option {a!r}; train takes --import MODULE and Hydra overrides like method=stare seed=1"
            )
        else:
            overrides.append(a)
    imported = import_modules(modules, Path.cwd(), "--import")  # before the rule's name is checked
    cfg = compose(overrides)
    if imported:  # the worker imports them too (stare_lab.rule_imports)
        with open_dict(cfg.run):
            cfg.run.imports = run_entries(imported)
    check_inputs(cfg)
    for line in overlap_warnings(cfg):
        print(f"stare-lab: {line}", file=sys.stderr)
    if cfg.run.label is None:
        cfg.run.label = " ".join(overrides) or "default"
    run_dir = run_dir or Path(cfg.run.root) / cfg.run.sweep / cfg.run.id
    config_path = run_dir / CONFIG_FILE
    if config_path.exists():
        from stare_lab.config import load_config

        old = load_config(config_path)
        if old.run.id != cfg.run.id:
            raise UserError(f"{run_dir} holds another run ({old.run.id}); refusing to overwrite it")
    else:
        save_config(cfg, config_path)
    print(f"run {cfg.run.id} ({cfg.method.name}, seed {cfg.seed}) → {run_dir}")
    from stare_lab.sweep.worker import run_one, start_worker

    start_worker()
    try:
        status = run_one(run_dir)
    except Exception as e:  # the run's own failure: recorded in status.json with its traceback
        print(
            f"stare-lab: run failed: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
            f"(traceback in {run_dir / 'status.json'})",
            file=sys.stderr,
        )
        return 1
    if status.get("claimed_elsewhere"):
        print(
            f"stare-lab: {run_dir} is being run by another worker (pid {status.get('pid')} on "
            f"{status.get('host')}); nothing done",
            file=sys.stderr,
        )
        return 1
    _print_last_metrics(run_dir)
    return 0 if status.get("state") == "finished" else 1


def _print_last_metrics(run_dir: Path) -> None:
    from stare_lab.record import read_eval_results, read_metrics

    rows = read_metrics(run_dir)
    if rows:
        last = rows[-1]
        keys = [
            "step",
            "reward",
            "accuracy",
            "entropy",
            "tokens/trained_frac",
            "tokens/touched_frac",
            "tokens/weight_mean",
        ]
        keys += sorted(k for k in last if k.startswith("rule/"))
        print("  ".join(f"{k}={last[k]:.4g}" if isinstance(last.get(k), float) else f"{k}={last.get(k)}" for k in keys))
    for result in read_eval_results(run_dir):
        if result["final"]:
            _print_result(result)


def _print_result(result: dict) -> None:
    """`arithmetic: avg@4=0.250  pass@1=...  (n=4, T=1, top-p=0.7, max tokens 8, exact, step 2)`."""
    m = result.get("metrics") or {}
    settings = (
        f"n={result.get('n')}, T={result.get('temperature')}, top-p={result.get('top_p')}, "
        f"max tokens {result.get('max_tokens')}, {result.get('verifier')}, step {result.get('step')}"
    )
    print(
        f"{result['benchmark']}: "
        + "  ".join(f"{k}={v:.3f}" for k, v in m.items() if isinstance(v, float))
        + f"  ({settings})"
    )


def cmd_sweep(argv: list[str]) -> int:
    from stare_lab.sweep.cli import main as sweep_main

    return sweep_main(argv)


def cmd_eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="stare-lab eval")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--n", type=int, default=None, help="samples per problem (default: the benchmark's own)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--benchmarks", nargs="*", default=None)
    p.add_argument(
        "--engine", choices=["transformers", "vllm"], default=None, help="sampler (default: the run's eval.engine)"
    )
    p.add_argument("--force", action="store_true", help="re-evaluate even if a result under the same settings exists")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module of rules kept outside the package (besides the run's own run.imports); repeatable",
    )
    a = _parse(p, argv)
    if not (a.run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{a.run_dir} is not a run directory (no {CONFIG_FILE})")
    from stare_lab.rule_imports import import_modules

    import_modules(a.imports, Path.cwd(), "--import")
    overrides = {"n": a.n, "temperature": a.temperature, "top_p": a.top_p, "max_tokens": a.max_tokens}
    overrides = {k: v for k, v in {**overrides, "engine": a.engine}.items() if v is not None}
    _check_eval_settings(overrides)
    from stare_lab.config import load_config
    from stare_lab.eval_run import evaluate_run
    from stare_lab.rule_imports import import_run_modules
    from stare_lab.sweep.worker import start_worker
    from stare_lab.vllm_engine import missing_vllm

    cfg = load_config(a.run_dir / CONFIG_FILE)
    import_run_modules(cfg.run, f"{a.run_dir / CONFIG_FILE}: run.imports")
    if (a.engine or cfg.eval.get("engine")) == "vllm" and missing_vllm():
        raise UserError(f"{'--engine' if a.engine else 'eval.engine:'} vllm: {missing_vllm()}")
    if a.benchmarks:
        cfg.eval.benchmarks = a.benchmarks
    start_worker()
    for result in evaluate_run(a.run_dir, cfg, force=a.force, overrides=overrides).values():
        _print_result(result)
    from stare_lab.viewer.wandb_export import log_eval

    log_eval(a.run_dir)  # into the run's W&B record (nothing when W&B is off)
    return 0


def _check_eval_settings(s: dict) -> None:
    problems = {
        "n": s.get("n", 1) >= 1,
        "temperature": s.get("temperature", 0.0) >= 0,
        "top_p": 0 < s.get("top_p", 1.0) <= 1,
        "max_tokens": s.get("max_tokens", 1) >= 1,
    }
    bad = [k for k, ok in problems.items() if not ok]
    if bad:
        ranges = {"n": "≥ 1", "temperature": "≥ 0", "top_p": "in (0, 1]", "max_tokens": "≥ 1"}
        raise UserError(f"--{bad[0].replace('_', '-')} {s[bad[0]]}: expected a value {ranges[bad[0]]}")


def _release_torch() -> None:
    """A reading command needs no torch once its plan is read: take torch's unloaded stand-in
    (stare_lab.deferred) out of sys.modules. Else scipy.stats, which tells a torch tensor by
    `sys.modules["torch"].Tensor`, imports the real torch by reading it (~1.3 s of CPU, most of
    `table`'s start). The rule modules that imported the stand-in keep it; an `import torch` later
    imports the real module."""
    from stare_lab.deferred import is_loaded

    if "torch" in sys.modules and not is_loaded("torch"):
        del sys.modules["torch"]


def _sweep_root(path: Path) -> Path:
    """A sweep YAML (or a packaged sweep's name) → its run folder (<output>/<name>); a folder is taken as is."""
    return _sweep_runs(path, all_runs=True)[0]


def _sweep_runs(path: Path, all_runs: bool = False) -> tuple[Path, Path | list[Path]]:
    """(the sweep's run folder, what to read): for a sweep YAML the run directories of its current
    plan (runs left from an earlier grid are left out, said once on stderr), or with `all_runs`
    the whole folder; a folder is taken as is."""
    if path.is_dir():
        return path, path
    if not path.is_file() and (path.suffix or len(path.parts) > 1):
        raise UserError(f"no such sweep file or run folder: {path}")
    from stare_lab.sweep.schema import load_sweep

    spec = load_sweep(path, reading=True)  # from the records: no rule kept outside the package imported
    root = Path(spec.output) / spec.name
    if all_runs or spec.search is not None or not root.is_dir():  # a search's trials are its plan
        return root, root
    from stare_lab.analysis.collect import find_run_dirs

    planned = _planned_ids(spec, root)
    present = find_run_dirs(root)
    others = [d for d in present if d.name not in planned]
    if others:
        print(
            f"stare-lab: {len(others)} run(s) under {root} are not in the current plan and are left out "
            "(--all-runs shows them; `sweep status` says how to remove them)",
            file=sys.stderr,
        )
    return root, [d for d in present if d.name in planned]


def _planned_ids(spec, root: Path) -> set[str]:
    """The run ids of the sweep's plan: those its last `sweep run` wrote in the folder's manifest when
    the sweep file has not changed since (the manifest keeps the file's digest; `sweep status` lists
    the same runs), else the file expanded again (Hydra composes every run: ~0.3 s of a table's start)."""
    from stare_lab.sweep.liveness import read_manifest

    manifest = read_manifest(root) or {}
    if manifest.get("digest") and manifest.get("digest") == spec.digest and manifest.get("runs"):
        return {str(r["id"]) for r in manifest["runs"]}
    from stare_lab.sweep.expand import expand_sweep

    return {r.run_dir.name for r in expand_sweep(spec)}


def cmd_table(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="stare-lab table")
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
    a = _parse(p, argv)
    if not 0 < a.confidence < 1:
        raise UserError(f"--confidence {a.confidence:g}: expected a value in (0, 1)")
    if a.seeds_needed is not None and not a.seeds_needed > 0:
        raise UserError(f"--seeds-needed {a.seeds_needed:g}: expected a difference in points > 0")
    where = dict(w.split("=", 1) for w in a.where if "=" in w)
    if len(where) != len(a.where):
        raise UserError(f"--where: expected KEY=VALUE, got {a.where}")
    baseline = None if a.baseline.lower() == "none" else a.baseline
    root, runs = _sweep_runs(a.sweep, a.all_runs)
    _release_torch()
    from stare_lab.analysis import collect_problems, collect_runs, passk_table, results_table, run_states
    from stare_lab.analysis.collect import SettingsMismatch
    from stare_lab.analysis.compare import ComparisonError

    df = collect_runs(runs)
    if df.empty:
        raise UserError(f"no evaluation results under {root} yet")
    expected = run_states(runs)
    try:
        table = results_table(
            df,
            metric=a.metric,
            baseline=baseline,
            expected=expected,
            where=where,
            mix_settings=a.mix_settings,
            per_problem=collect_problems(runs) if baseline else None,
            confidence=a.confidence,
        )
        passk = (
            {
                b: passk_table(df, b, baseline=baseline, where=where, mix_settings=a.mix_settings)
                for b in sorted(df["benchmark"].unique())
            }
            if a.out or a.wandb
            else {}
        )
    except (SettingsMismatch, ComparisonError) as e:
        raise UserError(str(e)) from None
    if a.seeds_needed is not None:
        print(table.seeds_markdown(a.seeds_needed))
        return 0
    for note in table.notes:
        if note.startswith("Warning: runs come from different code"):
            print(f"stare-lab: {note}", file=sys.stderr)
    rendered = {"md": table.to_markdown(), "latex": table.to_latex(), "csv": table.to_csv()}
    print(rendered[a.format])
    if a.out:
        from stare_lab.utils import atomic_write_text

        for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv")):
            atomic_write_text(a.out / f"results.{ext}", rendered[fmt])
        for bench, t in passk.items():
            atomic_write_text(a.out / f"passk_{bench}.md", t.to_markdown())
    if a.wandb:
        _table_to_wandb(root, runs, df, table, passk, baseline)
    return 0


def _table_to_wandb(root: Path, runs, df, table, passk: dict, baseline: str | None) -> None:
    """The finished table, its forest plot and the pass@k curves in one summary run of the sweep's
    W&B group (offline without a key), in the W&B project and entity its runs logged to."""
    from stare_lab.analysis import plot_forest, plot_passk
    from stare_lab.viewer.wandb_export import log_sweep_summary

    figures = plot_passk(df, root / "figures", baseline=baseline)
    if table.comparison is not None and not table.comparison.empty:
        figures += plot_forest(
            table.comparison, root / "figures", baseline=baseline, metric=table.metric, confidence=table.confidence
        )
    log_sweep_summary(root.name, table, passk, figures, out_dir=root, **_wandb_target(runs))
    print(f"stare-lab: W&B summary run of sweep {root.name!r} written under {root / 'wandb'}", file=sys.stderr)


def _wandb_target(runs: Path | list[Path]) -> dict:
    """{project, entity} of the W&B runs of a sweep (its first run's logger config); {} if none says."""
    import yaml

    dirs = runs if isinstance(runs, list) else sorted(p.parent for p in runs.glob(f"*/{CONFIG_FILE}"))
    for d in dirs:
        path = Path(d) / CONFIG_FILE
        if path.is_file():
            logger = (yaml.safe_load(path.read_text()) or {}).get("logger") or {}
            return {k: logger[k] for k in ("project", "entity") if logger.get(k)}
    return {}


def cmd_dashboard(argv: list[str]) -> int:
    """The sweep's W&B workspace (docs/dashboard.md): saved with a W&B key, else its specification written."""
    from stare_lab.dashboard import main as dashboard_main

    return dashboard_main(argv)


def cmd_plot(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="stare-lab plot")
    p.add_argument("sweep", type=Path)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--baseline", default="full", help="the arm of the forest plot's differences")
    p.add_argument("--all-runs", action="store_true", help="also runs not in the sweep's current plan")
    p.add_argument(
        "--no-selection",
        action="store_true",
        help="leave out the per-run selection figures (two per run that kept batches)",
    )
    a = _parse(p, argv)
    root, runs = _sweep_runs(a.sweep, a.all_runs)
    _release_torch()  # the selection figures import the real torch when a run kept batches
    _plot(runs, a.out or root / "figures", a.baseline, selection=not a.no_selection)
    return 0


def _plot(
    root: Path | list[Path], out: Path, baseline: str, reuse_run_figures: bool = True, selection: bool = True
) -> None:
    """Training, pass@k and selection figures of the runs (a folder or a list of run dirs) into
    `out`; prints one line per kind of figure. A figure whose stamp says it was drawn from the same
    records by the same code is kept, not drawn again (stare_lab.figure_stamps); the runs' own
    selection figures are reused the same way (`reuse_run_figures` is kept for callers: reuse is
    always on, as it can only give the same bytes). The selection figures to draw are started first,
    in forked processes, and drawn while this process draws the others. `selection`: draw them."""
    selection_figures: Callable[[], list[Path]] = list
    if selection:  # the viewer imports torch
        from stare_lab.viewer.figures import start_selection

        selection_figures = start_selection(root, out)
    from stare_lab.analysis import collect_runs, collect_training, plot_passk, plot_training

    paths = []
    train = collect_training(root)
    if not train.empty:
        paths += plot_training(train, out, baseline=baseline)
    evals = collect_runs(root)
    if not evals.empty:
        paths += plot_passk(evals, out, baseline=baseline)
        paths += _forest(root, evals, out, baseline)
    paths += selection_figures()
    if not paths:
        raise UserError(f"nothing to plot under {root if isinstance(root, Path) else 'the current plan'}")
    for line in _output_lines(paths):
        print(line)


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


def _output_lines(paths: list[Path]) -> list[str]:
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


def _forest(root: Path | list[Path], evals, out: Path, baseline: str) -> list[Path]:
    """Forest plots of each arm's difference to `baseline` with its interval; none (said on stderr)
    where the runs can not be compared."""
    from stare_lab.analysis import collect_problems, plot_forest, results_table
    from stare_lab.analysis.collect import SettingsMismatch
    from stare_lab.analysis.compare import ComparisonError

    try:
        table = results_table(evals, baseline=baseline, per_problem=collect_problems(root))
    except (SettingsMismatch, ComparisonError) as e:
        print(f"stare-lab plot: no forest plot ({str(e).splitlines()[0]})", file=sys.stderr)
        return []
    if table.comparison is None:
        return []
    return plot_forest(table.comparison, out, baseline=baseline, metric=table.metric, confidence=table.confidence)


def cmd_demo(argv: list[str]) -> int:
    """sweeps/demo.yaml on the built-in model with the local launcher, then the table and plots."""
    p = argparse.ArgumentParser(prog="stare-lab demo")
    p.add_argument("--sweep", type=Path, default=_packaged_sweep("demo"))
    p.add_argument("--out", type=Path, default=Path("analysis") / "demo", help="default: ./analysis/demo")
    a = _parse(p, argv)
    rc = cmd_sweep(["run", str(a.sweep), "--retry-failed"])  # the demo is one button: a failed run is retried
    if rc == 130:  # Ctrl-C: the launcher has said what it stopped
        return rc
    if rc != 0:
        print("stare-lab demo: some runs did not finish; the table shows what exists", file=sys.stderr)
    cmd_table([str(a.sweep), "--out", str(a.out)])
    print(f"\noutputs under {a.out}/:")
    print("\n".join(_output_lines(sorted(a.out.glob("results.*")) + sorted(a.out.glob("passk_*.md")))))
    _plot(_sweep_root(a.sweep), a.out / "figures", "full")
    _demo_token_page(a.sweep, a.out)
    return rc


def cmd_view(argv: list[str]) -> int:
    """The token page of a run's (or a sweep's) kept generation batch: one self-contained HTML file.
    What can be refused without reading a batch is refused first (`_view_refusal`), before the viewer
    and torch are imported."""
    _view_refusal(argv)
    from stare_lab.viewer import main_view

    return main_view(argv)


_KEPT = re.compile(r"^step-(\d+)\.safetensors$")  # stare_lab.viewer.batch's kept batch files


def _view_refusal(argv: list[str]) -> None:
    """UserError (one line, the viewer's own words) for a target that is neither a run directory nor
    a sweep YAML, a sweep file that does not load, or a step the run did not keep; else nothing (bad
    options, and what needs the batches, are left to the viewer)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("target", nargs="?")
    p.add_argument("--step", type=int, default=None)
    try:
        known, _ = p.parse_known_args(argv)
    except SystemExit:
        return
    if known.target is None:
        return
    target = Path(known.target)
    if target.suffix in (".yaml", ".yml") and target.is_file():
        from stare_lab.sweep.schema import load_sweep

        load_sweep(target)  # a SweepError names the file once
    elif target.is_dir():
        folder = target / "batches"
        files = folder.iterdir() if folder.is_dir() else ()
        steps = sorted(int(m.group(1)) for f in files if (m := _KEPT.match(f.name)))
        if steps and known.step is not None and known.step not in steps:
            kept = ", ".join(map(str, steps))
            raise UserError(f"step {known.step} was not kept in run {target}; kept steps: {kept}")
    else:
        raise UserError(f"{target} is neither a run directory nor a sweep YAML")


def _demo_token_page(sweep: Path, out: Path) -> None:
    """The demo's token page (every arm at the last kept step) and, where Chromium is installed, its screenshot."""
    from stare_lab.viewer.browser import chromium_path, screenshot
    from stare_lab.viewer.page import ViewError, render_sweep

    try:
        page = render_sweep(sweep, out=out / "tokens.html")
    except ViewError as e:
        print(f"stare-lab demo: no token page ({e})", file=sys.stderr)
        return
    pages = [page] + ([screenshot(page, out / "tokens.png")] if chromium_path() is not None else [])
    print("\n".join(_output_lines(pages)))


def _packaged_sweep(name: str) -> Path:
    """A sweep shipped with the package (stare_lab/sweeps/, before that the repository's sweeps/)."""
    from stare_lab import config

    folder = getattr(config, "SWEEP_DIR", config.CONF_DIR.parent / "sweeps")
    return folder / f"{name}.yaml"


def _parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise UserError(f"bad arguments for {p.prog}: {' '.join(argv)}") from None


if __name__ == "__main__":
    sys.exit(main())
