"""The Slurm launcher: one job array per sweep through submitit's SlurmExecutor (docs/sweeps.md).

A run is one job of `nodes` × one task per GPU (or `tasks_per_node`); at most `array_parallelism`
run at once. On pre-emption or time-out Slurm requeues the job (`--requeue`, at most
`max_requeue` times) and the worker, a submitit `Checkpointable`, records the run interrupted; the
requeued job resumes it from its last checkpoint and the same W&B run. Ctrl-C leaves the jobs
running: `sweep run` again watches them. Job states come from one batched `sacct` query per look
(stare_lab.launchers.liveness.slurm_states, submitit's own query), never from submitit's per-job polling.
Threads: a task's worker takes `threads_per_worker`, else OMP_NUM_THREADS, else its usable cores
(its affinity, at most SLURM_CPUS_PER_TASK: `cpus_per_task`); the job script exports
OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT=30000 after the `setup` lines, before the tasks start,
unless the job's environment or those lines set either (stare_lab.launchers.threads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stare_lab.config.schema import bounded
from stare_lab.launchers.base import Fail, Launcher, register_launcher
from stare_lab.launchers.errors import SweepError
from stare_lab.launchers.jobs import JobWatch, RunStarter, Tracked
from stare_lab.launchers.liveness import Liveness
from stare_lab.launchers.threads import PASSIVE, SHORT_SPIN, SPIN_COUNT, WAIT_POLICY
from stare_lab.record import first_line, read_status, update_status

# A job that left Slurm's records without its worker recording an end is waited for this long
# (a requeue passes through states sacct may not show yet) before the run is called ended.
REQUEUE_GRACE_S = 30.0
# An unanswered sacct (a busy controller) counts as "still queued", up to this many looks in a row.
MAX_UNANSWERED = 30
# A job still live this long after its worker recorded the run's end is cancelled (see SlurmWatch).
LINGER_S = 20.0
# The job script's line after `setup`: idle OpenMP threads spin 0.3 ms at most unless the job's environment says.
WAIT_POLICY_SETUP = (
    f'if [ -z "${{{WAIT_POLICY}}}${{{SPIN_COUNT}}}" ]; '
    f"then export {WAIT_POLICY}={PASSIVE} {SPIN_COUNT}={SHORT_SPIN}; fi",
)


@register_launcher("slurm")
@dataclass(frozen=True)
class SlurmLauncher(Launcher):
    parallel_key = "array_parallelism"
    study_file = "optuna.journal"  # a JournalStorage file: safe on a shared filesystem

    partition: str | None = bounded()
    account: str | None = bounded()
    nodes: int = bounded(ge=1)
    gpus_per_node: int = bounded(ge=0)
    tasks_per_node: int | None = bounded(ge=1)  # null: one per GPU (1 without GPUs)
    cpus_per_task: int = bounded(ge=1)
    threads_per_worker: int | None = bounded(ge=1)  # torch threads of each task; null: decided
    mem_gb: float = bounded(ge=1)
    timeout_min: float = bounded(ge=1)
    array_parallelism: int = bounded(ge=1)
    max_requeue: int = bounded(ge=0)
    signal_delay_s: int = bounded(ge=0)
    qos: str | None = bounded()
    constraint: str | None = bounded()
    setup: list[str] = bounded()  # shell lines run before each job
    additional: dict[str, Any] = bounded()  # extra sbatch options

    def check(self, fail: Fail) -> None:
        if self.tasks_per_node and self.gpus_per_node and self.tasks_per_node != self.gpus_per_node:
            fail(
                "launcher.tasks_per_node",
                f"{self.tasks_per_node} tasks on {self.gpus_per_node} GPUs per node: "
                "a run has one process per GPU (leave tasks_per_node null, or gpus_per_node 0 for CPU runs)",
            )

    @property
    def run_tasks_per_node(self) -> int:
        """Processes of one run on each of its nodes: one per GPU, or `tasks_per_node`."""
        return int(self.tasks_per_node or self.gpus_per_node or 1)

    @property
    def processes_per_run(self) -> int:
        return int(self.nodes or 1) * self.run_tasks_per_node

    @property
    def nodes_per_run(self) -> int:
        return int(self.nodes or 1)

    @property
    def gpus_per_run(self) -> int:
        return int(self.nodes or 1) * int(self.gpus_per_node or 0)

    def layout(self, runs: int) -> str:
        gpus, at_once = self.gpus_per_run, min(runs, int(self.array_parallelism))
        return (
            f"processes per run: {self.processes_per_run} ({self.nodes} node(s) × {self.run_tasks_per_node}); "
            f"GPUs: {gpus} per run, {gpus * runs} for the sweep ({gpus * at_once} at once, {at_once} runs in parallel)"
        )

    def executor(self, folder: Path, job_name: str):
        import submitit  # deferred: reading a sweep file (its launcher block) needs no submitit

        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=self.max_requeue)
        params: dict[str, Any] = dict(
            job_name=job_name,
            partition=self.partition,
            account=self.account,
            qos=self.qos,
            constraint=self.constraint,
            cpus_per_task=self.cpus_per_task,
            mem=f"{self.mem_gb}GB",
            time=int(self.timeout_min),
            array_parallelism=self.array_parallelism,
            nodes=self.nodes,
            ntasks_per_node=self.run_tasks_per_node,
            signal_delay_s=self.signal_delay_s,
            setup=[*self.setup, *WAIT_POLICY_SETUP],  # after the user's lines: a policy they export stays
            additional_parameters={"requeue": True, **self.additional},
        )
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        if self.processes_per_run > 1:  # a rank that fails ends the others at once (not after ddp_timeout)
            params["srun_args"] = ["--kill-on-bad-exit=1"]
        ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
        return ex

    def starter(self, executor, workers) -> ArrayStarter:
        return ArrayStarter(executor, workers.run)

    def watch(self) -> SlurmWatch:
        return SlurmWatch()

    def stop(self, jobs: list, echo: Callable[[str], None]) -> None:
        echo("interrupted: the Slurm jobs keep running; `sweep run` again watches them, `sweep status` shows them")


class ArrayStarter(RunStarter):
    """The queued runs go to Slurm as one job array (its parallelism is the array's cap); a
    watched run that lost its worker later is submitted alone."""

    def __init__(self, executor, worker):
        super().__init__(executor, worker, limit=10**9)

    def begin(self, queue: list) -> list[Tracked]:
        from submitit.core.utils import FailedJobError  # deferred: submitit, as in `executor`

        if not queue:
            return []
        try:
            with self.executor.batch():
                jobs = [self.executor.submit(self.worker, str(run.run_dir)) for run in queue]
        except (FailedJobError, OSError) as e:
            raise SweepError(
                f"launcher: Slurm refused the job array: {first_line(str(e).split('stderr:')[-1])}"
            ) from None
        for run, job in zip(queue, jobs, strict=True):
            status = read_status(run.run_dir) or {}
            if status.get("state") == "pending":  # the worker may already have started and written its own
                update_status(run.run_dir, slurm_job_id=str(job.job_id))
        tracked = [Tracked(run, job) for run, job in zip(queue, jobs, strict=True)]
        queue.clear()
        return tracked


class SlurmWatch(JobWatch):
    """A Slurm job has ended when the batched query no longer lists it live. A requeued
    (pre-empted, timed-out, `scontrol requeue`d) job can look done to submitit (it may even hold
    the first attempt's result) while Slurm requeues it: Slurm's answer decides; and a run whose
    worker did not record an end must stay out of Slurm's live states for a grace period before the
    sweep stops waiting for it. Submitit itself is asked only to read an ended job's result
    (`reconcile`): for a job that ended without one, that is one more `sacct` for that job.

    A job still live LINGER_S after its worker recorded the run finished or failed is cancelled: a
    task on a node that died keeps srun waiting until Slurm declares the node down (SlurmdTimeout),
    and Slurm then requeues the job (node failure), whose worker would start the failed run again
    on its own; a failed run resumes only on `sweep run --retry-failed`."""

    def __init__(self) -> None:
        super().__init__()
        self.gone_since: dict[str, float] = {}
        self.ended_since: dict[str, float] = {}
        self.cancelled: set[str] = set()
        self.unanswered = 0

    def job_ids(self, waiting: list[Tracked]) -> list[str]:
        return [str(t.job.job_id) for t in waiting if t.job is not None]

    def answered(self, live: Liveness) -> None:
        self.unanswered = self.unanswered + 1 if live.slurm is None else 0

    def job_ended(self, t: Tracked, live: Liveness, fresh: bool) -> bool:
        if not fresh:  # Slurm is asked once per look, for every job at once
            return False
        job_id = str(t.job.job_id)
        queued = self.unanswered <= MAX_UNANSWERED if live.slurm is None else live.slurm_job_live(job_id)
        recorded = (read_status(t.run.run_dir) or {}).get("state") in ("finished", "failed")
        if queued:
            self.gone_since.pop(job_id, None)
            if recorded and live.slurm is not None:
                self._linger(t, job_id)
            return False
        if not (live.slurm or {}).get(job_id) and not t.job.paths.result_pickle.exists():
            return False  # unlisted and no result: submitit's result() would wait for it for ever
        if recorded:
            return True
        gone = self.gone_since.setdefault(job_id, time.time())
        return time.time() - gone > REQUEUE_GRACE_S

    def _linger(self, t: Tracked, job_id: str) -> None:
        """The run is recorded ended and its job is still live: cancel it after LINGER_S."""
        since = self.ended_since.setdefault(job_id, time.time())
        if job_id not in self.cancelled and time.time() - since > LINGER_S:
            self.cancelled.add(job_id)
            t.job.cancel(check=False)
