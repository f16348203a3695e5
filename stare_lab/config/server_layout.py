"""Where a server-mode run's vLLM server and its trainers sit in the run's job (docs/vllm.md, "Server mode
on Slurm"): a pure function of the run's `trainer` keys and the launcher's nodes, tasks and GPUs, read
when a sweep is expanded (stare_lab.plan.expand: `run.processes`, hashed into the run id), by a sweep's
dry run (stare_lab.sweep.server_task.describe_run) and by the job's tasks (stare_lab.sweep.worker).

A run with `trainer.vllm_mode: server` whose job has several tasks (Slurm: nodes × tasks per node;
local: `processes` > 1) keeps k task slots for the server: `trainer.vllm_server_gpus` (default 1) GPUs
of its last node, or the whole last node with `trainer.vllm_server_node`. One task per GPU, so the k
slots are the job's last k tasks, and training is the first `nodes × tasks_per_node − k`:

- on the server's node, the trainers use GPUs 0 … n−k−1 (LOCAL_RANK = their GPU, as without a server)
  and the server `CUDA_VISIBLE_DEVICES` = the node's last k GPUs: TRL's layout, server and trainers on
  disjoint GPUs (its NCCL weight sync cannot share a device);
- RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT stay submitit's, only WORLD_SIZE shrinks: torch's
  rendezvous is the same as without a server, and training rank 0 is the job's task 0, the run's
  record keeper (stare_lab.launchers.ranks). That is why the server sits on the *last* node rather than the
  first: with the first node's last GPUs, training ranks would have to be renumbered across nodes;
- the server listens on loopback when the run has one node, else on the last node's address on the
  cluster network (`socket.gethostbyname` of its host name), which every node's trainers reach; a
  `vllm_server_host` other than 127.0.0.1 is used as given.

`run.processes` (the training world size) is `training_processes` of this layout, computed once at
expansion; a job learns its server slots as the tasks beyond `run.processes`. On CPU (`gpus_per_node: 0`)
a slot is a task and nothing sets devices. A run of one task has no slot: its own process starts the
server (stare_lab.serving.vllm_server.for_run). The job's tasks find the server through SERVER_FILE and SERVER_ENV.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

# A job's server task (stare_lab.sweep.server_task) and its training tasks (stare_lab.serving.vllm_server.wait_address)
# meet through two names:
SERVER_FILE = "server.json"  # in the attempt's rank folder: {"url", "pid", "log", "node"}, the host writes it
SERVER_ENV = "STARE_LAB_VLLM_SERVER"  # a training task's {"dir": rank folder, "host": host rank} (JSON)
# The host's start-up (interpreter, imports) before its own health timeout begins; trainers wait this much more.
START_MARGIN_S = 120.0


def is_server_run(cfg: DictConfig) -> bool:
    """The run generates with a vLLM server (`trainer.use_vllm` and `trainer.vllm_mode: server`)."""
    t = cfg.trainer
    return bool(t.use_vllm) and t.vllm_mode == "server"


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


def server_layout(trainer: Mapping[str, Any], nodes: int, tasks: int, gpus_per_node: int) -> ServerLayout | None:
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
