"""Runs across nodes of the 3-node Slurm cluster (scripts/slurm_cluster.sh start --nodes 3; .ci/run
starts it): the real runner on the built-in model, gloo on CPU, ranks in different network and UTS
namespaces, so torch's rendezvous and every collective cross the cluster's bridge.

1. A run of 2 nodes × 1 task equals the same run as 1 node × 2 tasks: ranks 0-1 on node1 and node2,
   MASTER_ADDR node1 (its bridge address, not loopback), the same metrics, evaluation and record, one
   W&B run written by rank 0 alone.
2. The node of rank 1 dies mid-run (its slurmd and its tasks SIGKILLed): the run is `failed` with one
   line naming rank 1's node and the step, nothing of the run is left on any node, the sweep's other
   run finishes, and `sweep run --retry-failed` resumes the run from its last checkpoint with every step
   logged exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from multinode_fixtures import (
    kill_node,
    node_processes,
    node_states,
    rank_files,
    revive_nodes,
    slurm_launcher,
    three_nodes,  # noqa: F401
)
from multiproc_fixtures import TWO_PROCESS
from sweep_fixtures import metric_steps, run_dirs, sweep_env, wait_until, write_sweep

from stare_lab.record import read_status

pytestmark = [pytest.mark.slurm, pytest.mark.multinode]
ROOT = Path(__file__).resolve().parents[2]

# Completions long enough for the worked answer (`48*2=96;37+96=133#`): some rollouts are right,
# so groups have non-zero advantages and the steps move the weights (with 8 tokens every reward is 0).
LEARNS = {"trainer.max_steps": 3, "trainer.max_completion_length": 20}
# Keys of a metrics row that time the step rather than compute it.
CLOCK_KEYS = ("time", "runtime", "per_second", "_s", "duration", "timestamp", "elapsed", "step_time")


def _driver(path: Path, *args: str):
    return subprocess.Popen(
        [sys.executable, "-m", "stare_lab.cli", "sweep", "run", str(path), *args],
        cwd=ROOT,
        env=sweep_env(WANDB_MODE="offline"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wandb(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    data["base"]["logger"] = "wandb_offline"
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _computed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(c in k for c in CLOCK_KEYS)}


def _eval_files(run_dir: Path) -> dict[str, dict]:
    out = {}
    for f in sorted((run_dir / "eval").rglob("*.json")):
        data = json.loads(f.read_text())
        key = str(f.relative_to(run_dir / "eval"))
        out[key] = {k: v for k, v in data.items() if k not in ("written", "duration_s")}
    return out


def test_a_run_across_two_nodes_equals_the_same_run_on_one_node(three_nodes, tmp_path):  # noqa: F811
    overrides = {**TWO_PROCESS, **LEARNS}
    rule = {"method": ["top_entropy"]}  # a top-20% set over the global batch: statistics of both ranks
    across = write_sweep(
        tmp_path,
        "across",
        overrides=overrides,
        grid=rule,
        launcher=slurm_launcher(2, 1, additional={"nodelist": "node[1-2]"}),
    )
    one = write_sweep(tmp_path, "one", overrides=overrides, grid=rule, launcher=slurm_launcher(1, 2))
    _wandb(across)
    drivers = [_driver(across), _driver(one)]
    outs = [d.communicate(timeout=600)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outs
    (a,) = run_dirs(tmp_path, "across")
    (b,) = run_dirs(tmp_path, "one")

    sa, sb = read_status(a), read_status(b)
    assert sa["state"] == sb["state"] == "finished" and sa["world_size"] == sb["world_size"] == 2, (sa, sb)
    assert sa["host"] == "node1"  # rank 0 keeps the record, on the first node
    ((_, ranks),) = rank_files(a).items()
    assert {r: ranks[r]["host"] for r in ranks} == {0: "node1", 1: "node2"}, ranks
    for info in ranks.values():  # the rendezvous is the first node's bridge address, from both nodes
        assert info["master"].split(":")[0] == "node1" and info["master_ip"] == "10.77.0.1", info
    ((_, ranks_b),) = rank_files(b).items()
    assert ranks_b[0]["host"] == ranks_b[1]["host"]  # the reference: both ranks on one node

    rows_a, rows_b = (
        [_computed(json.loads(x)) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)
    )
    assert [r["step"] for r in rows_a] == [1, 2, 3]
    assert any(r["grad_norm"] > 0 for r in rows_a) and any(r["reward"] > 0 for r in rows_a), rows_a  # it learned
    assert all(0 < r["tokens/selected_frac"] < 1 for r in rows_a), rows_a  # the rule chose a subset
    assert rows_a == rows_b  # bit for bit: the same floats, gathered over two nodes or over one
    assert _eval_files(a) == _eval_files(b) and _eval_files(a), (_eval_files(a), _eval_files(b))
    runs = list((a / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(a.name), runs  # one W&B run, rank 0's


@pytest.fixture
def nodes_back():
    """Whatever a test kills, every node is back afterwards (other tests need the three)."""
    yield
    revive_nodes()


def test_the_node_of_rank_1_dies_the_run_fails_naming_it_and_resumes(three_nodes, tmp_path, nodes_back):  # noqa: F811
    """Seed 0's run (2 nodes) loses rank 1's node after checkpoint-2; seed 1's run follows it in the
    array (parallelism 1) on the nodes left."""
    overrides = {**TWO_PROCESS, "trainer.max_steps": 5}
    path = write_sweep(
        tmp_path,
        "nodefail",
        overrides=overrides,
        seeds=[0, 1],
        launcher=slurm_launcher(2, 1, array_parallelism=1, additional={"exclusive": True}),
    )
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "multiproc_fixtures.py"), "run", str(path)],
        cwd=ROOT,
        env=sweep_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def past_checkpoint():
        for d in run_dirs(tmp_path, "nodefail"):
            s = read_status(d) or {}
            if s.get("state") == "running" and (d / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file():
                return d, s
        return None

    try:
        run_dir, status = wait_until(past_checkpoint, 400, "a run past its second checkpoint", every=0.2)
        (ranks,) = rank_files(run_dir).values()
        node = ranks[1]["host"]
        assert node != ranks[0]["host"], ranks
        killed_at = kill_node(node)
        s = wait_until(
            lambda: (read_status(run_dir) or {}).get("state") == "failed" and read_status(run_dir), 120, "failed"
        )
        recorded = time.time()
        out, _ = driver.communicate(timeout=600)
    finally:
        driver.kill()
    assert driver.returncode == 1, out
    error = s["error"]
    steps = metric_steps(run_dir)
    assert "\n" not in error and error.startswith(f"rank 1 on {node} (pid {ranks[1]['pid']}) died"), error
    assert f"at step {steps[-1] + 1} " in error and "its node or its process was lost" in error, (error, steps)
    assert recorded - killed_at < 30, recorded - killed_at
    for n in ("node1", "node2", "node3"):  # nothing of the run is left on any node
        assert node_processes(n, str(run_dir.parent)) == [], (n, node_processes(n))
    others = [d for d in run_dirs(tmp_path, "nodefail") if d != run_dir]
    assert [read_status(d)["state"] for d in others] == ["finished"]
    assert node_states()[node].strip("*") == "down"  # Slurm saw the node die too

    revive_nodes()
    retry = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "multiproc_fixtures.py"), "run", str(path), "--retry-failed"],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 2, s
    assert metric_steps(run_dir) == [1, 2, 3, 4, 5]  # every step exactly once
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time"] < killed_at < rows[-1]["time"]  # resumed, not restarted
