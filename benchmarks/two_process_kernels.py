"""The same 2-process run under each CPU kernel set, twice: which metrics are bit-identical where.

docs/distributed.md §9.1 says a run of 2 nodes × 1 task equals 1 node × 2 tasks bit for bit. Both
are 2 processes doing the same arithmetic, so the claim rests on every rank running the same kernels.
This script runs one 2-process run (local launcher, gloo, the built-in model, top_entropy, 3 learning
steps) twice under each of ATEN_CPU_CAPABILITY=avx512, avx2 and default that the CPU has (never one it
lacks: torch would die of SIGILL; stare_lab.core.utils.cpu_kernel_sets), and compares every computed metric of
every step and the evaluation files: within a kernel set (run a against run b) and across sets (against
the widest set's run a). About 30 s a run on 2 cores.

    python benchmarks/two_process_kernels.py [--dir /tmp/stare_two_process]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from stare_lab.core.utils import KERNEL_SETS, cpu_kernel_sets, kernel_env

CLOCK_KEYS = ("time", "runtime", "per_second", "_s", "duration", "timestamp", "elapsed", "step_time")
OVERRIDES = {
    "trainer.max_steps": 3,
    "trainer.save_steps": 1,
    "trainer.per_device_train_batch_size": 6,  # 12 rows of G = 4: group 1 spans both ranks
    "trainer.num_generations": 4,
    "trainer.gradient_accumulation_steps": 1,
    "trainer.max_completion_length": 20,
    "trainer.ddp_timeout_s": 60,
    "task.train_size": 64,
    "task.heldout_size": 8,
}


def _run(folder: Path, cap: str) -> tuple[list[dict], dict]:
    sweep = {
        "name": "two_process",
        "base": {"model": "builtin", "logger": "none", "overrides": OVERRIDES},
        "grid": {"method": ["top_entropy"]},
        "seeds": [0],
        "eval": {"n": 2},
        "launcher": {"name": "local", "workers": 1, "processes": 2},
        "output": str(folder / "runs"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    env = dict(os.environ, WANDB_MODE="disabled", **kernel_env(cap))
    done = subprocess.run([sys.executable, "-m", "stare_lab.cli", "sweep", "run", str(path)], env=env, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run under {cap} failed (exit {done.returncode})")
    run = next((folder / "runs").rglob("metrics.jsonl")).parent
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not any(c in k for c in CLOCK_KEYS)} for r in rows]
    evals = {str(f.relative_to(run)): json.loads(f.read_text()).get("metrics") for f in (run / "eval").rglob("*.json")}
    return rows, evals


def _compare(a: tuple[list[dict], dict], b: tuple[list[dict], dict]) -> str:
    keys = sorted({k for ra, rb in zip(a[0], b[0], strict=True) for k in ra if ra.get(k) != rb.get(k)})
    rel = max(
        (
            abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-30)
            for ra, rb in zip(a[0], b[0], strict=True)
            for k in keys
            if isinstance(ra.get(k), float) and isinstance(rb.get(k), float)
        ),
        default=0.0,
    )
    same = "bit-identical" if not keys else f"{len(keys)} metrics differ (max {rel:.2g} relative): {', '.join(keys)}"
    return f"{same}; evaluation files {'equal' if a[1] == b[1] else 'differ'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/stare_two_process"))
    a = ap.parse_args()
    print(next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), ""))
    sets = cpu_kernel_sets()[::-1]  # widest first
    left_out = [k for k in KERNEL_SETS if k not in sets]
    print(
        f"kernel sets: {', '.join(sets)}" + (f" (left out, not on this CPU: {', '.join(left_out)})" if left_out else "")
    )
    res = {(cap, k): _run(a.dir / f"{cap}_{k}", cap) for cap in sets for k in "ab"}
    for cap in sets:
        print(f"{cap} run b against run a: {_compare(res[(cap, 'a')], res[(cap, 'b')])}")
    for cap in sets[1:]:
        print(f"{cap} against {sets[0]}: {_compare(res[(sets[0], 'a')], res[(cap, 'a')])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
