"""A 2-task run on the local Slurm cluster (scripts/slurm_cluster.sh; gloo on CPU): it completes
as one job of 2 tasks with one record, and `scontrol requeue` mid-run resumes both ranks from the
last checkpoint with every step logged exactly once. ~3 min (Slurm's requeue hold and node
clean-up included), hence also `slow`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multiproc_fixtures import TWO_PROCESS
from sweep_fixtures import (
    metric_steps,
    requeue_and_release,
    running_past_checkpoint,
    slurm_cluster,  # noqa: F401
    sweep_env,
    wait_until,
    write_sweep,
)

from stare_lab.record import read_status

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TWO_TASKS = {
    "name": "slurm",
    "nodes": 1,
    "gpus_per_node": 0,
    "tasks_per_node": 2,
    "cpus_per_task": 1,
    "mem_gb": 2,
    "timeout_min": 15,
    "array_parallelism": 1,
    "signal_delay_s": 10,
}


def test_two_task_run_completes_and_a_requeue_resumes_both_ranks(slurm_cluster, tmp_path):
    path = write_sweep(tmp_path, "mp_slurm", overrides={**TWO_PROCESS, "trainer.max_steps": 6}, launcher=TWO_TASKS)
    driver = subprocess.Popen(
        [sys.executable, str(Path(__file__).parents[1] / "support" / "multiproc_fixtures.py"), "run", str(path)],
        env=sweep_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_dir, status = wait_until(
            lambda: running_past_checkpoint(tmp_path, "mp_slurm"), 300, "the run past its second checkpoint", every=0.1
        )
        assert status["world_size"] == 2
        requeued_at = time.time()
        job = status["slurm_job_id"]
        requeue_and_release(job)
        out, _ = driver.communicate(timeout=400)
    finally:
        driver.kill()
    assert driver.returncode == 0, out
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 2 and s["restarts"] >= 1 and s["world_size"] == 2, s
    assert metric_steps(run_dir) == list(range(1, 7))  # every step exactly once
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time"] < requeued_at  # resumed, not restarted
    attempts = sorted((run_dir / ".ranks").iterdir())
    assert [a.name.split("-")[1] for a in attempts] == ["0", "1"]  # one job id, restart count 0 then 1
    assert {f.name for f in attempts[1].glob("rank-*.json")} == {"rank-0.json", "rank-1.json"}
    logs = sorted((tmp_path / "runs" / "mp_slurm" / "submitit").glob(f"{job.split('_')[0]}_*/*_log.out")) or sorted(
        (tmp_path / "runs" / "mp_slurm" / "submitit").rglob("*_log.out")
    )
    text = "".join(p.read_text() for p in logs)
    for rank in (0, 1):  # both ranks resumed from the checkpoint
        assert f"rank {rank} resumes from checkpoint-" in text, text[-3000:]
    assert (
        len(list((run_dir / "wandb").glob("offline-run-*"))) <= 2
        and len(list((run_dir / "eval" / "arithmetic").glob("step-6_*.json"))) == 1
    )
