"""Server mode on the local Slurm cluster (scripts/slurm_cluster.sh), as far as the CPU allows.

A server-mode run's job has 2 tasks on the cluster's one node: task 1 (the server slot) starts the real
`trl vllm-serve` server, task 0 (the run's one training process) gets its address from the run folder and
talks to it with TRL's own VLLMClient (health, generate). The real trainer cannot train against the server
on CPU (TRL's weight sync is NCCL on CUDA): the training task runs tests/vllm_tests/server_fixtures.py's
`client_execute`, which uses the runner's own server set-up (`vllm_server.for_run`) and its /health watch
between stand-in steps. Faults: a server SIGKILLed mid-run fails the run with one line and resumes from its
last checkpoint on `--retry-failed`; a server that does not answer within `vllm_server_timeout` fails the
run with one line naming the timeout and the server's log.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from server_fixtures import CLIENT_FILE, client_execute
from sweep_fixtures import (  # noqa: F401
    metric_steps,
    read_json,
    run_dirs,
    slurm_cluster,
    use_runner,
    wait_until,
    write_sweep,
)

from stare_lab.cli.sweep import main
from stare_lab.record import read_status

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
SLURM2 = {
    "name": "slurm",
    "cpus_per_task": 1,
    "mem_gb": 2,
    "timeout_min": 15,
    "array_parallelism": 1,
    "gpus_per_node": 0,
    "tasks_per_node": 2,  # task 0 trains, task 1 is the server's slot
    "signal_delay_s": 10,
}
SERVER = {
    "trainer.use_vllm": True,
    "trainer.vllm_mode": "server",
    "trainer.vllm_gpu_memory_utilization": 0.1,
}


@pytest.fixture
def jobs_import_fixtures(monkeypatch, in_process_env):
    """The jobs unpickle `client_execute` by reference: tests/vllm_tests on their PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ["PYTHONPATH"]]))


def _sweep(tmp_path, name, steps=2, **trainer):
    overrides = {**SERVER, "trainer.max_steps": steps, "trainer.save_steps": 1, **trainer}
    return write_sweep(tmp_path, name, overrides=overrides, launcher=SLURM2)


def _client_lines(run_dir: Path) -> list[dict]:
    path = run_dir / CLIENT_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _server_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / ".ranks").glob("*/server.json"), key=lambda p: p.stat().st_mtime)


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_dry_run_prints_each_runs_layout_and_refuses_a_server_without_trainers(tmp_path, capsys):
    launcher = {"name": "slurm", "nodes": 2, "gpus_per_node": 4}
    path = write_sweep(
        tmp_path, "layout", overrides=SERVER, grid={"trainer.vllm_server_gpus": [1, 2]}, launcher=launcher
    )
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "layout of run(s) 0: 2 node(s) × 4: 7 training process(es); vLLM server on the last node's GPU 3" in out
    assert "layout of run(s) 1: 2 node(s) × 4: 6 training process(es); vLLM server on the last node's GPUs 2-3" in out
    assert out.count("address: the last node's cluster address") == 2, out
    whole = write_sweep(tmp_path, "whole", overrides={**SERVER, "trainer.vllm_server_node": True}, launcher=launcher)
    assert main(["sweep", "run", str(whole), "--dry-run"]) == 0
    assert "2 node(s) × 4: 4 training process(es); vLLM server on the last node's GPUs 0-3" in capsys.readouterr().out
    four = {**SERVER, "trainer.vllm_server_gpus": 4}
    one = write_sweep(tmp_path, "one", overrides=four, launcher={**launcher, "nodes": 1})
    assert main(["sweep", "run", str(one), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "base.overrides.trainer.vllm_server_gpus: 4 of the run's 4 task(s)" in err[0], err
    assert "leaves no training process" in err[0]
    shared = write_sweep(tmp_path, "shared", overrides=SERVER, launcher={**launcher, "nodes": 1, "gpus_per_node": 1})
    assert main(["sweep", "run", str(shared), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "base.overrides.trainer.vllm_mode: server on GPUs needs a GPU for the server" in err[0]


@pytest.mark.slow  # ~95 s here: a vLLM start-up (~50 s on the shared 2 cores) and the job around it
def test_the_server_task_serves_the_training_task_and_stops_with_the_run(
    slurm_cluster,
    tmp_path,
    jobs_import_fixtures,
    monkeypatch,
):
    path = _sweep(tmp_path, "served")
    use_runner(functools.partial(client_execute, step_s=0.2), monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 0
    (run_dir,) = run_dirs(tmp_path, "served")
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 1 and s["world_size"] == 1, s
    (seen,) = _client_lines(run_dir)
    assert seen["world_size"] == 1 and seen["rank"] == 0  # the server's task is not a training process
    assert seen["url"].startswith("http://127.0.0.1:")  # one node: loopback
    ids = seen["completion_ids"]
    assert len(ids) == 2 and all(1 <= len(c) <= 4 for c in ids), ids  # TRL's client got a generate answer
    (server_file,) = _server_files(run_dir)
    server = read_json(server_file)
    assert server["url"] == seen["url"] and Path(server["log"]) == run_dir / "vllm_server.log"
    assert metric_steps(run_dir) == [1, 2]
    assert not _answers(server["url"])  # stopped with the run
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["vllm_server_port"] is None and config["run"]["processes"] == 1  # the address is not
    # written into the run's config (its identity): each attempt's server has its own port


def test_a_server_that_does_not_answer_in_time_fails_the_run_with_one_line(
    slurm_cluster,
    tmp_path,
    jobs_import_fixtures,
    monkeypatch,
):
    """vLLM's start-up takes ~30 s here: a 2 s timeout is a server that does not answer."""
    path = _sweep(tmp_path, "late", **{"trainer.vllm_server_timeout": 2})
    use_runner(functools.partial(client_execute, step_s=0.2), monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1
    (run_dir,) = run_dirs(tmp_path, "late")
    s = read_status(run_dir)
    assert s["state"] == "failed", s
    error = s["error"]
    assert "\n" not in error and "did not answer within 2 s" in error, error
    assert f"(log: {run_dir / 'vllm_server.log'})" in error, error
    assert (run_dir / "vllm_server.log").is_file()
    assert _client_lines(run_dir) == [] and not (run_dir / "metrics.jsonl").exists()  # nothing trained


@pytest.mark.slow
def test_a_server_killed_mid_run_fails_the_run_and_it_resumes(
    slurm_cluster,
    tmp_path,
    jobs_import_fixtures,
    monkeypatch,
    capsys,
):
    path = _sweep(tmp_path, "killed", steps=8)
    use_runner(functools.partial(client_execute, step_s=1.5), monkeypatch.setattr)
    killed = {}

    def kill_the_server():
        def ready():
            dirs = run_dirs(tmp_path, "killed")
            if not dirs or not (dirs[0] / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file():
                return None
            files = _server_files(dirs[0])
            return (dirs[0], read_json(files[-1])) if files else None

        run_dir, server = wait_until(ready, 400, "the run past its second checkpoint", every=0.2)
        killed.update(time=time.time(), url=server["url"], run_dir=run_dir)
        os.kill(int(server["pid"]), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server, daemon=True)
    killer.start()
    assert main(["sweep", "run", str(path)]) == 1
    killer.join(5)
    run_dir = killed["run_dir"]
    s = read_status(run_dir)
    assert s["state"] == "failed", s
    error = s["error"]
    # the server's task saw its process exit, or the training task's watch saw it stop answering first
    assert "\n" not in error and f"vLLM server at {killed['url']}" in error, error
    assert "exited with code -9" in error or "stopped answering" in error, error
    assert f"(log: {run_dir / 'vllm_server.log'})" in error, error
    steps_before = metric_steps(run_dir)
    assert 2 <= len(steps_before) < 8, steps_before
    assert not _answers(killed["url"])
    capsys.readouterr()
    assert main(["sweep", "run", str(path), "--retry-failed"]) == 0
    s = read_status(run_dir)
    assert s["state"] == "finished" and s["attempts"] == 2, s
    assert metric_steps(run_dir) == list(range(1, 9))  # every step exactly once
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time"] < killed["time"] < rows[-1]["time"]  # resumed, not restarted
    first, second = _client_lines(run_dir)
    assert second["url"] != first["url"] or second["time"] > killed["time"]  # a new server answered
    assert len(second["completion_ids"]) == 2
