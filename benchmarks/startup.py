"""How long each command takes before it answers, over the whole command, on a finished 6-run sweep.

The sweep (3 rules × 2 seeds of the built-in model, 1 step, avg@2) is trained once into --dir and
reused. Each command is a fresh `stare-lab ...` process, timed over --reps runs (median); the
baseline, measured in the same run, is a process that only imports torch. Targets (issue 20):
`sweep status`, `table` and the "already running" message ≤ 1.5 s on the 2-core machine.

    python benchmarks/startup.py [--dir /tmp/stare_startup] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/stare_startup"))
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    exe = str(Path(sys.executable).with_name("stare-lab"))
    a.dir.mkdir(parents=True, exist_ok=True)
    (a.dir / "startup.yaml").write_text(SWEEP)
    if subprocess.run([exe, "sweep", "run", "startup.yaml"], cwd=a.dir, capture_output=True).returncode != 0:
        sys.exit("could not train the 6-run sweep")
    from stare_lab.sweep.lock import SweepLock

    base = timed([sys.executable, "-c", "import torch"], a.dir, a.reps, 0)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"baseline: python -c 'import torch': {base:.2f} s (median of {a.reps})")
    cases = {
        "sweep status": ([exe, "sweep", "status", "startup.yaml"], 0),
        "table": ([exe, "table", "startup.yaml"], 0),
        "plot": ([exe, "plot", "startup.yaml", "--out", str(a.dir / "figures")], 0),
    }
    for name, (cmd, rc) in cases.items():
        s = timed(cmd, a.dir, a.reps, rc)
        print(f"{name:36s} {s:5.2f} s  ({s / base:.2f}x of importing torch)")
    with SweepLock(a.dir / "runs" / "startup", "startup"):  # another shell's sweep run holds the lock
        s = timed([exe, "sweep", "run", "startup.yaml"], a.dir, a.reps, 2)
    print(f"{'sweep run, already running (lock)':36s} {s:5.2f} s  ({s / base:.2f}x of importing torch)")


if __name__ == "__main__":
    main()
