"""A server-mode run's vLLM server as a task of the run's own job (docs/vllm.md, "Server mode on Slurm").

**Layout.** A run with `trainer.vllm_mode: server` whose job has several tasks (Slurm: nodes × tasks per
node; local: `processes` > 1) keeps k task slots for the server: `trainer.vllm_server_gpus` (default 1)
GPUs of its last node, or the whole last node with `trainer.vllm_server_node`. One task per GPU, so the
k slots are the job's last k tasks, and training is the first `nodes × tasks_per_node − k`:

- on the server's node, the trainers use GPUs 0 … n−k−1 (LOCAL_RANK = their GPU, as without a server)
  and the server `CUDA_VISIBLE_DEVICES` = the node's last k GPUs: TRL's layout, server and trainers on
  disjoint GPUs (its NCCL weight sync cannot share a device);
- RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT stay submitit's, only WORLD_SIZE shrinks: torch's
  rendezvous is the same as without a server, and training rank 0 is the job's task 0, the run's
  record keeper (stare_lab.sweep.ranks). That is why the server sits on the *last* node rather than the
  first: with the first node's last GPUs, training ranks would have to be renumbered across nodes;
- the server listens on loopback when the run has one node, else on the last node's address on the
  cluster network (`socket.gethostbyname` of its host name), which every node's trainers reach; a
  `vllm_server_host` other than 127.0.0.1 is used as given.

`run.processes` (the training world size, hashed into the run id) is `training_processes` of this
layout, computed once at expansion (stare_lab.sweep.expand); a job learns its server slots as the tasks
beyond `run.processes`. On CPU (`gpus_per_node: 0`) a slot is a task and nothing sets devices. A run of
one task has no slot: its own process starts the server (`for_run` below).

**One attempt of a job**, in order (each task runs `RunWorker`, stare_lab.sweep.worker):

1. task 0 takes the run's claim and opens the rank gate (stare_lab.sweep.ranks);
2. the first server slot (the *host*) waits for the go, starts TRL's server (stare_lab.vllm_server.serving:
   health within `vllm_server_timeout`, else it fails with one line naming the timeout and the log), and
   writes `server.json` (url, pid, log) into the attempt's rank folder; the other slots end at once;
3. each training task waits for `server.json` (or the host's error line, or the timeout), exports the
   address (SERVER_ENV) and trains; the runner puts it into GRPOConfig and checks /health between steps;
4. the host watches both sides: the server's process exiting fails the run (the host's rank file gets the
   line, the task exits non-zero, Slurm's --kill-on-bad-exit stops the trainers, rank 0 records the
   host's line as the run's error); training's end (status.json no longer `running`) stops the server.

A failed run resumes from its last checkpoint on `sweep run --retry-failed` or `stare-lab train`, with a
new server: the server keeps no state (TRL pushes the policy's weights before each generation).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stare_lab.record import first_line, read_json, read_status
from stare_lab.utils import atomic_write_text

SERVER_FILE = "server.json"  # in the attempt's rank folder: {"url", "pid", "log", "node"}
SERVER_ENV = "STARE_LAB_VLLM_SERVER"  # a training task's {"dir": rank folder, "host": host rank} (JSON)
# The host's start-up (interpreter, imports) before its own health timeout begins; trainers wait this much more.
START_MARGIN_S = 120.0
WATCH_EVERY_S = 2.0


@dataclass(frozen=True)
class ServerLayout:
    """Where a server-mode run's server and trainers sit in its job (see the module docstring)."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    server_slots: int  # the job's last k tasks (GPUs; task slots on CPU)

    @property
    def training_processes(self) -> int:
        return self.nodes * self.tasks_per_node - self.server_slots

    @property
    def address_kind(self) -> str:
        return "loopback" if self.nodes == 1 else "the last node's cluster address"

    def describe(self) -> str:
        """The dry run's per-run layout."""
        first, n = self.tasks_per_node - self.server_slots, self.tasks_per_node
        if self.gpus_per_node:
            where = f"GPU {first}" if self.server_slots == 1 else f"GPUs {first}-{n - 1}"
        else:
            where = f"task slot {first}" if self.server_slots == 1 else f"task slots {first}-{n - 1}"
            where += " (no GPU)"
        return (
            f"{self.nodes} node(s) × {n}: {self.training_processes} training process(es); "
            f"vLLM server on the last node's {where}; address: {self.address_kind}"
        )


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


def server_layout(trainer: dict[str, Any], nodes: int, tasks: int, gpus_per_node: int) -> ServerLayout | None:
    """The layout of a run of `tasks` tasks on `nodes` nodes; None when the run has no server task
    (not server mode, or one task: its process starts the server). ValueError naming the key when
    the server leaves no training process or does not fit on one node."""
    if not (trainer.get("use_vllm") and trainer.get("vllm_mode") == "server"):
        return None
    if tasks <= 1:
        if gpus_per_node and trainer.get("vllm_server_port") is None:  # TRL's NCCL sync can not share one GPU
            raise ValueError(
                "trainer.vllm_mode: server on GPUs needs a GPU for the server besides the trainers' and this run "
                f"has {tasks} task on {gpus_per_node} GPU(s): give it 2 or more (launcher gpus_per_node)"
            )
        return None
    per_node = tasks // max(1, nodes)
    if trainer.get("vllm_server_node"):
        if nodes < 2:
            raise ValueError(
                "trainer.vllm_server_node: true needs a run of 2 or more nodes (launcher nodes); "
                f"this run has {nodes}: set vllm_server_gpus instead"
            )
        k = per_node
    else:
        k = int(trainer.get("vllm_server_gpus") or 1)
        if k >= tasks:
            raise ValueError(
                f"trainer.vllm_server_gpus: {k} of the run's {tasks} task(s) for the server leaves no training process"
            )
        if k > per_node:
            raise ValueError(
                f"trainer.vllm_server_gpus: {k} is more than one node's {per_node} (the server runs on one node; "
                "use vllm_server_node: true for a whole node)"
            )
    return ServerLayout(nodes, per_node, gpus_per_node, k)


# ----------------------------------------------------------------------------------- in the job
def is_server_run(cfg) -> bool:
    t = cfg.trainer
    return bool(t.use_vllm) and t.vllm_mode == "server"


def serve_slot(run_dir: Path, cfg, gate, local_rank: int, tasks_per_node: int, nodes: int) -> dict[str, Any]:
    """A server slot's task: the host (the first slot, gate rank == run.processes) runs the server
    until training ends; the other slots end at once. Raises ServerError when the server fails."""
    from stare_lab import vllm_server

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


def _watch(run_dir: Path, server, attempt) -> None:
    """Until the run's attempt is no longer running; ServerError when the server exits first."""
    from stare_lab.vllm_server import ServerError

    while True:
        code = server.process.poll()
        if code is not None:
            raise ServerError(f"vLLM server at {server.url} exited with code {code} mid-run (log: {server.log})")
        status = read_status(run_dir) or {}
        if status.get("state") != "running" or status.get("attempts") != attempt:
            return
        time.sleep(WATCH_EVERY_S)


def _listen_host(cfg, nodes: int) -> str:
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
    """What a training task exports so that its runner waits for this attempt's server."""
    return {SERVER_ENV: json.dumps({"dir": str(gate_dir), "host": host_rank})}


def wait_address(timeout: float, log: Path) -> tuple[str, str, str | None] | None:
    """(url, log, node) of the server this job's host started, waiting for it at most `timeout` +
    START_MARGIN_S; None outside such a job. ServerError with the host's own line when it failed, or
    naming the timeout."""
    from stare_lab.vllm_server import ServerError

    given = os.environ.get(SERVER_ENV)
    if not given:
        return None
    where = json.loads(given)
    folder = Path(where["dir"])
    deadline = time.monotonic() + float(timeout) + START_MARGIN_S
    while True:
        found = read_json(folder / SERVER_FILE)
        if found:
            return str(found["url"]), str(found["log"]), found.get("node")
        error = (read_json(folder / f"rank-{where['host']}.json") or {}).get("error")
        if error:
            raise ServerError(first_line(error))
        if time.monotonic() >= deadline:
            raise ServerError(
                f"vLLM server task (rank {where['host']}) gave no address within {timeout:g} s "
                f"+ {START_MARGIN_S:g} s start-up (log: {log})"
            )
        time.sleep(0.5)


@contextlib.contextmanager
def for_run(cfg, run_dir: Path | str) -> Iterator[list]:
    """The server of a server-mode run around its training (stare_lab.runner.execute), with its address
    in `cfg.trainer`; yields the TrainerCallbacks that watch it (nothing for other runs):

    - in a job with a server task (stare_lab.sweep.server_task): that task's server, once it answers;
    - with `vllm_server_port` set: a server someone else started there (TRL's client waits
      `vllm_server_timeout` for it, then the run fails);
    - else (one process, e.g. `stare-lab train` or the local launcher): one started here, stopped after."""
    t = cfg.trainer
    if not (t.use_vllm and t.vllm_mode == "server"):
        yield []
        return
    from stare_lab.vllm_server import SERVER_LOG, ServerWatch, serving

    log = Path(run_dir) / SERVER_LOG
    found = wait_address(float(t.vllm_server_timeout), log)
    if found is not None:
        url, log_path, node = found
        host, port = url.removeprefix("http://").rsplit(":", 1)
        t.vllm_server_host, t.vllm_server_port = host, int(port)
        yield [ServerWatch(url, Path(log_path), node=node if node != socket.gethostname() else None)]
    elif t.get("vllm_server_port") is not None:
        yield [ServerWatch(f"http://{t.vllm_server_host}:{t.vllm_server_port}", None)]
    else:
        with serving(cfg, run_dir) as server:
            yield [ServerWatch(server.url, server.log, server.process)]
