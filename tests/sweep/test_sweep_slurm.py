"""The slurm launcher on a real cluster with accounting (scripts/slurm_cluster.sh: one node, or the
three nodes .ci/run starts; these runs are one node each).

Skipped without a cluster; under CI (CI=1 or STARE_LAB_REQUIRE_SLURM=1) a missing cluster fails.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from sweep_fixtures import (
    EXECUTE,
    SLURM_LAUNCHER,
    STANDIN_STEP_S,
    crash_array_task_1,
    metric_steps,
    node_idle,
    read_json,
    read_json_lines,
    requeue_and_release,
    run_dirs,
    running_past_checkpoint,
    slurm_cluster,  # noqa: F401
    squeue_state,
    sweep_cli,
    sweep_env,
    use_runner,
    wait_until,
    write_sweep,
)

from stare_lab.cli.sweep import main
from stare_lab.record import read_status

pytestmark = pytest.mark.slurm

SLURM = {**SLURM_LAUNCHER, "signal_delay_s": 10}


def sacct_states(job: str) -> set[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-j", job.split("_")[0], "-o", "State"], capture_output=True, text=True)
    return {s.strip() for s in out.stdout.split()}


def test_small_slurm_sweep_completes_with_correct_records(
    slurm_cluster,
    tmp_path,
    in_process_env,
    capsys,
    monkeypatch,
):
    path = write_sweep(tmp_path, "slurm_ok", grid={"method": ["full", "top_entropy"]}, launcher=SLURM)
    if EXECUTE:
        use_runner(EXECUTE, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 0
    dirs = run_dirs(tmp_path, "slurm_ok")
    assert len(dirs) == 2
    jobs = set()
    for d in dirs:
        s = read_json(d / "status.json")
        assert s["state"] == "finished" and s["attempts"] == 1 and s["error"] is None
        assert re.fullmatch(r"\d+_[01]", s["slurm_job_id"]), s["slurm_job_id"]
        assert metric_steps(d) == [1, 2] and (d / "config.yaml").is_file()
        assert len(list((d / "eval" / "arithmetic").glob("step-2_n2_*.json"))) == 1
        jobs.add(s["slurm_job_id"].split("_")[0])
    assert len(jobs) == 1  # one job array
    job = jobs.pop()
    wait_until(lambda: sacct_states(job) == {"COMPLETED"}, 60, "sacct to show the array COMPLETED")
    capsys.readouterr()
    assert main(["sweep", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 finished" in out and all(f"job {read_json(d / 'status.json')['slurm_job_id']}" in out for d in dirs)


def test_requeued_job_resumes_from_its_checkpoint_without_duplicated_metrics(slurm_cluster, tmp_path):
    path = write_sweep(tmp_path, "slurm_requeue", overrides={"trainer.max_steps": 8}, launcher=SLURM)
    proc = sweep_cli("run", str(path), env=sweep_env(), standin=STANDIN_STEP_S)
    try:
        run_dir, status = wait_until(
            lambda: running_past_checkpoint(tmp_path, "slurm_requeue"),
            240,
            "the run past its second checkpoint",
            every=0.1,
        )
        requeued_at = time.time()
        job = status["slurm_job_id"]
        requeue_and_release(job)  # without Slurm's ~2-minute hold, to keep the test short
        out, _ = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 2 and s["restarts"] >= 1, s
    assert metric_steps(run_dir) == list(range(1, 9))  # every step exactly once
    assert read_json_lines(run_dir / "metrics.jsonl")[0]["time"] < requeued_at  # resumed, not restarted


def test_a_crashing_job_is_recorded_failed_while_the_others_finish(
    slurm_cluster,
    tmp_path,
    in_process_env,
    monkeypatch,
):
    path = write_sweep(tmp_path, "slurm_crash", grid={"method": ["full", "top_entropy"]}, launcher=SLURM)
    use_runner(crash_array_task_1, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1
    states = {
        read_json(d / "status.json")["label"]: read_json(d / "status.json") for d in run_dirs(tmp_path, "slurm_crash")
    }
    assert states["full seed=0"]["state"] == "finished"
    failed = states["top_entropy seed=0"]
    assert failed["state"] == "failed" and "simulated crash at step 1" in failed["error"]
    assert "Traceback" in failed["traceback"] and failed["slurm_job_id"].endswith("_1")


def test_slurms_own_requeue_of_a_failed_runs_job_does_not_train_it_again(
    slurm_cluster,
    tmp_path,
    in_process_env,
    monkeypatch,
):
    """Slurm requeues a job on its own (here `scontrol requeue`, as after a node failure) when no
    `sweep run` is left to cancel it: the failed run's record stays as it was, with no new attempt."""
    path = write_sweep(tmp_path, "slurm_requeue_failed", grid={"method": ["full", "top_entropy"]}, launcher=SLURM)
    use_runner(crash_array_task_1, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1  # the driver has ended: nothing watches the jobs now
    run_dir = next(
        d
        for d in run_dirs(tmp_path, "slurm_requeue_failed")
        if read_json(d / "status.json")["label"] == "top_entropy seed=0"
    )
    failed = read_status(run_dir)
    assert failed["state"] == "failed" and failed["attempts"] == 1
    job = failed["slurm_job_id"]
    metrics = (run_dir / "metrics.jsonl").read_bytes() if (run_dir / "metrics.jsonl").exists() else None
    wait_until(node_idle, 120, "the nodes to be idle after the sweep", every=0.5)
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_until(lambda: squeue_state(job) == "PENDING", 60, "the requeued job to be pending", every=0.2)
    time.sleep(5)  # past slurmd's clean-up of the first attempt (see the requeue test above)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    wait_until(lambda: squeue_state(job) == "", 240, "the requeued job to run and leave the queue", every=0.5)
    assert read_status(run_dir) == failed  # not claimed, not trained, not recorded again
    now = (run_dir / "metrics.jsonl").read_bytes() if (run_dir / "metrics.jsonl").exists() else None
    assert now == metrics


def test_a_killed_driver_rerun_watches_its_pending_and_running_jobs(slurm_cluster, tmp_path):
    """Three runs, two at a time: when the driver dies one job runs and one pends; the re-run
    submits nothing, watches the array, and each run trains once."""
    path = write_sweep(
        tmp_path,
        "slurm_kill",
        overrides={"trainer.max_steps": 3},
        grid={"method": ["full", "random", "top_entropy"]},
        launcher=SLURM,
    )
    driver = sweep_cli("run", str(path), env=sweep_env(), standin=STANDIN_STEP_S)

    def all_submitted():
        statuses = [read_status(d) or {} for d in run_dirs(tmp_path, "slurm_kill")]
        return len(statuses) == 3 and all(s.get("slurm_job_id") for s in statuses)

    try:
        wait_until(all_submitted, 120, "the array submitted", every=0.1)
    finally:
        driver.kill()
        driver.wait()
    rerun = sweep_cli("run", str(path), env=sweep_env(), standin=STANDIN_STEP_S)
    out, _ = rerun.communicate(timeout=400)
    assert rerun.returncode == 0, out
    assert "0 to run (none)" in out and "still running from an earlier launch (watched)" in out
    jobs = set()
    for d in run_dirs(tmp_path, "slurm_kill"):
        s = read_status(d)
        assert s["state"] == "finished" and s["attempts"] == 1 and metric_steps(d) == [1, 2, 3], s
        jobs.add(s["slurm_job_id"].split("_")[0])
    assert len(jobs) == 1  # the first array, nothing resubmitted
