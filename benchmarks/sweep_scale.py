"""Sweep scale: expanding a 10,000-run sweep, and `sweep status` over 1,000 run directories.

    .venv/bin/python benchmarks/sweep_scale.py

Prints the time of each (imports excluded, then the whole `stare-lab sweep status` command as a
subprocess) and the ratio to the one-second budget. For reference, composing one run through
Hydra (stare_lab.config.run_config.compose) is also timed: 10,000 of those would take minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stare_lab.core.utils import atomic_write_json  # noqa: E402
from stare_lab.launchers.liveness import write_manifest  # noqa: E402
from stare_lab.methods import list_methods  # noqa: E402  (imports torch: kept out of the timings)
from stare_lab.plan.expand import expand_sweep  # noqa: E402
from stare_lab.plan.schema import load_sweep  # noqa: E402
from stare_lab.plan.status import collect, format_status  # noqa: E402
from stare_lab.record import new_status  # noqa: E402

BUDGET_S = 1.0


def big_sweep(folder: Path) -> Path:
    rules = [m for m in list_methods() if m not in ("random", "attn_soft", "opefo")][:10]
    data = {
        "name": "scale",
        "base": {"model": "builtin", "logger": "none"},
        "grid": {
            "method": rules,
            "trainer.learning_rate": [1e-4 * (i + 1) for i in range(10)],
            "trainer.max_steps": [10 * (i + 1) for i in range(10)],
        },
        "seeds": list(range(10)),
        "output": str(folder / "runs"),
    }
    path = folder / "scale.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake_runs(folder: Path, n: int) -> Path:
    """A sweep folder with n run directories in every state, and its manifest."""
    sweep = folder / "runs" / "status1k"
    states = ["finished"] * 7 + ["failed", "interrupted", "pending"]
    runs = []
    for i in range(n):
        run_id = f"{i:012x}"
        status = new_status(f"rule{i % 13} seed={i % 3}", None, i % 3)
        status.update(
            state=states[i % len(states)],
            attempts=1,
            slurm_job_id=f"{1000 + i // 100}_{i % 100}",
            duration_s=12.5,
            error="RuntimeError: boom" if states[i % len(states)] == "failed" else None,
        )
        atomic_write_json(sweep / run_id / "status.json", status)
        runs.append({"id": run_id, "label": status["label"], "variant": None, "seed": i % 3})
    write_manifest(sweep, "status1k", "digest", runs, launcher="slurm")
    (folder / "status1k.yaml").write_text(
        yaml.safe_dump({"name": "status1k", "base": {"model": "builtin"}, "output": str(folder / "runs")})
    )
    return folder / "status1k.yaml"


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = load_sweep(big_sweep(tmp))
        cold_s, runs = timed(lambda: expand_sweep(spec), repeat=1)
        warm_s, runs = timed(lambda: expand_sweep(spec))
        from stare_lab.config.run_config import compose

        one_compose_s, _ = timed(lambda: compose(runs[0].overrides), repeat=2)

        status_file = fake_runs(tmp, 1000)
        status_spec = load_sweep(status_file)
        status_s, text = timed(lambda: format_status("status1k", collect(status_spec.folder), show_all=True))
        cmd = [sys.executable, "-m", "stare_lab.cli", "sweep", "status", str(status_file)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        cli_s = time.perf_counter() - t
        assert proc.returncode == 0 and "1000 runs" in proc.stdout, proc.stderr

    print(f"{'what':<58} {'seconds':>8} {'/ 1 s budget':>13}")
    rows = [
        (f"expand a {len(runs):,}-run sweep (first call, incl. Hydra compose of the base)", cold_s),
        (f"expand a {len(runs):,}-run sweep (again)", warm_s),
        ("sweep status over 1,000 run dirs (collect + format)", status_s),
        ("`stare-lab sweep status` over 1,000 run dirs (whole command)", cli_s),
    ]
    for what, s in rows:
        print(f"{what:<58} {s:>8.3f} {s / BUDGET_S:>13.2f}")
    print(
        f"(reference: one Hydra compose() takes {one_compose_s:.3f} s; 10,000 would take "
        f"{one_compose_s * len(runs) / 60:.0f} min)"
    )
    print(f"status output: {len(text.splitlines())} lines; {json.dumps(text.splitlines()[0])}")


if __name__ == "__main__":
    main()
