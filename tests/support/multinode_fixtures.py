"""Helpers of the tests that need the three-node Slurm cluster (tests/multinode/test_multinode_*.py and
tests/vllm_tests/test_multinode_*.py): `scripts/slurm_cluster.sh start --nodes 3`, which .ci/run starts.

- `three_nodes`: SLURM_CONF of a running cluster whose nodes node1..node3 answer; without one the
  test skips with the reason, except under CI (CI=1 or STARE_LAB_REQUIRE_SLURM=1), where it fails.
- `on_node(node, *cmd)`: a command on a node (its network and UTS namespaces: `slurm_cluster.sh exec`).
- `kill_node(node)` / `revive_nodes()`: a node that dies (SIGKILL to every process in its namespaces:
  its slurmd, its jobs' tasks) and its slurmd started again (`slurm_cluster.sh start`), waiting until
  Slurm lists it usable again.
- `node_processes(node)`: the pids still running in a node's namespaces, besides the cluster's own
  daemons and relays.
- `TwoNodes` launcher blocks and `rank_files(run_dir)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from sweep_fixtures import ROOT, _slurm_problem, cluster_conf, cluster_session

SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
NODES = ("node1", "node2", "node3")
REASON = "needs the 3-node Slurm cluster (scripts/slurm_cluster.sh start --nodes 3; .ci/run starts it)"


def _sinfo_nodes(env: dict) -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, timeout=20)
    return dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)


def cluster_problem(conf: Path) -> str | None:
    problem = _slurm_problem(conf)
    if problem:
        return problem
    env = {**os.environ, "SLURM_CONF": str(conf)}
    states = _sinfo_nodes(env)
    if set(NODES) - set(states):
        return f"the running cluster has nodes {sorted(states)}, not node1..node3"
    down = {n: s for n, s in states.items() if n in NODES and s.strip("*~#") not in ("idle", "mix", "alloc")}
    return f"nodes not usable: {down}" if down else None


@pytest.fixture(scope="session")
def three_nodes():
    """SLURM_CONF of the 3-node cluster; skip (or fail under CI) without it."""
    conf = cluster_conf()
    yield from cluster_session(conf, cluster_problem(conf), REASON)


def on_node(node: str, *cmd: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), "exec", node, *cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def kill_node(node: str) -> float:
    """SIGKILL everything on `node` (slurmd, slurmstepd, the tasks); returns the time of the kill."""
    t = time.time()
    subprocess.run([str(SCRIPT), "kill-node", node], check=True, capture_output=True, text=True)
    return t


def node_states() -> dict[str, str]:
    return _sinfo_nodes({**os.environ})


def revive_nodes(timeout: float = 120) -> None:
    """slurmd again on every node of the cluster, and each node usable (ReturnToService=2)."""
    subprocess.run([str(SCRIPT), "start"], check=True, capture_output=True, text=True, timeout=120)
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = node_states()
        if all(states.get(n, "").strip("*~#") in ("idle", "mix", "alloc") for n in NODES):
            return
        time.sleep(1)
    raise AssertionError(f"nodes not back after {timeout:.0f}s: {node_states()}")


def node_processes(node: str, pattern: str = "") -> list[str]:
    """'pid command' of every process in the node's network namespace but the cluster's own (slurmd,
    socat relays); only those whose command contains `pattern` when given."""
    out = subprocess.run(["ip", "netns", "pids", f"stare-{node}"], capture_output=True, text=True)
    found = []
    for pid in out.stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmd.startswith(("slurmd ", "socat ")) or (pattern and pattern not in cmd):
            continue
        found.append(f"{pid} {cmd[:160]}")
    return found


def rank_files(run_dir: Path) -> dict[str, dict[int, dict]]:
    """{attempt: {rank: rank-<r>.json}} of a multi-process run."""
    out: dict[str, dict[int, dict]] = {}
    for d in sorted((Path(run_dir) / ".ranks").iterdir()):
        out[d.name] = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in d.glob("rank-*.json")}
    return out


def slurm_launcher(nodes: int, tasks_per_node: int, **extra) -> dict:
    return {
        "name": "slurm",
        "nodes": nodes,
        "gpus_per_node": 0,
        "tasks_per_node": tasks_per_node,
        "cpus_per_task": 1,
        "mem_gb": 2,
        "timeout_min": 15,
        "array_parallelism": 1,
        "signal_delay_s": 10,
        **extra,
    }


# -- the watcher at scale: a counted stand-in runner and an instrumented driver -------------------

EXECUTIONS = "executions.jsonl"  # in a run folder: one line per time a worker ran the stand-in on it


def counted_standin(run_dir: Path, step_s: float = 1.0) -> None:
    """sweep_fixtures.standin_execute, each call recorded in the run's executions.jsonl (host, pid,
    time): a run trained twice has two lines."""
    import socket

    from sweep_fixtures import standin_execute

    with open(Path(run_dir) / EXECUTIONS, "a") as f:
        f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}) + "\n")
    standin_execute(run_dir, step_s=step_s)


def query_shims(folder: Path, log: Path) -> Path:
    """A folder of `sacct` and `squeue` that log each call ("time parent-pid name args") to `log`, then
    run the real command: put it first on a driver's PATH to count its queries."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("sacct", "squeue"):
        real = shutil.which(name)
        assert real, f"{name} not on PATH"
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "$(date +%s.%N) $PPID {name} $*" >> {log}\nexec {real} "$@"\n')
        script.chmod(0o755)
    return folder


def _log_polls(log: Path) -> None:
    """Record every batched Slurm look of this driver (stare_lab.launchers.liveness.slurm_states): time,
    pid, the job ids asked, whether Slurm answered."""
    from stare_lab.launchers import liveness

    states = liveness.slurm_states

    def logged(job_ids):
        job_ids = [str(j) for j in job_ids if j]
        t = time.time()
        out = states(job_ids)
        with open(log, "a") as f:
            line = {"time": t, "end": time.time(), "pid": os.getpid(), "ids": len(job_ids), "answered": out is not None}
            f.write(json.dumps(line) + "\n")
        return out

    liveness.slurm_states = logged


if __name__ == "__main__":  # `python tests/support/multinode_fixtures.py POLL_LOG STEP_S sweep args...`: the counted
    # stand-in as the runner, every look logged
    import functools
    import sys

    sys.path.insert(0, str(ROOT))
    import multinode_fixtures  # pickled by module name: workers can not import this __main__
    from sweep_fixtures import use_runner

    from stare_lab.cli.sweep import main

    poll_log, step_s = Path(sys.argv[1]), float(sys.argv[2])
    use_runner(functools.partial(multinode_fixtures.counted_standin, step_s=step_s))
    _log_polls(poll_log)
    sys.exit(main(sys.argv[3:]))
