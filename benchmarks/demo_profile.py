"""Where the demo's time goes: one demo run phase by phase, and a finished sweep's timeline.

Run: .venv/bin/python benchmarks/demo_profile.py run [--method full [--method random ...]] [--seed 0] [--dir DIR]
     .venv/bin/python benchmarks/demo_profile.py timeline runs/demo
     .venv/bin/python benchmarks/demo_profile.py tail stare_lab/sweeps/demo.yaml   (in the folder holding runs/)

1. `run`: runs of the demo sweep (their resolved configs, so the same model, steps and evaluation)
   through the real worker (`run_one`), one after another in this fresh process as a local queue
   worker runs them, with timers wrapped around the functions a run passes through (the module
   attributes they are called by; nothing in the package knows about it). Printed: import time of
   the heavy libraries (what a worker process pays once), then seconds per phase of each run.
2. `timeline`: per run of a finished sweep, from its record alone (status.json times, the
   metrics.jsonl rows' times, file times of final/ and eval/): start-up (process start to the
   first logged step), training, evaluation and publishing, and the gap between one run's end
   and the next run's start on the same worker slot (process exit, launcher poll, new process).
3. `tail`: the demo's steps after the runs (table, plots, token page), each timed in this process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PHASES: dict[str, list[float]] = {}


def timed(owner, name: str, label: str) -> None:
    """Replace `owner.name` by a wrapper that adds its wall time to PHASES[label]."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES.setdefault(label, []).append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def process_started() -> float:
    """Wall-clock time this process started (Linux: /proc/self/stat field 22, ticks after boot)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


STARTED = time.time()


def import_times() -> list[tuple[str, float]]:
    """Seconds to import each heavy library, in the order a worker meets them (cumulative cost)."""
    out = []
    for module in (
        "torch",
        "transformers",
        "stare_lab.run.runner",
        "trl",
        "stare_lab.training.trainer",
        "wandb",
        "pandas",
    ):
        t0 = time.perf_counter()
        __import__(module)
        out.append((module, time.perf_counter() - t0))
    return out


def cmd_run(args: argparse.Namespace) -> None:
    imports = import_times()
    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.run_plan import prepare
    from stare_lab.plan.schema import load_sweep
    from stare_lab.sweep.worker import run_one, start_worker

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    spec = load_sweep(REPO / "stare_lab" / "sweeps" / "demo.yaml")
    by_key = {(r.label.split(" seed=")[0], int(r.cfg.seed)): r for r in expand_sweep(spec)}
    runs = [by_key[(method, args.seed)] for method in args.method or ["full"]]
    for run in runs:
        prepare(run, fresh=True)
    _time_phases()
    start_worker(args.threads)
    print(f"{'process start to this script':<44s} {STARTED - process_started():7.2f} s")
    for module, s in imports:
        print(f"import {module:<37s} {s:7.2f} s")
    for run in runs:  # one after another in this process, as a local queue worker runs them
        PHASES.clear()
        t0 = time.perf_counter()
        status = run_one(run.run_dir)
        total = time.perf_counter() - t0
        print(f"-- run {run.id} ({run.label}): {status['state']}, threads {args.threads}, pid {os.getpid()}")
        for label, values in PHASES.items():
            print(f"{label:<44s} {sum(values):7.2f} s" + (f"  ({len(values)} calls)" if len(values) > 1 else ""))
        print(f"{'run_one (claim, status, execute)':<44s} {total:7.2f} s")


def _time_phases() -> None:
    import wandb

    import stare_lab.evaluation as evaluation
    import stare_lab.run.runner as runner
    import stare_lab.viewer.figures as figures
    import stare_lab.viewer.page as page
    from stare_lab.training.trainer import TokenRuleGRPOTrainer

    for owner, name, label in [
        (runner, "init_wandb", "W&B init"),  # the name the runner calls (imported from viewer.wandb_export)
        (runner, "build_trainer", "build trainer (model, task, TRL)"),
        (TokenRuleGRPOTrainer, "train", "trainer.train (every step)"),
        (TokenRuleGRPOTrainer, "save_model", "save final/"),
        (runner, "evaluate_run", "evaluation (load, sample, verify, write)"),
        (evaluation, "generate_samples", "  of which generate_samples"),
        (runner, "publish_run", "publish (W&B eval + token page)"),
        (page, "render_run", "  of which render_run (token page)"),
        (figures, "plot_selection", "selection figures (each kept step)"),
        (wandb.sdk.wandb_run.Run, "finish", "W&B finish"),
        (runner, "execute", "execute (the whole run)"),
    ]:
        timed(owner, name, label)


def _ts(s: str) -> float:
    return dt.datetime.fromisoformat(s).timestamp()


def cmd_timeline(args: argparse.Namespace) -> None:
    rows = []
    for d in sorted(Path(args.root).iterdir()):
        if not (d / "status.json").is_file():
            continue
        s = json.loads((d / "status.json").read_text())
        if s.get("state") != "finished":
            continue
        metrics, model = d / "metrics.jsonl", d / "final" / "model.safetensors"
        steps = (
            [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
        )
        evals = sorted(glob.glob(str(d / "eval" / "*" / "*.json")), key=os.path.getmtime)
        start = _ts(s["attempt_started"])  # a run of 0 steps (base) has no steps and no final/: it evaluates at once
        rows.append(
            {
                "label": s["label"],
                "created": _ts(s["created"]),
                "start": start,
                "step1": steps[0]["time"] if steps else start,
                "last": steps[-1]["time"] if steps else start,
                "final": os.path.getmtime(model) if model.is_file() else start,
                "eval": os.path.getmtime(evals[-1]),
                "end": _ts(s["finished"]),
            }
        )
    t0 = min(r["created"] for r in rows)
    rows.sort(key=lambda r: r["start"])
    ends: list[float] = []  # worker slots: the next run starts on the slot that freed first
    print(
        f"{'run':<22s} {'start':>6s} {'end':>6s} | "
        f"{'gap':>5s} {'to step 1':>9s} {'train':>6s} {'eval':>6s} {'publish':>7s}"
    )
    for r in rows:
        gap = r["start"] - min(ends) if len(ends) >= args.workers else r["start"] - t0
        if len(ends) >= args.workers:
            ends.remove(min(ends))
        ends.append(r["end"])
        r.update(
            gap=gap,
            up=r["step1"] - r["start"],
            train=r["last"] - r["step1"],
            ev=r["eval"] - r["final"],
            pub=r["end"] - r["eval"],
        )
        print(
            f"{r['label']:<22s} {r['start'] - t0:6.0f} {r['end'] - t0:6.0f} | {gap:5.1f} {r['up']:9.1f} "
            f"{r['train']:6.1f} {r['ev']:6.1f} {r['pub']:7.1f}"
        )
    n = len(rows)
    print(
        f"{'mean':<36s} | "
        + " ".join(
            f"{sum(r[k] for r in rows) / n:{w}.1f}"
            for k, w in (("gap", 5), ("up", 9), ("train", 6), ("ev", 6), ("pub", 7))
        )
    )
    print(f"{n} runs from the first config written to the last run's end: {max(r['end'] for r in rows) - t0:.0f} s")


def cmd_tail(args: argparse.Namespace) -> None:
    from stare_lab import cli

    out = Path(args.out)
    root = cli._sweep_root(Path(args.sweep))
    for label, fn in [
        ("table", lambda: cli.cmd_table([args.sweep, "--out", str(out)])),
        (
            "figures (as the demo: the runs' own selection figures copied)",
            lambda: cli._plot(root, out / "figures", "full", reuse_run_figures=True),
        ),
        ("token page and screenshot", lambda: cli._demo_token_page(Path(args.sweep), out)),
    ]:
        t0 = time.perf_counter()
        fn()
        print(f"{label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument(
        "--method", action="append", help="a rule of the demo (repeat: runs one after another; default full)"
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=1, help="torch threads (the demo's 2 workers on 2 cores: 1)")
    r.add_argument("--dir", default="/tmp/demo-profile")
    t = sub.add_parser("timeline")
    t.add_argument("root")
    t.add_argument("--workers", type=int, default=2)
    a = sub.add_parser("tail")
    a.add_argument("sweep")
    a.add_argument("--out", default="/tmp/demo-profile-tail")
    args = p.parse_args()
    {"run": cmd_run, "timeline": cmd_timeline, "tail": cmd_tail}[args.cmd](args)


if __name__ == "__main__":
    main()
