"""`stare-lab sweep run|status FILE`: the command line of sweeps.

    stare-lab sweep run sweeps/demo.yaml [--import MODULE]... [--launcher local|slurm] [--dry-run] [--retry-failed]
        [--rerun-other-code] [--until-decided [--budget N|Nh]] [--workers N] [--processes N] [--nodes N]
        [--partition P] [--account A] [--gpus N] [--cpus N] [--mem-gb G] [--time-min M] [--root DIR]
    stare-lab sweep status sweeps/demo.yaml [--all] [--root DIR]

User mistakes print one line on stderr and exit 2 with nothing launched. `run` exits 0 when
every run (or, for a search, at least one trial) finished, 1 otherwise, 130 on Ctrl-C. With
`--until-decided` (a sweep with `design:`) it runs the design's looks (stare_lab.sweep.sequential) and
exits 0 when no claim is open or the budget stops it, 1 when a look's runs did not all finish.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stare_lab.config.inputs import hub_problem, input_problems, overlap_warnings
from stare_lab.config.run_config import ConfigError
from stare_lab.core.utils import CommandLineError, OneLineParser, atomic_write_text
from stare_lab.dashboard import publish_after_sweep
from stare_lab.launchers import launcher_names
from stare_lab.launchers.liveness import write_manifest
from stare_lab.methods.outside import RuleImportError, import_modules, reading
from stare_lab.plan.claims import check_claims
from stare_lab.plan.expand import Composer, expand_sweep, verify_run
from stare_lab.plan.lock import SweepLock
from stare_lab.plan.run_plan import check_output, plan_runs
from stare_lab.plan.schema import SweepError, load_sweep
from stare_lab.plan.status import collect, format_status
from stare_lab.record import read_status
from stare_lab.record.arms import flatten
from stare_lab.sweep.server_task import describe_run


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="stare-lab sweep", description="Run and inspect sweeps (docs/sweeps.md).")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="launch a sweep's runs (safe to repeat: finished runs are skipped)")
    run.add_argument("file")
    run.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module of rules kept outside the package first (current folder, then PYTHONPATH); repeatable",
    )
    run.add_argument("--launcher", choices=launcher_names(), help="override the sweep's launcher")
    run.add_argument("--dry-run", action="store_true", help="print the expanded runs and launch nothing")
    run.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    run.add_argument(
        "--rerun-other-code",
        action="store_true",
        help="redo finished runs whose last attempt ran other code than this checkout",
    )
    run.add_argument(
        "--until-decided",
        action="store_true",
        help="run the design's looks, adding seeds only to the arms of open claims, until every claim is decided",
    )
    run.add_argument(
        "--budget", metavar="N|Nh", help="with --until-decided: at most N runs of the design, or hours (3h, 90m)"
    )
    run.add_argument("--workers", type=int, help="parallel runs: local workers, or the Slurm array's parallelism")
    run.add_argument("--partition")
    run.add_argument("--account")
    run.add_argument("--processes", type=int, help="processes of one run (local)")
    run.add_argument("--nodes", type=int, help="nodes of one run (slurm)")
    run.add_argument("--gpus", type=int, help="GPUs per node of one run, one process each (slurm)")
    run.add_argument("--cpus", type=int, help="CPUs per task (slurm)")
    run.add_argument("--mem-gb", type=float, help="memory per job in GB (slurm)")
    run.add_argument("--time-min", type=int, help="time limit per job in minutes (slurm)")
    run.add_argument("--root", help="output root (default: the sweep's `output:`, else ./runs)")
    st = sub.add_parser("status", help="runs by state, Slurm job ids, failures with their first error line")
    st.add_argument("file")
    st.add_argument("--all", action="store_true", help="list finished runs even when there are many")
    st.add_argument("--root", help="output root (default: the sweep's `output:`, else ./runs)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        argv = argv[1:]
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return cmd_run(args)
        with reading():  # from the records: no rule kept outside the package is imported
            return cmd_status(args)
    except (SweepError, ConfigError, RuleImportError, CommandLineError) as e:
        print(f"stare-lab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the launcher has already said what it stopped, in one line
        return 130
    except OSError as e:  # e.g. the disk filled up while writing records
        print(
            f"stare-lab: error: {e.filename or 'writing the sweep records'}: {e.strerror or e}; "
            "`sweep status` shows each run's state",
            file=sys.stderr,
        )
        return 1


def _cli_launcher(args: argparse.Namespace) -> dict[str, Any]:
    opts = {
        "name": args.launcher,
        "partition": args.partition,
        "account": args.account,
        "processes": args.processes,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "cpus_per_task": args.cpus,
        "mem_gb": args.mem_gb,
        "timeout_min": args.time_min,
    }
    return {k: v for k, v in opts.items() if v is not None}


def cmd_run(args: argparse.Namespace) -> int:
    cli = _cli_launcher(args)
    imported = import_modules(args.imports, Path.cwd(), "--import")
    spec = load_sweep(args.file, launcher=cli, output=args.root, imported=imported, reading=False)
    if args.workers is not None:
        spec.launcher = spec.launcher.with_parallel_runs(args.workers)
        if args.workers < 1:
            raise SweepError("--workers: expected an integer ≥ 1")
    if spec.search is not None:
        return _run_search(spec, args)
    budget = _sequential_options(spec, args)
    if args.dry_run:
        planned = _checked_runs(spec, dry_run=True)
        _print_plan(spec, planned)
        if spec.design is not None:
            _print_design(spec, planned)
        return 0
    # A new sweep writes nothing (not even its output folder) before every run is checked; a sweep
    # that ran before takes its lock first, so a second `sweep run` is told at once, before expanding.
    runs = _checked_runs(spec) if not spec.folder.is_dir() else None
    check_output(spec)
    with SweepLock(spec.folder, spec.name):
        planned = runs or _checked_runs(spec)
        if args.until_decided:
            return _until_decided(spec, planned, budget, args.retry_failed, args.rerun_other_code)
        return _launch(spec, planned, args.retry_failed, args.rerun_other_code)


def _sequential_options(spec, args: argparse.Namespace):
    """--until-decided needs a design; --budget (parsed: stare_lab.sweep.sequential.Budget) needs --until-decided."""
    if args.until_decided and spec.design is None:
        raise SweepError(f'--until-decided: {spec.where()} has no design: (docs/claims.md, "Sequential designs")')
    if args.budget is None:
        return None
    if not args.until_decided:
        raise SweepError("--budget: only with --until-decided (the budget of a sequential design's looks)")
    from stare_lab.sweep.sequential import Budget  # deferred: scipy and pandas

    return Budget.parse(args.budget)


def _print_design(spec, runs) -> None:
    """The design's state from the records so far, and what its next look costs (stare_lab.sweep.look_report)."""
    from stare_lab.sweep.look_report import describe  # deferred: scipy and pandas
    from stare_lab.sweep.sequential import planned_runs, sequential_state

    state = sequential_state(spec, planned_runs(spec, {r.id: flatten(r.config) for r in runs}))
    for line in describe(state):
        print(line)


def _until_decided(spec, runs, budget, retry_failed: bool, rerun_other_code: bool) -> int:
    """The design's looks, each one launch of its runs; the caller holds the sweep's lock."""
    from stare_lab.sweep.launch import launch_runs  # deferred: submitit
    from stare_lab.sweep.until_decided import run_until_decided

    _record_plan(spec, runs)

    def launch(look_runs) -> bool:
        plan = plan_runs(look_runs, retry_failed, rerun_other_code)
        print(f"launching ({spec.launcher.name}, {len(look_runs)} runs of the look): {plan.summary()}", flush=True)
        counts = launch_runs(spec, plan, echo=lambda s: print(s, flush=True))
        return counts.get("finished", 0) == len(look_runs)

    code = run_until_decided(spec, runs, launch, budget, echo=lambda s: print(s, flush=True))
    _publish_dashboard(spec)
    return code


def _checked_runs(spec, dry_run: bool = False) -> list:
    """The sweep's runs, each one's inputs checked (`_check_inputs`), and its claims against them."""
    runs = expand_sweep(spec)
    if spec.claims:
        check_claims(spec.claims, [flatten(r.config) for r in runs], spec.controls, spec.where())
    _check_inputs(runs, dry_run)
    return runs


def _check_inputs(runs, dry_run: bool = False) -> None:
    """Every file the runs will read exists (stare_lab.config.inputs), before any run directory is made;
    a training set that holds held-out problems is said once per distinct pair. A dry run only warns
    of a hub model this machine can not load offline (the one that launches may have it)."""
    seen, said = set(), set()
    for run in runs:
        c = run.config
        key = repr((c["model"]["name_or_path"], c["task"], c["eval"]))
        if key in seen:
            continue
        seen.add(key)
        problems = input_problems(c, hub=not dry_run)
        if problems:
            raise SweepError(f"{problems[0]} (run '{run.label}')")
        offline = hub_problem(c) if dry_run else None
        warnings = overlap_warnings(c) + ([f"warning: {offline}"] if offline else [])
        for line in warnings:
            if line not in said:
                said.add(line)
                print(f"stare-lab: {line}", file=sys.stderr)


def _launch(spec, runs, retry_failed: bool, rerun_other_code: bool = False) -> int:
    """Launch the planned runs; the caller holds the sweep's lock."""
    from stare_lab.sweep.launch import launch_runs  # deferred: submitit (a refused sweep never pays for it)

    _record_plan(spec, runs)
    plan = plan_runs(runs, retry_failed, rerun_other_code)
    print(
        f"sweep {spec.name!r} ({spec.launcher.name}, {len(runs)} runs in {spec.folder}): {plan.summary()}",
        flush=True,
    )
    counts = launch_runs(spec, plan, echo=lambda s: print(s, flush=True))
    print("done: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v), flush=True)
    bad = len(runs) - counts.get("finished", 0)
    if bad:
        print(f"{bad} run(s) not finished: `stare-lab sweep status {spec.path}` shows why", flush=True)
    _publish_dashboard(spec)
    return 0 if bad == 0 else 1


def _record_plan(spec, runs) -> None:
    """Before anything starts: the first run checked against compose(), the plan's manifest (every run of
    the file, a sequential sweep's included) and the sweep file's copy."""
    verify_run(runs[0])
    write_manifest(
        spec.folder,
        spec.name,
        spec.digest,
        launcher=spec.launcher.name,
        runs=[{"id": r.id, "label": r.label, "variant": r.variant, "seed": r.seed} for r in runs],
    )
    if spec.path is not None:
        atomic_write_text(spec.folder / "sweep.yaml", spec.path.read_text())


def _publish_dashboard(spec) -> None:
    """With a W&B key set, the sweep's dashboard is saved once its runs are done (one line; never raises)."""
    publish_after_sweep(spec.folder)


def _run_search(spec, args: argparse.Namespace) -> int:
    s = spec.search
    if args.dry_run:
        print(
            f"sweep {spec.name!r}: Optuna search, {s.trials} trials, {s.parallelism} at a time, "
            f"{s.direction} {s.metric}, sampler {s.sampler}, pruner {s.pruner.get('name')}, "
            f"launcher {spec.launcher.name}"
        )
        for k, p in s.params.items():
            print(f"  {k}: {p}")
        return 0
    check_output(spec)
    from stare_lab.sweep.search import best_trial, distributions, run_search, trial_run  # deferred: submitit

    with SweepLock(spec.folder, spec.name):
        sample = {k: (d.choices[0] if hasattr(d, "choices") else d.low) for k, d in distributions(s).items()}
        first = trial_run(Composer(spec), spec, 0, sample)
        verify_run(first)
        _check_inputs([first])  # the files are the same for every trial (a search varies numbers)
        write_manifest(spec.folder, spec.name, spec.digest, runs=[], launcher=spec.launcher.name)
        counts = run_search(spec, echo=lambda m: print(m, flush=True))
    print("trials: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    best = best_trial(spec)
    if best:
        print(f"best trial: #{best['number']} value={best['value']:.6g} params={best['params']} run {best['run_id']}")
    _publish_dashboard(spec)
    return 0 if counts.get("complete") else 1


def _print_plan(spec, runs) -> None:
    la = spec.launcher
    settings = ", ".join(f"{k}={v}" for k, v in la.settings().items() if k != "name" and v not in (None, [], {}))
    print(f"sweep {spec.name}: {len(runs)} runs → {spec.folder}\nlauncher {la.name}: {settings}")
    for module in spec.imported:
        print(f"rules imported from {module.module} ({module.file or module.path or 'no file'})")
    print(la.layout(len(runs)))
    _print_layouts(la, runs)
    table = Table()
    for col in ("#", "run id", "label", "method", "seed", "state"):
        table.add_column(col)
    for i, r in enumerate(runs):
        state = (read_status(r.run_dir) or {}).get("state", "new")
        table.add_row(str(i), r.id, Text(r.label), r.config["method"]["name"], str(r.seed), state)
    Console(width=max(120, Console().width)).print(table)


def _print_layouts(la, runs) -> None:
    """With vLLM server mode in the sweep, each run's layout (nodes, training processes, the server's GPUs,
    its address), one line per distinct layout with the runs (# of the table) that have it."""
    if not any(r.config["trainer"].get("use_vllm") and r.config["trainer"].get("vllm_mode") == "server" for r in runs):
        return
    layouts: dict[str, list[str]] = {}
    for i, r in enumerate(runs):
        line = describe_run(
            r.config["trainer"], la.nodes_per_run, la.processes_per_run, la.gpus_per_run // la.nodes_per_run
        )
        layouts.setdefault(line, []).append(str(i))
    for line, which in layouts.items():
        print(f"layout of run(s) {', '.join(which)}: {line}")


def cmd_status(args: argparse.Namespace) -> int:
    spec = load_sweep(args.file, output=args.root, reading=True)
    best = None
    if spec.search is not None:
        from stare_lab.sweep.search import best_trial  # deferred: submitit, through the worker

        best = best_trial(spec) if spec.folder.is_dir() else None
    plan = None
    if spec.search is None and spec.folder.is_dir():  # the plan of the file as it is now, not as last run
        plan = [{"id": r.id, "label": r.label} for r in expand_sweep(spec)]
    data = collect(spec.folder, plan)
    print(format_status(spec.name, data, digest=spec.digest, show_all=args.all, best=best))
    return 0
