"""How long each output command takes, over the whole command, on finished sweeps (docs/performance.md).

Two sweeps are trained once into --dir and reused:

- `startup`: 3 rules × 2 seeds of the built-in model, 1 step, avg@2 (the 6-run sweep of the
  start-up targets);
- `plot18`: 6 rules × 3 seeds, 4 steps, batches kept every 2 steps, avg@8 (the issue's 6-arm × 3-seed
  `plot`: 17 sweep figures and 36 per-run selection figures).

Each command is a fresh `stare-lab ...` process, timed over --reps runs (median wall-clock seconds,
and the CPU seconds of that run); the baseline, measured in the same run, is a process that only
imports torch. `plot` is timed three ways: a fresh sweep (an empty output folder; each run drew its
two selection figures at its end, as the runner does for a run that kept batches, and `plot` copies
them), nothing changed since the last `plot` (every figure kept by its stamp), and runs without
figures of their own (records written before runs drew them: every figure drawn). A run's own
drawing is timed too. Last, evaluation
throughput of the built-in model at eval.batch_size 64, 256 and 1,024 (avg@32 on its 200 held-out
problems, one thread and the usable cores). Targets (issue 30): `plot` of the 6 × 3 sweep ≤ 10 s,
`table` ≤ 1.0 s, `view`'s refusals ≤ 0.5 s, on the 2-core machine.

    python benchmarks/startup.py [--dir /tmp/stare_startup] [--reps 3] [--skip-eval]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from refusal import timed  # benchmarks/refusal.py: a whole command, median of reps, its exit code checked

SWEEP = """name: startup
base:
  model: builtin
  logger: none
  overrides:
    trainer.max_steps: 1
grid:
  method: [full, top_entropy, stare]
seeds: 2
eval: {n: 2}
launcher: {name: local, workers: 2}
"""

PLOT_SWEEP = """name: plot18
base:
  model: builtin
  logger: none
  overrides:
    trainer.max_steps: 4
    trainer.keep_batches_every: 2
grid:
  method: [full, top_entropy, stare, random, clip_cov, rsi_band]
seeds: 3
eval: {n: 8, batch_size: 1024}
launcher: {name: local, workers: 2}
"""


def timed_cpu(cmd: list[str], cwd: Path, reps: int, expect: int, before=None) -> tuple[float, float]:
    """(median wall s, CPU s of the median run) of a whole command; `before()` runs before each rep."""
    runs = []
    for _ in range(reps):
        if before:
            before()
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        t1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        if run.returncode != expect:
            sys.exit(f"{' '.join(cmd)}: exit {run.returncode}, expected {expect}: {run.stderr.strip()}")
        runs.append((t1 - t0, c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime))
    runs.sort()
    return runs[len(runs) // 2]


def train(exe: str, folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.yaml").write_text(text)
    if subprocess.run([exe, "sweep", "run", f"{name}.yaml"], cwd=folder, capture_output=True).returncode != 0:
        sys.exit(f"could not train the sweep {name}")


def line(name: str, wall: float, cpu: float, base: float, target: float | None = None) -> None:
    goal = f"  (target ≤ {target:g} s)" if target else ""
    print(f"{name:44s} {wall:5.2f} s wall, {cpu:5.2f} s CPU  ({wall / base:.2f}x of importing torch){goal}", flush=True)


def eval_batches(run_dir: Path, sizes: tuple[int, ...], threads: int) -> None:
    """The built-in model's evaluation (avg@32, its held-out problems) at each batch size."""
    import torch

    from stare_lab.config.run_config import load_config
    from stare_lab.evaluation import evaluate_benchmark
    from stare_lab.evaluation.run_eval import _benchmark, eval_settings
    from stare_lab.models import load_model_and_tokenizer
    from stare_lab.tasks import build_task

    torch.set_num_threads(threads)
    cfg = load_config(run_dir / "config.yaml")
    model, tok = load_model_and_tokenizer(str(run_dir / "final"), dtype=cfg.model.dtype)
    model.eval()
    records, verifier, own = _benchmark("arithmetic", build_task(cfg.task))
    s = eval_settings(cfg, own, verifier, {"n": 32})
    for size in sizes:
        with tempfile.TemporaryDirectory() as d:
            t0, c0 = time.perf_counter(), time.process_time()
            result = evaluate_benchmark(
                model, tok, verifier, records, n=s["n"], temperature=s["temperature"], top_p=s["top_p"],
                max_tokens=s["max_tokens"], batch_size=size, seed=0, out_dir=Path(d), step=1, name="arithmetic",
            )  # fmt: skip
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"eval batch_size {size:5d}, {threads} thread(s): {wall:6.2f} s wall, {cpu:6.2f} s CPU "
            f"({len(records)} problems × {s['n']} samples, ≤ {s['max_tokens']} tokens; "
            f"avg@32 {result['metrics']['avg@32']:.3f})",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/stare_startup"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-eval", action="store_true", help="leave out the evaluation batch sizes")
    a = ap.parse_args()
    exe = str(Path(sys.executable).with_name("stare-lab"))
    a.dir.mkdir(parents=True, exist_ok=True)
    train(exe, a.dir, "startup", SWEEP)
    train(exe, a.dir, "plot18", PLOT_SWEEP)
    from stare_lab.launchers.threads import busy_elsewhere, usable_cpus
    from stare_lab.plan.lock import SweepLock

    base = timed([sys.executable, "-c", "import torch"], a.dir, a.reps, 0)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores ({usable_cpus()} usable; "
        f"{busy_elsewhere(1.0):.1f} kept busy by other processes as it starts), Python {platform.python_version()}"
    )
    print(f"baseline: python -c 'import torch': {base:.2f} s (median of {a.reps})")
    cases = {
        "sweep status": ([exe, "sweep", "status", "startup.yaml"], 0, None),
        "table (6 runs)": ([exe, "table", "startup.yaml"], 0, 1.0),
        "view refusal: a sweep file that does not load": ([exe, "view", "bad.yaml"], 2, 0.5),
        "view refusal: neither a run nor a sweep": ([exe, "view", "no/such/run"], 2, 0.5),
        "view refusal: a step the run did not keep": ([exe, "view", "KEPT_RUN", "--step", "99"], 2, 0.5),
        "view refusal: a run that kept no batch": ([exe, "view", "NO_BATCH_RUN"], 2, 0.5),
    }
    (a.dir / "bad.yaml").write_text("name: bad\n")
    kept_run = next((a.dir / "runs" / "plot18").glob("*/batches")).parent
    no_batch_run = next((a.dir / "runs" / "startup").glob("*/config.yaml")).parent
    for name, (cmd, rc, target) in cases.items():
        cmd = [{"KEPT_RUN": str(kept_run), "NO_BATCH_RUN": str(no_batch_run)}.get(x, x) for x in cmd]
        wall, cpu = timed_cpu(cmd, a.dir, a.reps, rc)
        line(name, wall, cpu, base, target)
    with SweepLock(a.dir / "runs" / "startup", "startup"):  # another shell's sweep run holds the lock
        wall, cpu = timed_cpu([exe, "sweep", "run", "startup.yaml"], a.dir, a.reps, 2)
    line("sweep run, already running (lock)", wall, cpu, base)

    figures = a.dir / "figures18"
    runs = sorted((a.dir / "runs" / "plot18").glob("*/config.yaml"))
    plot = [exe, "plot", "plot18.yaml", "--out", str(figures)]

    def empty() -> None:
        shutil.rmtree(figures, ignore_errors=True)
        for cfg in runs:
            shutil.rmtree(cfg.parent / "figures", ignore_errors=True)

    from stare_lab.viewer.figures import plot_selection

    def runs_drew_their_own() -> None:
        shutil.rmtree(figures, ignore_errors=True)
        for cfg in runs:
            plot_selection(cfg.parent, cfg.parent / "figures", processes=1)

    own = []  # what a run that kept batches does at its end (stare_lab.run.runner.evaluate): its two figures
    for cfg in runs[: a.reps]:
        shutil.rmtree(cfg.parent / "figures", ignore_errors=True)
        t0 = time.perf_counter()
        plot_selection(cfg.parent, cfg.parent / "figures", processes=1)
        own.append(time.perf_counter() - t0)
    median = sorted(own)[len(own) // 2]
    print(f"a run's own selection figures, drawn at its end: {median:.2f} s (median of {len(own)} runs)")

    wall, cpu = timed_cpu(plot, a.dir, a.reps, 0, before=runs_drew_their_own)
    line("plot 6 × 3, a fresh sweep (the runs' own figures copied)", wall, cpu, base, 10.0)
    wall, cpu = timed_cpu(plot, a.dir, a.reps, 0)
    line("plot 6 × 3, nothing changed (all kept)", wall, cpu, base, 10.0)
    wall, cpu = timed_cpu(plot, a.dir, a.reps, 0, before=empty)
    drawn = len(list(figures.glob("*.png")))
    line(f"plot 6 × 3, runs without figures of their own: all {drawn} drawn", wall, cpu, base, 10.0)

    if not a.skip_eval:
        run_dir = next((a.dir / "runs" / "startup").glob("*/final")).parent
        for threads in sorted({1, usable_cpus()}):
            eval_batches(run_dir, (64, 256, 1024), threads)


if __name__ == "__main__":
    main()
