"""The sweep's watcher at scale on the 3-node Slurm cluster (scripts/slurm_cluster.sh start --nodes 3;
.ci/run starts it): 30 one-step runs (a counted stand-in runner: no model, so the test is about the
driver), one job array, 6 at a time spread over the three nodes; the driver is SIGKILLed twice at
random moments and started again. Checked: 0 runs lost (30 finished), 0 trained twice (each run's
stand-in ran once, one attempt), and every look of a driver at Slurm is one batched `sacct` for the
whole sweep (counted through PATH shims), with one `squeue` more only in the look right after an
array's submission, before accounting has recorded it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multinode_fixtures import EXECUTIONS, query_shims, slurm_launcher, three_nodes  # noqa: F401
from sweep_fixtures import run_dirs, sweep_env, write_sweep

from stare_lab.record import read_status

pytestmark = [pytest.mark.slurm, pytest.mark.multinode]

HERE = Path(__file__).resolve().parent
RUNS = 30
STEP_S = 2.0


def _driver(poll_log: Path, path: Path, shims: Path) -> subprocess.Popen:
    env = sweep_env(PATH=f"{shims}{os.pathsep}{os.environ['PATH']}")
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE.parent / "support" / "multinode_fixtures.py"),
            str(poll_log),
            str(STEP_S),
            "run",
            str(path),
        ],
        cwd=HERE.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _lines(path: Path) -> list:
    return path.read_text().splitlines() if path.is_file() else []


def test_thirty_runs_two_driver_kills_none_lost_none_twice_one_query_per_look(three_nodes, tmp_path):  # noqa: F811
    seed = int(os.environ.get("STARE_LAB_WATCH_SEED") or time.time())
    rng = random.Random(seed)
    path = write_sweep(
        tmp_path,
        "scale",
        overrides={"trainer.max_steps": 1},
        seeds=list(range(RUNS)),
        # 2 CPUs a task on 4-CPU nodes: 6 at once are 2 on each node
        launcher=slurm_launcher(1, 1, cpus_per_task=2, mem_gb=1, array_parallelism=6),
    )
    polls, queries = tmp_path / "polls.jsonl", tmp_path / "queries.log"
    shims = query_shims(tmp_path / "bin", queries)
    drivers, outputs, kills = [], [], []
    t0 = time.time()
    for _ in range(2):  # started, then SIGKILLed at a random moment
        driver = _driver(polls, path, shims)
        drivers.append(driver)
        delay = rng.uniform(2.0, 25.0)
        try:
            driver.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            driver.kill()
            kills.append(round(time.time() - t0, 1))
        outputs.append(driver.communicate()[0])
    last = _driver(polls, path, shims)
    drivers.append(last)
    outputs.append(last.communicate(timeout=600)[0])
    took = time.time() - t0
    note = f"seed {seed}, kills at {kills} s, {took:.0f} s in all; driver output:\n" + "\n---\n".join(outputs)
    assert last.returncode == 0, note

    dirs = run_dirs(tmp_path, "scale")
    statuses = [read_status(d) for d in dirs]
    assert len(dirs) == RUNS and all(s["state"] == "finished" for s in statuses), note  # 0 lost
    runs_of = [len(_lines(d / EXECUTIONS)) for d in dirs]
    assert runs_of == [1] * RUNS, (runs_of, note)  # 0 trained twice
    assert all(s["attempts"] == 1 for s in statuses), [s["attempts"] for s in statuses]
    hosts = {json.loads(_lines(d / EXECUTIONS)[0])["host"] for d in dirs}
    assert hosts == {"node1", "node2", "node3"}, hosts
    jobs = {s["slurm_job_id"].split("_")[0] for s in statuses}

    # one batched query per look: each look of each driver made one sacct, for every job id at once
    looks = [json.loads(x) for x in _lines(polls)]
    calls = [line.split(" ", 3) for line in _lines(queries)]  # time, parent pid, name, args
    by_driver = {d.pid: [c for c in calls if int(c[1]) == d.pid] for d in drivers}
    counted = []
    for d in drivers:
        mine = [look for look in looks if look["pid"] == d.pid]
        sacct = [c for c in by_driver[d.pid] if c[2] == "sacct"]
        squeue = [c for c in by_driver[d.pid] if c[2] == "squeue"]
        if d is last:
            assert mine, note
        counted.append({"looks": len(mine), "sacct": len(sacct), "squeue": len(squeue)})
        # each look made exactly one sacct and at most one squeue (for jobs accounting did not list
        # yet), and none happened outside a look (a killed driver may have died inside one, unlogged)
        for name, calls_, allowed in (("sacct", sacct, {1}), ("squeue", squeue, {0, 1})):
            inside = [
                sum(1 for c in calls_ if look["time"] <= float(c[0]) <= look["end"]) for look in mine if look["ids"]
            ]
            assert set(inside) <= allowed, (name, inside, counted, note)
            assert len(calls_) - sum(inside) <= (0 if d is last else 1), (name, counted, note)
        for c in sacct:  # one -j per array job of the sweep, never one per run
            assert c[3].count("-j ") <= len(jobs), c
    assert sum(c["looks"] for c in counted) >= 3
    # squeue only right after a submission, before accounting recorded the new array (one per array)
    assert sum(c["squeue"] for c in counted) <= len(jobs), (counted, note)
    print(f"\nwatcher at scale: seed {seed}, kills at {kills} s, {took:.0f} s; per driver {counted}; jobs {jobs}")
