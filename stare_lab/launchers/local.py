"""The local launcher: runs on this machine through submitit's LocalExecutor (docs/sweeps.md).

A run of one process goes to a queue worker: `workers` processes share the queued runs, each
paying the interpreter and its imports once (stare_lab.launchers.jobs.QueueStarter). A run of
`processes` > 1 is one job of that many tasks (gloo on CPU, NCCL on GPUs), at most `workers` at
once. An interrupted run (Ctrl-C, a killed driver) resumes from its last checkpoint at the next
`sweep run`.

Threads: each worker process decides its own torch threads when it starts (stare_lab.launchers.threads:
`threads_per_worker`, else the user's OMP_NUM_THREADS, else the process's usable cores shared by
the `workers` × `processes` processes running at once and left free by other jobs), and starts
with OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT=30000 in its environment unless the user's sets
either (`executor`): idle OpenMP threads spin 0.3 ms at most, not ~3 ms, on cores other jobs share.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stare_lab.config.schema import bounded
from stare_lab.launchers.base import Launcher, register_launcher
from stare_lab.launchers.jobs import QueueStarter, RunStarter, stop_local
from stare_lab.launchers.threads import WorkerThreads, spawn_env

# Ctrl-C: how long the driver waits for its stopped workers (SIGTERM) to record `interrupted` and end,
# before it kills those left (stare_lab.launchers.jobs.stop_local). A stand-in worker ends in under a
# second, also beside busy loops; a real one runs its clean-up first (W&B's finish: seconds).
STOP_WAIT_S = 10.0


@register_launcher("local")
@dataclass(frozen=True)
class LocalLauncher(Launcher):
    workers: int = bounded(ge=1)  # runs at once (they split the cores between them)
    processes: int = bounded(ge=1)  # processes of one run (gloo on CPU)
    timeout_min: float = bounded(ge=1)  # wall-clock limit of one run
    threads_per_worker: int | None = bounded(ge=1)  # torch threads of each process; null: decided

    @property
    def processes_per_run(self) -> int:
        return int(self.processes or 1)

    def worker_threads(self) -> WorkerThreads:
        """`workers` × `processes` processes share the cores this machine lets the sweep use (torch's
        default of one thread per core each would oversubscribe them)."""
        return WorkerThreads(
            per_worker=self.threads_per_worker, sharing=max(1, int(self.workers)) * self.processes_per_run
        )

    def layout(self, runs: int) -> str:
        procs = self.processes_per_run
        return (
            f"processes per run: {procs} ({procs} on this machine); "
            f"{min(runs, int(self.workers)) * procs} processes at once ({self.workers} workers)"
        )

    def executor(self, folder: Path, job_name: str):
        import submitit  # deferred: reading a sweep file (its launcher block) needs no submitit

        # each task starts as `env OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=30000 python ...`: set before OpenMP loads
        env = [f"{k}={v}" for k, v in spawn_env().items()]
        python = shlex.join(["env", *env, sys.executable]) if env else None
        ex = submitit.LocalExecutor(folder=folder, python=python)
        ex.update_parameters(timeout_min=self.timeout_min, tasks_per_node=self.processes_per_run)
        return ex

    def starter(self, executor, workers):
        if self.processes_per_run == 1:
            return QueueStarter(executor, workers.queue, int(self.workers), float(self.timeout_min))
        return RunStarter(executor, workers.run, int(self.workers))

    def stop(self, jobs: list, echo: Callable[[str], None]) -> None:
        stop_local(jobs, echo, STOP_WAIT_S)
