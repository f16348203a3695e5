"""`sweep run` and `sweep status` share one liveness policy: a worker on another host without Slurm is
judged by the run's claim, the same way by both (before, one restarted it and the other showed it running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from sweep_fixtures import fake_sacct, write_sweep

from stare_lab.launchers.jobs import Tracked
from stare_lab.launchers.liveness import Liveness, write_manifest
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.run_plan import plan_runs
from stare_lab.plan.schema import load_sweep
from stare_lab.plan.status import collect
from stare_lab.record import write_status

ROOT = Path(__file__).resolve().parents[2]


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


def test_slurm_is_asked_once_per_look_with_submitits_batched_sacct(tmp_path, monkeypatch):
    from stare_lab.launchers.liveness import slurm_states
    from stare_lab.launchers.slurm import SlurmWatch

    table = (
        "JobID|State|NodeList\\n7_0|RUNNING|n1\\n7_0.batch|RUNNING|n1\\n7_[1-2]|PENDING|None\\n9|CANCELLED by 0|n2\\n"
    )
    log = fake_sacct(tmp_path, monkeypatch, f'printf "{table}"')
    states = slurm_states(["7_0", "7_2", "9", "7_1"])
    assert states == {"7_0": "RUNNING", "7_1": "PENDING", "7_2": "PENDING", "9": "CANCELLED by 0"}
    assert log.read_text().split() == ["sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", "7", "-j", "9"]

    live = Liveness.probe([{"state": "running", "slurm_job_id": "7_1"}], job_ids=["9"])
    assert live.slurm_job_live("7_1") and not live.slurm_job_live("9") and not live.slurm_job_live("8")
    assert len(log.read_text().splitlines()) == 2  # one more call for the whole look (squeue not asked)

    class Job:  # what the watch reads of a submitit SlurmJob
        def __init__(self, job_id):
            self.job_id = job_id
            self.paths = SimpleNamespace(result_pickle=tmp_path / f"{job_id}_result.pkl")

    spec = load_sweep(write_sweep(tmp_path, "watched", grid={"method": ["full", "random", "anchor"]}))
    runs = expand_sweep(spec)
    for run, state in zip(runs, ("running", "pending", "finished"), strict=True):
        run.run_dir.mkdir(parents=True)
        write_status(run.run_dir, {"state": state, "attempts": 1, "label": run.label})
    waiting = [Tracked(run, Job(job)) for run, job in zip(runs, ("7_0", "7_1", "9"), strict=True)]
    watch = SlurmWatch()
    assert watch.ended_runs(waiting) == [waiting[2]]  # cancelled and recorded finished: over; the others live
    assert len(log.read_text().splitlines()) == 3  # one sacct for the three jobs
    assert watch.ended_runs(waiting) == [] and len(log.read_text().splitlines()) == 3  # not asked again within 10 s
    # a job accounting does not list, without a result: not over (submitit could not read its end)
    write_status(runs[2].run_dir, {"state": "failed", "attempts": 1, "label": runs[2].label})
    assert SlurmWatch().ended_runs([Tracked(runs[2], Job("8"))]) == []
    assert log.read_text().splitlines()[-1] == "squeue --array --noheader --format=%i|%T --jobs=8"


def test_a_job_accounting_does_not_list_yet_is_asked_of_the_controller(tmp_path, monkeypatch):
    """slurmdbd records a job seconds after sbatch returns (seen on the CI cluster: a re-run right after
    its driver was killed found the fresh array in squeue only, and resumed runs whose jobs were queued)."""
    from stare_lab.launchers.liveness import slurm_states

    table = "JobID|State|NodeList\\n7_0|RUNNING|n1\\n"
    log = fake_sacct(tmp_path, monkeypatch, f'printf "{table}"', squeue="printf '12_0|RUNNING\\n12_1|PENDING\\n'")
    assert slurm_states(["7_0", "12_0", "12_1", "12_2"]) == {"7_0": "RUNNING", "12_0": "RUNNING", "12_1": "PENDING"}
    assert log.read_text().splitlines()[-1] == "squeue --array --noheader --format=%i|%T --jobs=12"
    live = Liveness.probe([{"state": "pending", "slurm_job_id": "12_1"}, {"state": "running", "slurm_job_id": "12_2"}])
    assert live.slurm_job_live("12_1") and not live.slurm_job_live("12_2")  # 12_2: in neither, ended
    # a controller that does not answer: unknown, so alive (never resume a run a job may still hold)
    log = tmp_path / "sacct.log"
    (tmp_path / "bin" / "squeue").write_text(f"#!/bin/sh\necho squeue >> {log}\nexit 1\n")
    assert slurm_states(["12_1"]) is None
    assert Liveness.probe([{"state": "pending", "slurm_job_id": "12_1"}]).slurm_job_live("12_1")


def test_an_unanswered_sacct_counts_as_alive_and_no_slurm_as_dead(tmp_path, monkeypatch):
    from stare_lab.launchers.liveness import slurm_states

    fake_sacct(tmp_path, monkeypatch, "exit 1")
    assert slurm_states(["5"]) is None
    assert Liveness.probe([{"state": "running", "slurm_job_id": "5"}]).slurm_job_live("5")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slurm_states(["5"]) == {}
