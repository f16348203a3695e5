"""Local queue workers: `workers` long-lived processes share a sweep's runs, each run once.

Real submitit local jobs and a real sweep driver; the stand-in runner of sweep_fixtures (same
record and resume contract, no model) where the test is about the launcher, the real runner where
it is about what a worker process carries from one run to the next.
"""

from __future__ import annotations

import functools
import json
import os
import signal

from sweep_fixtures import (
    crash_method_random,
    metric_steps,
    run_dirs,
    standin_after_meeting,
    standin_execute,
    standin_run_dir,
    use_runner,
    wait_until,
    write_sweep,
)

from stare_lab.cli.sweep import main
from stare_lab.record import read_status
from stare_lab.sweep import worker
from stare_lab.sweep.worker import run_one

FOUR = {"method": ["full", "random", "top_entropy", "stare"]}


def test_two_queue_workers_share_four_runs_each_run_once(tmp_path, in_process_env, monkeypatch):
    path = write_sweep(tmp_path, "queue", grid=FOUR, seeds=[0, 1], launcher={"name": "local", "workers": 2})
    use_runner(functools.partial(standin_after_meeting, meet_dir=str(tmp_path / "met")), monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 0
    statuses = [read_status(d) for d in run_dirs(tmp_path, "queue")]
    assert len(statuses) == 8 and all(s["state"] == "finished" and s["attempts"] == 1 for s in statuses)
    assert len({s["pid"] for s in statuses}) == 2  # two processes, four runs each on average
    jobs = [p for p in (tmp_path / "runs" / "queue" / "submitit").iterdir() if p.name.isdigit()]
    assert len(jobs) == 2  # one submitit job per worker, not per run


def test_a_failed_run_does_not_stop_its_worker(tmp_path, in_process_env, monkeypatch):
    path = write_sweep(
        tmp_path, "goes_on", grid={"method": ["random", "full"]}, launcher={"name": "local", "workers": 1}
    )
    use_runner(crash_method_random, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1
    failed, finished = sorted((read_status(d) for d in run_dirs(tmp_path, "goes_on")), key=lambda s: s["state"])
    assert failed["state"] == "failed" and failed["error"] == "RuntimeError: simulated crash at step 1"
    assert finished["state"] == "finished" and finished["pid"] == failed["pid"]  # the same worker went on


def test_a_killed_queue_worker_fails_its_run_and_a_new_one_takes_the_rest(
    tmp_path,
    in_process_env,
    monkeypatch,
):
    path = write_sweep(
        tmp_path,
        "killed_worker",
        overrides={"trainer.max_steps": 6},
        grid=FOUR,
        launcher={"name": "local", "workers": 1},
    )
    import threading

    outcome = {}
    use_runner(functools.partial(standin_execute, step_s=0.3), monkeypatch.setattr)
    driver = threading.Thread(target=lambda: outcome.update(rc=main(["sweep", "run", str(path)])))
    driver.start()
    running = wait_until(
        lambda: [
            s
            for s in map(read_status, run_dirs(tmp_path, "killed_worker"))
            if s and s["state"] == "running" and s.get("pid")
        ],
        120,
        "a run running",
    )
    victim = running[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    driver.join(timeout=180)
    assert not driver.is_alive() and outcome["rc"] == 1
    statuses = {s["label"]: s for s in map(read_status, run_dirs(tmp_path, "killed_worker"))}
    killed = [s for s in statuses.values() if s["state"] == "failed"]
    assert len(killed) == 1 and killed[0]["attempts"] == 1
    assert [
        s for s in statuses.values() if s["state"] == "finished" and s["attempts"] == 1 and s["pid"] != victim
    ] and sum(s["state"] == "finished" for s in statuses.values()) == 3


def test_only_pending_leaves_a_run_another_worker_took(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "execute_run", standin_execute)
    run_dir = standin_run_dir(tmp_path)
    (run_dir / "status.json").write_text(json.dumps({"state": "failed", "attempts": 1, "error": "RuntimeError: x"}))
    status = run_one(run_dir, only_pending=True)
    assert status["skipped"] and read_status(run_dir)["attempts"] == 1 and not (run_dir / "metrics.jsonl").exists()
    (run_dir / "status.json").write_text(json.dumps({"state": "pending", "attempts": 1}))
    code = {"commit": "0" * 40, "dirty": False, "stare_lab": "0.1.0", "python": "3", "versions": {}, "device": "cpu"}
    status = run_one(run_dir, only_pending=True, code=code)
    assert status["state"] == "finished" and status["attempts"] == 2 and metric_steps(run_dir) == [1, 2]
    assert {k: status["provenance"][-1][k] for k in code} == code  # the worker's loaded code, as given


def test_runs_in_one_worker_give_the_numbers_of_runs_in_fresh_processes(tmp_path, in_process_env):
    """A worker carries nothing from one run into the next: the second run in a process (after a
    different rule) writes the same metrics and samples as the same run alone in its own process."""
    grid = {"method": ["top_entropy", "full"]}
    shared = write_sweep(tmp_path, "shared", grid=grid, launcher={"name": "local", "workers": 1})
    alone = write_sweep(tmp_path, "alone", grid={"method": ["full"]}, launcher={"name": "local", "workers": 1})
    assert main(["sweep", "run", str(shared)]) == 0 and main(["sweep", "run", str(alone)]) == 0
    by_rule = {read_status(d)["label"]: d for d in run_dirs(tmp_path, "shared")}
    (single,) = run_dirs(tmp_path, "alone")
    second = by_rule["full seed=0"]
    assert read_status(second)["pid"] == read_status(by_rule["top_entropy seed=0"])["pid"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("time", "step_time")} for r in rows]  # noqa: E731
    rows = lambda d: strip(json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines())  # noqa: E731
    assert rows(second) == rows(single) and len(rows(single)) == 2
    (a,), (b,) = (list((d / "eval").rglob("*.parquet")) for d in (second, single))
    assert a.read_bytes() == b.read_bytes()
