"""`sweep run` and `sweep status` share one liveness policy: a worker on another host without Slurm is
judged by the run's claim, the same way by both (before, one restarted it and the other showed it running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sweep_fixtures import write_sweep

from stare_lab.record import write_status
from stare_lab.sweep.expand import expand_sweep
from stare_lab.sweep.liveness import write_manifest
from stare_lab.sweep.plan import plan_runs
from stare_lab.sweep.schema import load_sweep
from stare_lab.sweep.status import collect

ROOT = Path(__file__).resolve().parents[1]


def _views(spec, runs):
    plan = plan_runs(runs)
    started = {r.id for r, _ in plan.start}
    active = {r.id for r in plan.active}
    shown = {row["id"]: row["state"] for row in collect(spec.folder)["rows"]}
    return started, active, shown


def test_run_and_status_agree_about_a_worker_on_another_host(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, "hosts", grid={"method": ["full", "random"]}))
    runs = expand_sweep(spec)
    write_manifest(spec.folder, spec.name, spec.digest, [{"id": r.id, "label": r.label} for r in runs], "local")
    for run in runs:  # both records say: running on another host, no Slurm
        run.run_dir.mkdir(parents=True)
        write_status(
            run.run_dir,
            {
                "state": "running",
                "attempts": 1,
                "host": "node-elsewhere",
                "pid": 4242,
                "pid_start": "1",
                "slurm_job_id": None,
                "label": run.label,
            },
        )
    alive, dead = runs
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from stare_lab.record import RunClaim; "
            f"print(RunClaim({str(alive.run_dir)!r}).acquire(0), flush=True); time.sleep(600)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "True"  # the other host's worker holds its claim
        started, active, shown = _views(spec, runs)
        assert active == {alive.id} and shown[alive.id] == "running"  # watched by both
        assert started == {dead.id} and shown[dead.id] == "stalled"  # resumed by run, stalled in status
    finally:
        holder.kill()
        holder.wait()
    started, active, shown = _views(spec, runs)
    assert started == {alive.id, dead.id} and not active and set(shown.values()) == {"stalled"}
