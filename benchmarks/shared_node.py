"""A sweep on a shared node: step time with two busy loops on the cores against idle cores (issue 30.1).

One 6-run local sweep (3 rules × 2 seeds of the built-in model, --steps optimizer steps, no
evaluation, `workers: 1` as in the issue) is run four times, each into a fresh folder:

- `now`: this checkout (threads decided by stare_lab.launchers.threads, idle threads spinning ≤ 0.3 ms);
- `today`: the code before threads were decided (the parent of the commit that added
  stare_lab/launchers/threads.py, extracted with `git archive`): `torch.set_num_threads(cores // workers)`
  and OpenMP's default wait policy (spin, then sleep);

each on idle cores and with two busy loops (`while True: pass`, one per core of the 2-core machine)
running for the whole sweep. Reported: the mean `step_time` (metrics.jsonl, every step of every run)
and the ratios in one run. Targets: `now` loaded within 2× of `now` idle (a fair share of 2 cores
among 3 busy threads is 1.5×), and `now` idle no slower than `today` idle.

    OMP_NUM_THREADS= python benchmarks/shared_node.py [--steps 8] [--loops 2] [--workers 1]

The environment's OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT are removed for the sweeps
(they would decide the threads and the policy of both codes, which is what is measured); the busy
loops run at the default priority, as other users' jobs would. Each line also says how many cores
other processes kept busy just before (the machine may not be idle: its "idle" is then shared).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stare_lab.launchers.threads import busy_elsewhere  # noqa: E402

SWEEP = {
    "name": "shared",
    "base": {"model": "builtin", "logger": "none", "overrides": {}},
    "grid": {"method": ["full", "top_entropy", "stare"]},
    "seeds": 2,
    "eval": {"enabled": False},
}


def today_tree(dest: Path) -> tuple[str, Path] | None:
    """(commit, folder) of the package as it was before stare_lab/launchers/threads.py; None outside a checkout."""
    log = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "stare_lab/launchers/threads.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    added = log.stdout.split()
    if log.returncode != 0 or not added:
        return None
    rev = f"{added[-1]}~1"
    archive = subprocess.run(["git", "archive", rev, "stare_lab"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return rev, dest


def run_sweep(folder: Path, steps: int, workers: int, pythonpath: Path, loops: int) -> list[float]:
    """The sweep in `folder` with `loops` busy loops meanwhile; every run's step times."""
    folder.mkdir(parents=True)
    data = json.loads(json.dumps(SWEEP))
    data["base"]["overrides"]["trainer.max_steps"] = steps
    data["launcher"] = {"name": "local", "workers": workers}
    data["output"] = str(folder / "runs")
    path = folder / "shared.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= {"PYTHONPATH": str(pythonpath), "WANDB_MODE": "disabled"}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "stare_lab.cli", "sweep", "run", str(path)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if out.returncode != 0:
        sys.exit(f"sweep in {folder} failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    times = []
    for metrics in sorted((folder / "runs" / "shared").glob("*/metrics.jsonl")):
        times += [json.loads(line)["step_time"] for line in metrics.read_text().splitlines() if line.strip()]
    if len(times) != 6 * steps:
        sys.exit(f"expected {6 * steps} steps in {folder}, found {len(times)}")
    return times


def threads_of(folder: Path) -> str:
    """What the runs recorded (the current code only)."""
    seen = set()
    for status in (folder / "runs" / "shared").glob("*/status.json"):
        t = (json.loads(status.read_text()).get("provenance") or [{}])[-1].get("threads")
        if t:
            seen.add(f"{t['torch']} thread(s) ({t['from']}), OMP_WAIT_POLICY {t['omp_wait_policy']}")
    return "; ".join(sorted(seen)) or "not recorded"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--loops", type=int, default=2, help="busy loops in the loaded condition")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="keep the sweeps here (default: a temporary folder)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = a.dir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        (base / "today_code").mkdir(exist_ok=True)
        today = today_tree(base / "today_code")
        codes = {"now": ROOT} | ({"today": today[1]} if today else {})
        print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores "
              f"(this process may use {len(os.sched_getaffinity(0))}), Python {platform.python_version()}")  # fmt: skip
        print(f"sweep: 6 runs × {a.steps} steps, built-in model, local launcher workers: {a.workers}, no evaluation")
        if today:
            print(f"today: the code at {today[0]} (before threads were decided)")
        else:
            print("today: not measured (no git checkout)")
        means: dict[tuple[str, str], float] = {}
        for code, path in codes.items():
            for load in ("idle", "loaded"):
                folder = base / f"{code}_{load}_{int(time.time())}"
                busy = busy_elsewhere(1.0)  # what other users of the machine took just before (not the loops)
                t0 = time.perf_counter()
                times = run_sweep(folder, a.steps, a.workers, path, a.loops if load == "loaded" else 0)
                means[code, load] = statistics.fmean(times)
                extra = f"; {threads_of(folder)}" if code == "now" else ""
                took = time.perf_counter() - t0
                print(
                    f"{code:5s} {load:6s}: mean step {means[code, load]:.3f} s, median "
                    f"{statistics.median(times):.3f} s over {len(times)} steps; sweep {took:.0f} s; "
                    f"{busy:.1f} cores busy elsewhere before" + extra,
                    flush=True,
                )
        print("ratios:")
        for code in codes:
            r = means[code, "loaded"] / means[code, "idle"]
            print(f"  {code:5s} loaded / idle: {r:.2f}x" + ("  (target ≤ 2x)" if code == "now" else ""))
        if today:
            r = means["now", "idle"] / means["today", "idle"]
            print(f"  now / today, idle cores:   {r:.2f}x  (target ≤ 1x)")
            r = means["now", "loaded"] / means["today", "loaded"]
            print(f"  now / today, loaded cores: {r:.2f}x")


if __name__ == "__main__":
    main()
