"""A server-mode run's vLLM server as a task of the run's own job (docs/vllm.md, "Server mode on Slurm").
Where the server's slots and the trainers sit in the job is stare_lab.config.server_layout; the server process
and a training task's wait for its address are stare_lab.serving.vllm_server. This module is the sweep's side:
the server slot's task and the dry run's description of a run's layout.

**One attempt of a job**, in order (each task runs `RunWorker`, stare_lab.sweep.worker):

1. task 0 takes the run's claim and opens the rank gate (stare_lab.launchers.ranks);
2. the first server slot (the *host*) waits for the go, starts TRL's server (stare_lab.serving.vllm_server.serving:
   health within `vllm_server_timeout`, else it fails with one line naming the timeout and the log), and
   writes `server.json` (url, pid, log) into the attempt's rank folder; the other slots end at once;
3. each training task waits for `server.json` (or the host's error line, or the timeout), exports the
   address (SERVER_ENV) and trains; the runner puts it into GRPOConfig and checks /health between steps
   (stare_lab.serving.vllm_server.for_run);
4. the host watches both sides: the server's process exiting fails the run (the host's rank file gets the
   line, the task exits non-zero, Slurm's --kill-on-bad-exit stops the trainers, rank 0 records the
   host's line as the run's error); training's end (status.json no longer `running`) stops the server.

A failed run resumes from its last checkpoint on `sweep run --retry-failed` or `stare-lab train`, with a
new server: the server keeps no state (TRL pushes the policy's weights before each generation).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from stare_lab.config.server_layout import SERVER_ENV, SERVER_FILE, server_layout
from stare_lab.core.utils import atomic_write_text
from stare_lab.launchers.ranks import RankGate
from stare_lab.record import read_status

if TYPE_CHECKING:
    from stare_lab.serving.vllm_server import Server

WATCH_EVERY_S = 2.0


def describe_run(trainer: dict[str, Any], nodes: int, tasks: int, gpus_per_node: int) -> str:
    """`sweep run --dry-run`'s layout of one run: nodes, training processes, the server's GPUs, its address."""
    layout = server_layout(trainer, nodes, tasks, gpus_per_node)
    if layout is not None:
        return layout.describe()
    if trainer.get("use_vllm") and trainer.get("vllm_mode") == "server":
        if trainer.get("vllm_server_port") is not None:
            where = f"{trainer.get('vllm_server_host')}:{trainer['vllm_server_port']}"
            return f"{tasks} training process(es); vLLM server: the one already at {where}"
        return "1 training process; vLLM server started by that process (no GPU), address: loopback"
    return f"{nodes} node(s): {tasks} training process(es)"


def serve_slot(
    run_dir: Path, cfg: DictConfig, gate: RankGate, local_rank: int, tasks_per_node: int, nodes: int
) -> dict[str, Any]:
    """A server slot's task: the host (the first slot, gate rank == run.processes) runs the server
    until training ends; the other slots end at once. Raises ServerError when the server fails."""
    from stare_lab.serving import vllm_server  # deferred: transformers (its watch callback), not for --dry-run

    if gate.rank != int(cfg.run.processes):  # no rank file: rank 0 must not count its exit as a death
        return {"rank": gate.rank, "role": "server slot (idle)"}
    gate.started()
    go, reason = gate.wait_open()
    if not go:
        return {"rank": gate.rank, "skipped": reason}
    status = read_status(run_dir) or {}
    attempt = status.get("attempts")
    try:
        with vllm_server.serving(
            cfg, run_dir, host=_listen_host(cfg, nodes), devices=_server_devices(local_rank, tasks_per_node)
        ) as server:
            found = {"url": server.url, "pid": server.process.pid, "log": str(server.log), "node": socket.gethostname()}
            atomic_write_text(gate.dir / SERVER_FILE, json.dumps(found))
            _watch(run_dir, server, attempt)
    except Exception as e:
        gate.failed(f"{type(e).__name__}: {e}")
        raise
    return {"rank": gate.rank, "role": "server", "url": server.url}


def _watch(run_dir: Path, server: Server, attempt: object) -> None:
    """Until the run's attempt is no longer running; ServerError when the server exits first."""
    while True:
        server.check_alive()
        status = read_status(run_dir) or {}
        if status.get("state") != "running" or status.get("attempts") != attempt:
            return
        time.sleep(WATCH_EVERY_S)


def _listen_host(cfg: DictConfig, nodes: int) -> str:
    host = str(cfg.trainer.vllm_server_host)
    if nodes > 1 and host == "127.0.0.1":  # trainers on other nodes: this node's address on the cluster network
        return socket.gethostbyname(socket.gethostname())
    return host


def _server_devices(local_rank: int, tasks_per_node: int) -> str | None:
    """CUDA_VISIBLE_DEVICES of the server: the node's GPUs of the slots from the host's to the node's last
    (Slurm gives every task of a `--gpus-per-node` job all the node's GPUs); None without GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() in ("", "NoDevFiles"):
        return None
    gpus = [g for g in visible.split(",") if g.strip()]
    return ",".join(gpus[local_rank:tasks_per_node]) or None


def training_env(gate_dir: Path, host_rank: int) -> dict[str, str]:
    """What a training task exports so that its runner waits for this attempt's server
    (stare_lab.serving.vllm_server.wait_address)."""
    return {SERVER_ENV: json.dumps({"dir": str(gate_dir), "host": host_rank})}
