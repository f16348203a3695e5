"""Launching a sweep's runs through submitit, safely re-runnable.

`plan_runs` decides per run: a finished run is skipped, an interrupted one (or one whose worker
died) resumes, a failed one is retried only with `retry_failed`, and one whose worker or Slurm
job is still alive is watched, never started twice. `launch_runs` writes each run's config.yaml
and status.json, submits `RunWorker` through the local executor (at most `workers` at once) or
Slurm (one job array, `array_parallelism` at once), waits with a progress display, and records as
failed any run whose job ended without the worker recording it (killed, out of memory, node
lost). The caller holds the sweep lock.
"""
from __future__ import annotations

import os

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import OmegaConf

from stare_lab.sweep.expand import RunSpec
from stare_lab.sweep.records import (
    CONFIG_FILE,
    first_line,
    holder_alive,
    new_status,
    read_status,
    update_status,
    write_status,
)
from stare_lab.sweep.schema import SweepError, SweepSpec
from stare_lab.sweep.worker import RunWorker
from stare_lab.utils import atomic_write_text

POLL_S = 1.0
FORCE_CHECK_S = 10.0


@dataclass
class Plan:
    start: list[tuple[RunSpec, str]] = field(default_factory=list)   # (run, "new" | "resume" | "retry")
    finished: list[RunSpec] = field(default_factory=list)
    failed: list[RunSpec] = field(default_factory=list)              # left alone without retry_failed
    active: list[RunSpec] = field(default_factory=list)              # a live worker or job has it

    def summary(self) -> str:
        kinds = {k: sum(1 for _, r in self.start if r == k) for k in ("new", "resume", "retry")}
        parts = [f"{len(self.start)} to run ({', '.join(f'{v} {k}' for k, v in kinds.items() if v) or 'none'})",
                 f"{len(self.finished)} finished (skipped)"]
        if self.failed:
            parts.append(f"{len(self.failed)} failed (skipped; --retry-failed retries them)")
        if self.active:
            parts.append(f"{len(self.active)} still running from an earlier launch (watched)")
        return "; ".join(parts)


def plan_runs(runs: list[RunSpec], retry_failed: bool = False, alive: Callable[[dict], bool] = holder_alive) -> Plan:
    plan = Plan()
    for run in runs:
        status = read_status(run.run_dir)
        state = status.get("state") if status else None
        if state is None:
            plan.start.append((run, "new"))
        elif state == "finished":
            plan.finished.append(run)
        elif state == "failed":
            (plan.start.append((run, "retry")) if retry_failed else plan.failed.append(run))
        elif state in ("pending", "running") and alive(status):
            plan.active.append(run)
        else:
            plan.start.append((run, "resume" if status.get("attempts") else "new"))
    return plan


def check_output(spec: SweepSpec) -> None:
    """The sweep folder can be created and written, or one line saying why not."""
    folder = spec.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise SweepError(f"{spec.where()}: output: can not write the sweep folder {folder}: {e.strerror or e}") from None


def prepare(run: RunSpec) -> None:
    """config.yaml and a pending status.json (keeping attempts and timings of earlier tries)."""
    atomic_write_text(run.run_dir / CONFIG_FILE, OmegaConf.to_yaml(run.cfg, resolve=True))
    status = read_status(run.run_dir) or new_status(run.label, run.variant, run.seed)
    status.update(state="pending", label=run.label, variant=run.variant, seed=run.seed,
                  slurm_job_id=None, pid=None, pid_start=None, error=None, traceback=None)
    write_status(run.run_dir, status)


def make_executor(spec: SweepSpec):
    import submitit

    la, logs = spec.launcher, spec.folder / "submitit" / "%j"
    if la["name"] == "local":
        # N workers share this machine's cores: one worker with torch's default thread count per
        # core would oversubscribe them (the runner reads STARE_LAB_THREADS).
        os.environ.setdefault("STARE_LAB_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, int(la.get("workers", 1))))))
        ex = submitit.LocalExecutor(folder=logs)
        ex.update_parameters(timeout_min=la["timeout_min"])
        return ex
    ex = submitit.SlurmExecutor(folder=logs, max_num_timeout=la["max_requeue"])
    params: dict[str, Any] = dict(
        job_name=f"stare_lab:{spec.name}", partition=la["partition"], account=la["account"], qos=la["qos"],
        constraint=la["constraint"], cpus_per_task=la["cpus_per_task"], mem=f"{la['mem_gb']}GB",
        time=int(la["timeout_min"]), array_parallelism=la["array_parallelism"], nodes=1, ntasks_per_node=1,
        signal_delay_s=la["signal_delay_s"], setup=list(la["setup"]),
        additional_parameters={"requeue": True, **la["additional"]})
    if la["gpus_per_node"]:
        params["gpus_per_node"] = la["gpus_per_node"]
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


@dataclass
class Tracked:
    run: RunSpec
    job: Any = None             # a submitit Job, or None for a run another launch is running


def launch_runs(spec: SweepSpec, plan: Plan, echo: Callable[[str], None] = print, executor=None) -> dict[str, int]:
    """Start the plan's runs, watch them and the active ones until all end; returns counts by state."""
    executor = executor or make_executor(spec)
    for run, _ in plan.start:
        prepare(run)
    queue = [run for run, _ in plan.start]
    waiting = [Tracked(run) for run in plan.active]
    if spec.launcher["name"] == "slurm" and queue:
        waiting += _submit_array(executor, queue)
        queue = []
    workers = spec.launcher.get("workers") or 10**9  # Slurm: the array's parallelism caps it
    counts = {"finished": len(plan.finished), "failed": 0, "interrupted": 0}
    last_force = time.time()
    with _progress(len(queue) + len(waiting), echo) as advance:
        try:
            while queue or waiting:
                while queue and sum(1 for t in waiting if t.job is not None) < workers:
                    run = queue.pop(0)
                    waiting.append(Tracked(run, executor.submit(RunWorker(), str(run.run_dir))))
                force = time.time() - last_force > FORCE_CHECK_S
                last_force = time.time() if force else last_force
                for t in [t for t in waiting if _ended(t, force)]:
                    waiting.remove(t)
                    if t.job is None and (read_status(t.run.run_dir) or {}).get("state") in ("pending", "running"):
                        prepare(t.run)  # its earlier worker died while we watched: resume it here
                        queue.append(t.run)
                        continue
                    state = reconcile(t)
                    counts[state] = counts.get(state, 0) + 1
                    advance(t.run, state)
                time.sleep(POLL_S if (queue or waiting) else 0)
        except KeyboardInterrupt:
            _interrupt(spec, waiting, echo)
            raise
    return counts


def _submit_array(executor, runs: list[RunSpec]) -> list[Tracked]:
    from submitit.core.utils import FailedJobError

    try:
        with executor.batch():
            jobs = [executor.submit(RunWorker(), str(run.run_dir)) for run in runs]
    except (FailedJobError, OSError) as e:
        raise SweepError(f"launcher: Slurm refused the job array: {first_line(str(e).split('stderr:')[-1])}") from None
    for run, job in zip(runs, jobs):
        status = read_status(run.run_dir) or {}
        if status.get("state") == "pending":  # the worker may already have started and written its own
            update_status(run.run_dir, slurm_job_id=str(job.job_id))
    return [Tracked(run, job) for run, job in zip(runs, jobs)]


def _ended(t: Tracked, force: bool) -> bool:
    if t.job is None:  # started by an earlier launch: its record and its holder tell
        status = read_status(t.run.run_dir) or {}
        return status.get("state") not in ("pending", "running") or (force and not holder_alive(status))
    from submitit.slurm.slurm import SlurmJob

    if not isinstance(t.job, SlurmJob):  # local jobs: submitit knows their process
        return t.job.done()
    if not t.job.done(force_check=force):
        return False
    # A requeued (pre-empted, timed-out, `scontrol requeue`d) job can look done to submitit (it may
    # even hold the first attempt's result) while Slurm requeues it. Slurm's queue decides; and a run
    # whose worker did not record an end (interrupted, running) must stay out of the queue for a
    # grace period before the sweep stops waiting for it.
    job_id = str(t.job.job_id)
    if _still_queued(job_id):
        _GONE_SINCE.pop(job_id, None)
        return False
    if (read_status(t.run.run_dir) or {}).get("state") in ("finished", "failed"):
        return True
    gone = _GONE_SINCE.setdefault(job_id, time.time())
    return time.time() - gone > REQUEUE_GRACE_S


REQUEUE_GRACE_S = 30.0
_GONE_SINCE: dict[str, float] = {}
_SQUEUE_ERRORS: dict[str, int] = {}


def _still_queued(job_id: str) -> bool:
    """Slurm lists the job in a live state. An unanswered squeue (a busy controller) counts as
    listed, up to 30 times in a row, so a loaded cluster never ends a sweep's wait early."""
    import subprocess

    try:
        out = subprocess.run(["squeue", "--states=all", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                             text=True, timeout=30)
        # a job the controller no longer knows (purged after MinJobAge) has ended
        answered = out.returncode == 0 or "Invalid job id" in out.stderr
    except (OSError, subprocess.TimeoutExpired):
        out, answered = None, False
    if not answered:
        _SQUEUE_ERRORS[job_id] = _SQUEUE_ERRORS.get(job_id, 0) + 1
        return _SQUEUE_ERRORS[job_id] <= 30
    _SQUEUE_ERRORS.pop(job_id, None)
    return any(st not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
               for st in out.stdout.split())


def reconcile(t: Tracked) -> str:
    """The run's final state; a job that died without the worker saying so is recorded failed."""
    error = None
    if t.job is not None:
        try:
            t.job.result()
        except Exception as e:  # noqa: BLE001 - the job's failure, recorded below if the worker could not
            error = f"{type(e).__name__}: {first_line(str(e)) or ''}"
    status = read_status(t.run.run_dir) or {}
    state = status.get("state")
    if state in ("pending", "running"):
        update_status(t.run.run_dir, state="failed", error=error or "the job ended without a result",
                      traceback=_job_log_tail(t.job), pid=None)
        state = "failed"
    return state or "failed"


def _job_log_tail(job, lines: int = 40) -> str | None:
    try:
        text = job.stderr() or ""
    except Exception:  # noqa: BLE001 - logs are a courtesy
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


def _interrupt(spec: SweepSpec, waiting: list[Tracked], echo) -> None:
    if spec.launcher["name"] == "local":
        for t in waiting:
            if t.job is not None:
                t.job.cancel(check=False)
        echo("interrupted: local runs stopped; `sweep run` again resumes them")
    else:
        echo("interrupted: the Slurm jobs keep running; `sweep run` again watches them, `sweep status` shows them")


class _progress:
    """rich progress on a terminal, one line per ended run otherwise."""

    def __init__(self, total: int, echo: Callable[[str], None]):
        self.total, self.echo, self.done, self._p = total, echo, 0, None

    def __enter__(self):
        from rich.console import Console

        if Console().is_terminal and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._p.start()
            self._task = self._p.add_task("runs", total=self.total)
        return self.advance

    def advance(self, run: RunSpec, state: str) -> None:
        self.done += 1
        line = f"[{self.done}/{self.total}] {state:<11} {run.label}  ({run.id})"
        if state != "finished":
            err = (read_status(run.run_dir) or {}).get("error")
            line += f": {err}" if err else ""
        if self._p is not None:
            self._p.console.print(line, markup=False, highlight=False)
            self._p.advance(self._task)
        else:
            self.echo(line)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.stop()
