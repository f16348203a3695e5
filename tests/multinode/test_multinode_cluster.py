"""The 3-node Slurm cluster itself (scripts/slurm_cluster.sh start --nodes 3; .ci/run starts it and,
after the tests, checks its teardown with scripts/slurm_cluster_check.sh): three usable nodes, each
with its own hostname and address in namespaces of its own, jobs' tasks inside their node's
namespaces, addresses nowhere else, and `start` idempotent. Seconds."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from multinode_fixtures import NODES, SCRIPT, on_node, three_nodes  # noqa: F401
from sweep_fixtures import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.multinode]

DIR = Path(os.environ.get("STARE_LAB_SLURM_DIR", "/tmp/stare_lab_slurm"))


def _run(*cmd: str, timeout: float = 60) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _ns_inode(ns: str) -> str:
    return f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"


def test_three_nodes_with_their_own_names_and_addresses(three_nodes):  # noqa: F811
    def all_idle():
        states = dict(line.split() for line in _run("sinfo", "-h", "-N", "-o", "%N %t").splitlines())
        return states if states == dict.fromkeys(NODES, "idle") else None

    wait_until(all_idle, 120, "sinfo to show node1..node3 idle", every=1)
    for i, node in enumerate(NODES, 1):
        out = on_node(node, "sh", "-c", "hostname; ip -4 -o addr show | awk '{print $2, $4}'")
        assert out.returncode == 0, out.stderr
        name, *addrs = out.stdout.splitlines()
        assert name == node and sorted(addrs) == [f"eth0 10.77.0.{i}/24", "lo 127.0.0.1/8"], out.stdout
    # the cluster's addresses exist only inside its namespaces: not here, not on the hub's bridge
    assert "10.77.0." not in _run("ip", "-4", "-o", "addr", "show")
    assert _run("ip", "-n", "stare-hub", "-4", "-o", "addr", "show").strip() == ""
    assert _run("hostname").strip() not in NODES


def test_a_job_across_three_nodes_runs_each_task_in_its_nodes_namespaces(three_nodes):  # noqa: F811
    out = on_node("node1", "srun", "-N", "3", "-l", "sh", "-c", "echo $(hostname) $(readlink /proc/self/ns/net)")
    assert out.returncode == 0, out.stderr
    rows = sorted(line.split(":", 1)[1].split() for line in out.stdout.strip().splitlines())
    assert rows == [[node, _ns_inode(f"stare-{node}")] for node in NODES], rows
    # the same from a batch job submitted here (as submitit does): sbatch reaches the controller through the relay
    log = DIR / "log" / f"test-{os.getpid()}.out"
    job = _run("sbatch", "--parsable", "-N", "3", "-o", str(log), "--wrap", "srun -l hostname").strip()
    wait_until(lambda: log.is_file() and len(log.read_text().splitlines()) == 3, 60, f"job {job}'s three lines")
    assert sorted(line.split(": ")[1] for line in log.read_text().splitlines()) == list(NODES)
    log.unlink()


def test_start_again_keeps_the_running_cluster(three_nodes):  # noqa: F811
    pids = {p.name: p.read_text() for p in DIR.glob("*.pid")}
    out = _run(str(SCRIPT), "start", "--nodes", "3", timeout=120)
    assert out.strip().splitlines()[-1] == f"export SLURM_CONF={DIR / 'slurm.conf'}"
    out = _run(str(SCRIPT), "start", timeout=120)  # without --nodes: the running cluster, whatever its size
    assert out.strip().splitlines()[-1] == f"export SLURM_CONF={DIR / 'slurm.conf'}"
    assert {p.name: p.read_text() for p in DIR.glob("*.pid")} == pids  # the same daemons
    assert re.search(r"NodeName=node3 ", (DIR / "slurm.conf").read_text())
