"""The parts the multi-node tests rely on, without a cluster (seconds): a rank on another node that
dies without a line is named with its node and the step from its stopped heartbeat; a task leaving
its array's pending range is PENDING without a second query; the watch cancels a job still live after
its run recorded its end (a dead node's srun, Slurm's node-failure requeue)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from sweep_fixtures import fake_sacct, write_sweep

from stare_lab.launchers import ranks, slurm
from stare_lab.launchers.jobs import Tracked
from stare_lab.launchers.liveness import slurm_states
from stare_lab.launchers.ranks import RankGate
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import load_sweep
from stare_lab.record import write_status


def _remote_rank_1(tmp_path: Path) -> RankGate:
    zero = RankGate(tmp_path, "5-0", 0, 2)
    zero.started()
    one = RankGate(tmp_path, "5-0", 1, 2)
    one._write_rank({"host": "node-elsewhere", "pid": 4242, "error": None})
    return zero


def test_a_rank_on_another_node_is_dead_once_its_heartbeat_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks, "STALE_S", 1.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    zero = _remote_rank_1(tmp_path)
    beat = tmp_path / ".ranks" / "5-0" / "rank-1.json"
    stop = threading.Event()

    def touch():  # rank 1 alive on its node: its heartbeat goes on
        while not stop.wait(0.2):
            os.utime(beat)

    toucher = threading.Thread(target=touch, daemon=True)
    toucher.start()
    t0 = time.time()
    assert zero.peer_failure(wait_s=0.2) is None  # alive and quiet: not dead, waited for STALE_S to tell
    assert time.time() - t0 >= 1.0  # it waited for the heartbeat window (no upper bound: load-dependent)
    stop.set()
    toucher.join()
    line = zero.peer_failure(wait_s=0.2)
    assert line == (
        "rank 1 on node-elsewhere (pid 4242) died without an error line at step 3 "
        "(no heartbeat for 1 s: its node or its process was lost)"
    ), line
    assert zero.peer_failure(wait_s=0.2, count_dead=False) is None  # SIGTERM: not a failure
    RankGate(tmp_path, "5-0", 1, 2)._write_rank({"host": "node-elsewhere", "pid": 4242, "error": "OOM", "time": 1})
    assert zero.peer_failure(wait_s=0.2) == "rank 1 on node-elsewhere: OOM"  # its own line, with its node


def test_a_task_leaving_its_arrays_pending_range_is_pending_without_squeue(tmp_path, monkeypatch):
    table = "JobID|State|NodeList\\n7_0|RUNNING|n1\\n7_[3-4]|PENDING|None\\n"
    log = fake_sacct(tmp_path, monkeypatch, f'printf "{table}"', squeue="printf '12_0|PENDING\\n'")
    states = slurm_states(["7_0", "7_1", "7_3"])  # 7_1: started, its own record not in accounting yet
    assert states == {"7_0": "RUNNING", "7_1": "PENDING", "7_3": "PENDING", "7_4": "PENDING"}
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["sacct"]  # one query
    # a job accounting does not list at all (submitted a moment ago) is still asked of the controller
    out = slurm_states(["7_0", "12_0"])
    assert out is not None and out["7_0"] == "RUNNING" and out["12_0"] == "PENDING", out
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["sacct", "sacct", "squeue"]


def test_a_job_still_live_after_its_run_recorded_failed_is_cancelled(tmp_path, monkeypatch):
    fake_sacct(tmp_path, monkeypatch, 'printf "JobID|State|NodeList\\n7_0|RUNNING|n1,n2\\n"')
    monkeypatch.setattr(slurm, "LINGER_S", 0.5)
    (run,) = expand_sweep(load_sweep(write_sweep(tmp_path, "linger")))
    run.run_dir.mkdir(parents=True)
    write_status(run.run_dir, {"state": "running", "attempts": 1, "label": run.label})
    cancelled = []
    paths = SimpleNamespace(result_pickle=tmp_path / "none.pkl")
    job = SimpleNamespace(job_id="7_0", paths=paths, cancel=lambda check: cancelled.append(1))
    watch, waiting = slurm.SlurmWatch(), [Tracked(run, job)]
    assert watch.ended_runs(waiting) == [] and cancelled == []  # running: nothing to do
    write_status(run.run_dir, {"state": "failed", "attempts": 1, "label": run.label, "error": "rank 1 on n2 ..."})
    for _ in range(3):  # recorded failed, the job still live: cancelled once, after LINGER_S
        watch.asked = 0.0
        assert watch.ended_runs(waiting) == []
        time.sleep(0.3)
    assert cancelled == [1]
