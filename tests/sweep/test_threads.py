"""Threads per worker (issue 30 item 1): the decision against hand cases, the launcher key, and
real worker processes reporting torch's thread count and the OpenMP wait policy they run with.

GNU libgomp (torch's OpenMP on Linux) prints its settings when it loads with OMP_DISPLAY_ENV=VERBOSE:
GOMP_SPINCOUNT is 0 under OMP_WAIT_POLICY=PASSIVE, 300,000 without a policy and 3·10^10 under ACTIVE,
so a worker's log says what the runtime itself read, not what our code believes it set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sweep_fixtures import ROOT, TEST_PATH, read_json, run_dirs, slurm_cluster, sweep_env, sweep_run, write_sweep  # noqa: F401

from stare_lab.launchers import parse_launcher
from stare_lab.launchers.local import LocalLauncher
from stare_lab.launchers.threads import (
    UNSET_POLICY,
    ThreadChoice,
    WorkerThreads,
    busy_elsewhere,
    decide_threads,
    omp_num_threads,
    others_load,
    policy_text,
    spawn_env,
    usable_cpus,
)
from stare_lab.plan.schema import SweepError, load_sweep


@pytest.mark.parametrize(
    "key, environ, cpus, sharing, expected, busy",
    [
        # nothing set: the usable cores (the affinity), shared by the workers, at least one each
        (None, {}, 8, 1, ThreadChoice(8, "8 usable cores"), 0.0),
        (None, {}, 8, 2, ThreadChoice(4, "8 usable cores / 2 workers"), 0.0),
        (None, {}, 2, 2, ThreadChoice(1, "2 usable cores / 2 workers"), 0.0),  # the machine, workers: 2
        (None, {}, 2, 1, ThreadChoice(2, "2 usable cores"), 0.0),  # workers: 1
        (None, {}, 7, 2, ThreadChoice(3, "7 usable cores / 2 workers"), 0.0),  # floor
        (None, {}, 2, 4, ThreadChoice(1, "2 usable cores / 4 workers"), 0.0),  # more workers than cores
        (None, {}, 0, 1, ThreadChoice(1, "1 usable cores"), 0.0),
        # Slurm: cpus_per_task caps a node-wide affinity; a tighter affinity (cgroup) stays
        (None, {"SLURM_CPUS_PER_TASK": "4"}, 64, 1, ThreadChoice(4, "SLURM_CPUS_PER_TASK=4"), 0.0),
        (None, {"SLURM_CPUS_PER_TASK": "16"}, 8, 1, ThreadChoice(8, "8 usable cores"), 0.0),
        (None, {"SLURM_CPUS_PER_TASK": "junk"}, 8, 1, ThreadChoice(8, "8 usable cores"), 0.0),
        # the user's OMP_NUM_THREADS over the cores (first level of a nested list; junk or 0 ignored, as OpenMP does)
        (None, {"OMP_NUM_THREADS": "3"}, 8, 2, ThreadChoice(3, "OMP_NUM_THREADS"), 0.0),
        (None, {"OMP_NUM_THREADS": "6,2"}, 8, 1, ThreadChoice(6, "OMP_NUM_THREADS"), 0.0),
        (None, {"OMP_NUM_THREADS": "0"}, 8, 2, ThreadChoice(4, "8 usable cores / 2 workers"), 0.0),
        (None, {"OMP_NUM_THREADS": "many"}, 8, 1, ThreadChoice(8, "8 usable cores"), 0.0),
        (None, {"OMP_NUM_THREADS": "2", "SLURM_CPUS_PER_TASK": "8"}, 64, 1, ThreadChoice(2, "OMP_NUM_THREADS"), 0.0),
        # cores other processes keep busy when the run starts: fewer threads, at least one (rounded)
        (None, {}, 8, 1, ThreadChoice(5, "8 usable cores, 3.4 busy with other processes"), 3.4),
        (None, {}, 2, 1, ThreadChoice(1, "2 usable cores, 2.0 busy with other processes"), 2.0),  # 2 busy loops
        (None, {}, 2, 1, ThreadChoice(2, "2 usable cores"), 0.4),
        (None, {}, 2, 1, ThreadChoice(1, "2 usable cores, 0.6 busy with other processes"), 0.6),
        (None, {}, 8, 2, ThreadChoice(4, "8 usable cores / 2 workers"), 3.0),  # 5 free: the share is less
        (None, {}, 8, 2, ThreadChoice(3, "8 usable cores / 2 workers, 5.2 busy with other processes"), 5.2),
        (None, {}, 2, 1, ThreadChoice(1, "2 usable cores, 7.0 busy with other processes"), 7.0),
        # the load is of the usable cores: a node-wide affinity's other cores are not Slurm's 4
        (None, {"SLURM_CPUS_PER_TASK": "4"}, 64, 1, ThreadChoice(4, "SLURM_CPUS_PER_TASK=4"), 2.0),
        (
            None,
            {"SLURM_CPUS_PER_TASK": "4"},
            4,
            1,
            ThreadChoice(1, "4 usable cores, 3.0 busy with other processes"),
            3.0,
        ),
        # a number the user or the key gives is taken as is, whatever the load
        (None, {"OMP_NUM_THREADS": "2"}, 2, 1, ThreadChoice(2, "OMP_NUM_THREADS"), 2.0),
        (2, {}, 2, 1, ThreadChoice(2, "launcher.threads_per_worker"), 2.0),
        # the launcher key over everything
        (
            5,
            {"OMP_NUM_THREADS": "1", "SLURM_CPUS_PER_TASK": "2"},
            2,
            4,
            ThreadChoice(5, "launcher.threads_per_worker"),
            0.0,
        ),
        (1, {}, 64, 1, ThreadChoice(1, "launcher.threads_per_worker"), 0.0),
    ],
)
def test_decide_threads_hand_cases(key, environ, cpus, sharing, expected, busy):
    assert decide_threads(key, environ, cpus, sharing, busy) == expected


def test_omp_num_threads_reads_what_openmp_reads():
    assert [omp_num_threads({"OMP_NUM_THREADS": v}) for v in ("1", " 4 ", "8,1", "", "-2", "x")] == [
        1,
        4,
        8,
        None,
        None,
        None,
    ]
    assert omp_num_threads({}) is None


def test_spawn_env_keeps_a_policy_the_user_set():
    assert spawn_env({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "30000"}
    assert spawn_env({"OMP_WAIT_POLICY": "active"}) == {}
    assert spawn_env({"GOMP_SPINCOUNT": "0"}) == {}


def test_policy_text():
    assert policy_text({}) == UNSET_POLICY
    assert policy_text({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "30000"}) == "PASSIVE, GOMP_SPINCOUNT=30000"
    assert policy_text({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
    assert policy_text({"GOMP_SPINCOUNT": "5"}) == "GOMP_SPINCOUNT=5"


def test_busy_elsewhere_sees_busy_loops_and_not_itself():
    cpus = len(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.3)  # started
        busy = busy_elsewhere(0.5)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert cpus - 0.6 <= busy <= cpus + 1e-9, busy  # every usable core kept busy by the loops


def test_others_load_by_hand():
    # 2 cores over 1 s: 200 ticks in all; 150 busy, of which this process's own 0.5 s
    assert others_load((1000, 5000), (1150, 5200), 2, 0.5, 1.0) == pytest.approx(1.0)
    assert others_load((0, 0), (200, 200), 2, 0.0, 1.0) == 2.0  # two busy loops
    assert others_load((0, 0), (100, 200), 2, 1.0, 1.0) == 0.0  # all of it this process's own
    assert others_load((0, 0), (10, 200), 2, 0.5, 1.0) == 0.0  # never below 0 (clock granularity)
    assert others_load((5, 100), (5, 100), 2, 0.0, 1.0) == 0.0  # no tick passed


def test_usable_cpus_is_the_affinity():
    assert usable_cpus() == len(os.sched_getaffinity(0))


def test_launchers_tell_their_workers_the_key_and_who_shares_the_cores():
    fail = _raise
    local = parse_launcher({"name": "local", "workers": 3, "processes": 2}, {}, fail)
    assert local.worker_threads() == WorkerThreads(per_worker=None, sharing=6)
    keyed = parse_launcher({"name": "local", "workers": 2, "threads_per_worker": 4}, {}, fail)
    assert keyed.worker_threads() == WorkerThreads(per_worker=4, sharing=2)
    slurm = parse_launcher({"name": "slurm", "cpus_per_task": 4, "threads_per_worker": 2}, {}, fail)
    assert slurm.worker_threads() == WorkerThreads(per_worker=2, sharing=1)  # a task has its own cores
    assert parse_launcher({"name": "slurm"}, {}, fail).worker_threads() == WorkerThreads(None, 1)


@pytest.mark.slurm
def test_the_slurm_job_script_sets_the_policy_unless_the_job_or_its_setup_sets_one(slurm_cluster, tmp_path):  # noqa: F811
    # submitit's SlurmExecutor looks for `srun` when it is built: without Slurm this skips (slurm_cluster)
    slurm = parse_launcher({"name": "slurm", "setup": ["module load x"]}, {}, _raise)
    ex = slurm.executor(tmp_path, "t")
    script = ex._make_submission_file_text("python -u -m submitit.core._submit x", "uid")
    lines = script.splitlines()
    setup = next(i for i, x in enumerate(lines) if "OMP_WAIT_POLICY" in x)
    assert lines.index("module load x") < setup < next(i for i, x in enumerate(lines) if x.startswith("srun"))
    user_setup = subprocess.run(  # the user's own setup line, then ours
        ["bash", "-c", f'export OMP_WAIT_POLICY=ACTIVE\n{lines[setup]}\necho "$OMP_WAIT_POLICY $GOMP_SPINCOUNT"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert user_setup.stdout.rstrip("\n") == "ACTIVE "
    for given, expect in (
        ({}, "PASSIVE 30000"),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE "),
        ({"GOMP_SPINCOUNT": "7"}, " 7"),
    ):
        out = subprocess.run(
            ["bash", "-c", f'{lines[setup]}\necho "$OMP_WAIT_POLICY $GOMP_SPINCOUNT"'],
            env={"PATH": "/usr/bin:/bin", **given},
            capture_output=True,
            text=True,
        )
        assert out.stdout.rstrip("\n") == expect, (given, out.stdout, out.stderr)


@pytest.mark.parametrize(
    "value, problem",
    [
        (0, "launcher.threads_per_worker: must be ≥ 1, got 0"),
        ("two", "launcher.threads_per_worker: expected an integer, got 'two'"),
        (1.5, "launcher.threads_per_worker: expected an integer, got 1.5"),
    ],
)
def test_a_bad_threads_per_worker_is_refused_in_one_line(tmp_path, value, problem):
    path = write_sweep(tmp_path, "bad", launcher={"name": "local", "threads_per_worker": value})
    with pytest.raises(SweepError, match=re.escape(problem)):
        load_sweep(path)
    out = sweep_run(path, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and problem in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()  # nothing half-launched


def test_threads_per_worker_null_and_a_number_load():
    assert load_sweep_launcher({"name": "local"}).threads_per_worker is None
    assert load_sweep_launcher({"name": "slurm", "threads_per_worker": 3}).threads_per_worker == 3


def load_sweep_launcher(block):
    return parse_launcher(block, {}, _raise)


def _raise(key, msg):
    raise SweepError(f"{key}: {msg}")


# -- real worker processes ----------------------------------------------------------------------


def report_threads(threads: WorkerThreads) -> dict:
    """A worker's first steps (start_worker), then what its process runs with."""
    import os

    import torch

    from stare_lab.sweep.worker import start_worker, threads_record

    started = start_worker(threads)
    torch.ones(64, 64) @ torch.ones(64, 64)
    return {
        "started": started,
        "torch": torch.get_num_threads(),
        "policy": os.environ.get("OMP_WAIT_POLICY"),
        "record": threads_record(),
    }


OURS = "PASSIVE, GOMP_SPINCOUNT=30000"  # what a worker starts with when the user set no policy
SPIN = {OURS: "30000", "ACTIVE": "30000000000"}  # what libgomp then reads


def _spincount(log: str) -> str:
    """GOMP_SPINCOUNT as libgomp printed it when it loaded (OMP_DISPLAY_ENV=VERBOSE)."""
    found = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", log)
    assert len(found) == 1, log
    return found[0]


def _decided(share: int, source: str, threads: int) -> bool:
    """A decision from the cores: the workers' share, or fewer when other processes kept cores busy."""
    return threads == share if "busy with other processes" not in source else 1 <= threads < share


def _submit(tmp_path: Path, monkeypatch, name: str, block: dict, env: dict):
    """report_threads in a worker process of the local launcher's executor, started under `env`."""
    for var in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    launcher = parse_launcher({"name": "local", **block}, {}, _raise)
    assert isinstance(launcher, LocalLauncher)
    return launcher.executor(tmp_path / name, "threads").submit(report_threads, launcher.worker_threads())


@pytest.fixture
def job_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*TEST_PATH, str(ROOT)]))  # report_threads, by reference
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")
    return monkeypatch


def test_real_local_workers_report_their_threads_and_wait_policy(tmp_path, job_env):
    """Three worker processes through the local launcher's own executor, each started under another
    environment: what torch runs with, and what libgomp read when it loaded."""
    cpus = usable_cpus()
    cases = {  # (launcher block, the user's environment)
        "nothing_set": ({"workers": 2}, {}),
        "user_omp": ({"workers": 2}, {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}),
        "key_over_omp": ({"workers": 1, "threads_per_worker": 3}, {"OMP_NUM_THREADS": "1"}),
    }
    jobs = {name: _submit(tmp_path, job_env, name, block, env) for name, (block, env) in cases.items()}
    got = {name: job.result() for name, job in jobs.items()}
    logs = {name: Path(job.paths.stderr).read_text() for name, job in jobs.items()}

    ours = got["nothing_set"]
    assert ours["started"]["from"].startswith(f"{cpus} usable cores / 2 workers")
    assert _decided(max(1, cpus // 2), ours["started"]["from"], ours["torch"])
    assert (ours["policy"], ours["started"]["omp_wait_policy"]) == ("PASSIVE", OURS)
    assert got["user_omp"]["started"] == {"torch": 2, "from": "OMP_NUM_THREADS", "omp_wait_policy": "ACTIVE"}
    keyed = {"torch": 3, "from": "launcher.threads_per_worker", "omp_wait_policy": OURS}
    assert got["key_over_omp"]["started"] == keyed
    for name, result in got.items():
        assert result["torch"] == result["started"]["torch"] and result["record"] == result["started"], name
        assert _spincount(logs[name]) == SPIN[result["started"]["omp_wait_policy"]], name


def test_a_worker_starting_beside_busy_cores_takes_fewer_threads(tmp_path, job_env):
    """`workers: 1` on cores other processes keep busy (a busy loop per core): one thread, said so."""
    cpus = usable_cpus()
    if cpus < 2:
        pytest.skip("one usable core: one thread whatever the load")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        got = _submit(tmp_path, job_env, "loaded", {"workers": 1}, {}).result()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert got["torch"] == 1 and got["started"]["from"].startswith(f"{cpus} usable cores, "), got
    assert got["started"]["from"].endswith(" busy with other processes"), got


def test_a_real_sweep_run_records_its_threads_and_policy(tmp_path):
    """A one-run sweep through `sweep run` (local launcher, the queue worker, the real runner): the
    attempt's provenance says what the worker ran with; its log, what libgomp read."""
    path = write_sweep(
        tmp_path, "thr", launcher={"name": "local", "workers": 2, "threads_per_worker": None}, eval={"enabled": False}
    )
    drop = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    env = {k: v for k, v in sweep_env(OMP_DISPLAY_ENV="VERBOSE").items() if k not in drop}
    out = sweep_run(path, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = run_dirs(tmp_path, "thr")
    status = read_json(run / "status.json")
    assert status["state"] == "finished"
    cpus = usable_cpus()
    threads = status["provenance"][-1]["threads"]
    assert threads["from"].startswith(f"{cpus} usable cores / 2 workers") and threads["omp_wait_policy"] == OURS
    assert _decided(max(1, cpus // 2), threads["from"], threads["torch"]), threads
    logs = [p.read_text() for p in (tmp_path / "runs" / "thr").rglob("*_log.err")]
    assert [_spincount(log) for log in logs if "GOMP_SPINCOUNT" in log] == ["30000"], logs


def test_a_process_that_loaded_openmp_without_a_policy_records_it_unset():
    code = (
        "import os; [os.environ.pop(k, None) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]; import torch; "
        "from stare_lab.sweep.worker import start_worker; print(start_worker(1)['omp_wait_policy'])"
    )
    env = {k: v for k, v in sweep_env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == UNSET_POLICY


def test_the_conf_files_document_the_key():
    for name in ("local", "slurm"):
        conf = yaml.safe_load((ROOT / "stare_lab" / "conf" / "launcher" / f"{name}.yaml").read_text())
        assert conf["threads_per_worker"] is None


def test_the_decision_is_exported_for_accelerate_and_made_afresh_for_the_next_run():
    """accelerate sets torch's threads itself on a multi-process CPU run unless OMP_NUM_THREADS is set
    (a rank alone on its node took every core its node had, not its task's one), so a worker exports
    its decision; the next run of a queue worker decides again (its own export is not the user's), and
    a user's OMP_NUM_THREADS is never replaced."""
    code = """
import json, os
from stare_lab.launchers.threads import WorkerThreads
from stare_lab.sweep import worker
out = [worker.start_worker(WorkerThreads(per_worker=2))["torch"], os.environ.get("OMP_NUM_THREADS")]
worker._PLAN[0] = WorkerThreads(per_worker=1)
started = worker.run_threads()
out += [started["torch"], started["from"], os.environ.get("OMP_NUM_THREADS")]
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [2, "2", 1, "launcher.threads_per_worker", "1"]
    env["OMP_NUM_THREADS"] = "1"
    user = code.replace("per_worker=2", "per_worker=None").replace("per_worker=1", "per_worker=None")
    done = subprocess.run([sys.executable, "-c", user], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [1, "1", 1, "OMP_NUM_THREADS", "1"]
