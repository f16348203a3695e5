"""The local launcher: runs on this machine through submitit's LocalExecutor (docs/sweeps.md).

A run of one process goes to a queue worker: `workers` processes share the queued runs, each
paying the interpreter and its imports once (stare_lab.sweep.jobs.QueueStarter). A run of
`processes` > 1 is one job of that many tasks (gloo on CPU, NCCL on GPUs), at most `workers` at
once. An interrupted run (Ctrl-C, a killed driver) resumes from its last checkpoint at the next
`sweep run`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stare_lab.config_schema import bounded
from stare_lab.sweep.launchers.base import Launcher, register_launcher

# Ctrl-C: how long the driver waits for its stopped workers to record `interrupted`.
STOP_WAIT_S = 30.0


@register_launcher("local")
@dataclass(frozen=True)
class LocalLauncher(Launcher):
    workers: int = bounded(ge=1)  # runs at once (they split the cores between them)
    processes: int = bounded(ge=1)  # processes of one run (gloo on CPU)
    timeout_min: float = bounded(ge=1)  # wall-clock limit of one run

    @property
    def processes_per_run(self) -> int:
        return int(self.processes or 1)

    def worker_threads(self) -> int | None:
        """N workers share this machine's cores (torch's default of one thread per core each would
        oversubscribe them)."""
        processes = max(1, int(self.workers)) * self.processes_per_run
        return max(1, (os.cpu_count() or 1) // processes)

    def layout(self, runs: int) -> str:
        procs = self.processes_per_run
        return (
            f"processes per run: {procs} ({procs} on this machine); "
            f"{min(runs, int(self.workers)) * procs} processes at once ({self.workers} workers)"
        )

    def executor(self, folder: Path, job_name: str):
        import submitit

        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=self.timeout_min, tasks_per_node=self.processes_per_run)
        return ex

    def starter(self, executor, workers):
        from stare_lab.sweep.jobs import QueueStarter, RunStarter

        if self.processes_per_run == 1:
            return QueueStarter(executor, workers.queue, int(self.workers), float(self.timeout_min))
        return RunStarter(executor, workers.run, int(self.workers))

    def stop(self, jobs: list, echo: Callable[[str], None]) -> None:
        from stare_lab.sweep.jobs import stop_local

        stop_local(jobs, echo, STOP_WAIT_S)
