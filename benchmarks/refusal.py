"""How long the command line takes to refuse a bad value, over the whole command (issue: ≤ 1 s).

Each case is a fresh `stare-lab ...` process (interpreter start, imports, checks, the one-line
error, exit 2), timed over --reps runs; the baseline, measured in the same run, is a process that
only imports torch (what every refusal would pay if a rule module imported torch at its top; they
import it inside their functions, docs/design.md "Fast refusals").

    python benchmarks/refusal.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BAD_SWEEP = """name: bad
base:
  model: builtin
  overrides:
    trainer.max_steps: -3
grid:
  method: [full, stare]
seeds: 2
"""


def timed(cmd: list[str], cwd: Path, reps: int, expect: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if run.returncode != expect:
            sys.exit(f"{' '.join(cmd)}: exit {run.returncode}, expected {expect}: {run.stderr.strip()}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    exe = Path(sys.executable).with_name("stare-lab")
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "bad.yaml").write_text(BAD_SWEEP)
        cases = {
            "sweep run bad.yaml (trainer.max_steps: -3)": [str(exe), "sweep", "run", "bad.yaml"],
            "train trainer.max_steps=-3": [str(exe), "train", "trainer.max_steps=-3"],
            "train method.params.P=1.5 (a rule's range)": [str(exe), "train", "method=stare", "method.params.P=1.5"],
            "train trainer.max_stepz=3 (unknown key)": [str(exe), "train", "trainer.max_stepz=3"],
        }
        base = timed([sys.executable, "-c", "import torch"], cwd, a.reps, 0)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"baseline: python -c 'import torch': {base:.2f} s (median of {a.reps})")
        for name, cmd in cases.items():
            s = timed(cmd, cwd, a.reps, 2)
            print(f"{name:48s} {s:5.2f} s  ({s / base:.2f}x of importing torch)")


if __name__ == "__main__":
    main()
