"""Threads per worker (issue 30 item 1): the decision against hand cases, the launcher key, and
real worker processes reporting torch's thread count and the OpenMP wait policy they run with.

GNU libgomp (torch's OpenMP on Linux) prints its settings when it loads with OMP_DISPLAY_ENV=VERBOSE:
GOMP_SPINCOUNT is 0 under OMP_WAIT_POLICY=PASSIVE, 300,000 without a policy and 3·10^10 under ACTIVE,
so a worker's log says what the runtime itself read, not what our code believes it set.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sweep_fixtures import ROOT, read_json, run_dirs, sweep_env, write_sweep

from stare_lab.sweep.launchers import parse_launcher
from stare_lab.sweep.launchers.local import LocalLauncher
from stare_lab.sweep.schema import SweepError, load_sweep
from stare_lab.sweep.threads import (
    PASSIVE,
    UNSET_POLICY,
    ThreadChoice,
    WorkerThreads,
    decide_threads,
    omp_num_threads,
    spawn_env,
    usable_cpus,
)


@pytest.mark.parametrize(
    "key, environ, cpus, sharing, expected",
    [
        # nothing set: the usable cores (the affinity), shared by the workers, at least one each
        (None, {}, 8, 1, ThreadChoice(8, "8 usable cores")),
        (None, {}, 8, 2, ThreadChoice(4, "8 usable cores / 2 workers")),
        (None, {}, 2, 2, ThreadChoice(1, "2 usable cores / 2 workers")),  # the machine, workers: 2
        (None, {}, 2, 1, ThreadChoice(2, "2 usable cores")),  # workers: 1
        (None, {}, 7, 2, ThreadChoice(3, "7 usable cores / 2 workers")),  # floor
        (None, {}, 2, 4, ThreadChoice(1, "2 usable cores / 4 workers")),  # more workers than cores
        (None, {}, 0, 1, ThreadChoice(1, "1 usable cores")),
        # Slurm: cpus_per_task caps a node-wide affinity; a tighter affinity (cgroup) stays
        (None, {"SLURM_CPUS_PER_TASK": "4"}, 64, 1, ThreadChoice(4, "SLURM_CPUS_PER_TASK=4")),
        (None, {"SLURM_CPUS_PER_TASK": "16"}, 8, 1, ThreadChoice(8, "8 usable cores")),
        (None, {"SLURM_CPUS_PER_TASK": "junk"}, 8, 1, ThreadChoice(8, "8 usable cores")),
        # the user's OMP_NUM_THREADS over the cores (first level of a nested list; junk or 0 ignored, as OpenMP does)
        (None, {"OMP_NUM_THREADS": "3"}, 8, 2, ThreadChoice(3, "OMP_NUM_THREADS")),
        (None, {"OMP_NUM_THREADS": "6,2"}, 8, 1, ThreadChoice(6, "OMP_NUM_THREADS")),
        (None, {"OMP_NUM_THREADS": "0"}, 8, 2, ThreadChoice(4, "8 usable cores / 2 workers")),
        (None, {"OMP_NUM_THREADS": "many"}, 8, 1, ThreadChoice(8, "8 usable cores")),
        (None, {"OMP_NUM_THREADS": "2", "SLURM_CPUS_PER_TASK": "8"}, 64, 1, ThreadChoice(2, "OMP_NUM_THREADS")),
        # the launcher key over everything
        (5, {"OMP_NUM_THREADS": "1", "SLURM_CPUS_PER_TASK": "2"}, 2, 4, ThreadChoice(5, "launcher.threads_per_worker")),
        (1, {}, 64, 1, ThreadChoice(1, "launcher.threads_per_worker")),
    ],
)
def test_decide_threads_hand_cases(key, environ, cpus, sharing, expected):
    assert decide_threads(key, environ, cpus, sharing) == expected


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
    assert spawn_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert spawn_env({"OMP_WAIT_POLICY": "active"}) == {}


def test_usable_cpus_is_the_affinity():
    import os

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


def test_the_slurm_job_script_exports_a_passive_policy_unless_the_job_sets_one(tmp_path):
    slurm = parse_launcher({"name": "slurm", "setup": ["module load x"]}, {}, _raise)
    ex = slurm.executor(tmp_path, "t")
    script = ex._make_submission_file_text("python -u -m submitit.core._submit x", "uid")
    lines = script.splitlines()
    setup = lines.index('export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"')
    assert setup < lines.index("module load x") < next(i for i, x in enumerate(lines) if x.startswith("srun"))
    for given, expect in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = {"PATH": "/usr/bin:/bin"} | ({"OMP_WAIT_POLICY": given} if given else {})
        out = subprocess.run(
            ["bash", "-c", f'{lines[setup]}; echo "$OMP_WAIT_POLICY"'], env=env, capture_output=True, text=True
        )
        assert out.stdout.strip() == expect


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
    out = subprocess.run(
        [sys.executable, "-m", "stare_lab.sweep", "run", str(path)],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
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


SPIN = {"PASSIVE": "0", "ACTIVE": "30000000000", None: "300000"}


def _spincount(log: str) -> str:
    """GOMP_SPINCOUNT as libgomp printed it when it loaded (OMP_DISPLAY_ENV=VERBOSE)."""
    found = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", log)
    assert len(found) == 1, log
    return found[0]


def test_real_local_workers_report_their_threads_and_wait_policy(tmp_path, monkeypatch):
    """Three worker processes through the local launcher's own executor, each started under another
    environment: what torch runs with, and what libgomp read when it loaded."""
    monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'tests'}:{ROOT}")
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")
    cpus = usable_cpus()
    cases = {
        # (launcher block, the user's environment) -> (torch threads, their source, policy)
        "nothing set": (
            {"workers": 2},
            {},
            (max(1, cpus // 2), f"{cpus} usable cores / 2 workers", PASSIVE),
        ),
        "the user's OMP_NUM_THREADS and policy": (
            {"workers": 2},
            {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
            (2, "OMP_NUM_THREADS", "ACTIVE"),
        ),
        "the key over OMP_NUM_THREADS": (
            {"workers": 1, "threads_per_worker": 3},
            {"OMP_NUM_THREADS": "1"},
            (3, "launcher.threads_per_worker", PASSIVE),
        ),
    }
    jobs = {}
    for name, (block, env, _) in cases.items():
        for var in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        launcher = parse_launcher({"name": "local", **block}, {}, _raise)
        assert isinstance(launcher, LocalLauncher)
        ex = launcher.executor(tmp_path / name.replace(" ", "_").replace("'", ""), "threads")
        jobs[name] = ex.submit(report_threads, launcher.worker_threads())
    for name, job in jobs.items():
        threads, source, policy = cases[name][2]
        got = job.result()
        assert got["torch"] == threads and got["policy"] == policy, (name, got)
        assert got["started"] == {"torch": threads, "from": source, "omp_wait_policy": policy}, name
        assert got["record"] == got["started"], name
        assert _spincount(Path(job.paths.stderr).read_text()) == SPIN[policy], name


def test_a_real_sweep_run_records_its_threads_and_policy(tmp_path):
    """A one-run sweep through `sweep run` (local launcher, the queue worker, the real runner): the
    attempt's provenance says what the worker ran with; its log, what libgomp read."""
    path = write_sweep(
        tmp_path, "thr", launcher={"name": "local", "workers": 2, "threads_per_worker": None}, eval={"enabled": False}
    )
    env = {k: v for k, v in sweep_env(OMP_DISPLAY_ENV="VERBOSE").items() if not k.startswith("OMP_NUM_THREADS")}
    env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run(
        [sys.executable, "-m", "stare_lab.sweep", "run", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = run_dirs(tmp_path, "thr")
    status = read_json(run / "status.json")
    assert status["state"] == "finished"
    cpus = usable_cpus()
    assert status["provenance"][-1]["threads"] == {
        "torch": max(1, cpus // 2),
        "from": f"{cpus} usable cores / 2 workers",
        "omp_wait_policy": PASSIVE,
    }
    logs = [p.read_text() for p in (tmp_path / "runs" / "thr").rglob("*_log.err")]
    assert [_spincount(log) for log in logs if "GOMP_SPINCOUNT" in log] == ["0"], logs


def test_a_process_that_loaded_openmp_without_a_policy_records_it_unset():
    code = (
        "import os; os.environ.pop('OMP_WAIT_POLICY', None); import torch; "
        "from stare_lab.sweep.worker import start_worker; print(start_worker(1)['omp_wait_policy'])"
    )
    env = {k: v for k, v in sweep_env().items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == UNSET_POLICY


def test_the_conf_files_document_the_key():
    for name in ("local", "slurm"):
        conf = yaml.safe_load((ROOT / "stare_lab" / "conf" / "launcher" / f"{name}.yaml").read_text())
        assert conf["threads_per_worker"] is None
