"""Launching a sweep's runs through submitit, safely re-runnable.

`plan_runs` decides per run: a finished run is skipped (noting runs finished by other code), an
interrupted one (or one without a live worker: stare_lab.sweep.records.Liveness) resumes, a failed
or corrupt one is retried only with `retry_failed`, and one whose worker or job is alive is
watched. `launch_runs` writes each run's config.yaml and status.json and starts them: locally,
`workers` queue workers (`QueueWorker`, one process each, taking the queued runs one after another;
runs of several processes are one job per run instead, at most `workers` at once), or on Slurm one
job array (`array_parallelism` at once). A started process is recorded as its pending runs' holder
until a worker takes their claim. It waits with a progress display, and records as failed any run
whose job ended without the worker recording it (killed, out of memory, node lost). A worker that
finds the run claimed by another leaves it; the launcher then watches that run. The caller holds
the sweep lock.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from stare_lab.record import (
    CONFIG_FILE,
    CORRUPT,
    STATUS_FILE,
    claim_held,
    code_version,
    first_line,
    new_status,
    provenance,
    read_status,
    set_aside,
    update_status,
    write_status,
)
from stare_lab.sweep.expand import RunSpec
from stare_lab.sweep.records import LIVE, Liveness, process_start
from stare_lab.sweep.schema import SweepError, SweepSpec, processes_per_run, tasks_per_node
from stare_lab.sweep.worker import Execute, QueueWorker, RunWorker
from stare_lab.utils import atomic_write_text

POLL_S = 1.0
FORCE_CHECK_S = 10.0
REQUEUE_GRACE_S = 30.0
STOP_WAIT_S = 30.0


@dataclass
class Plan:
    start: list[tuple[RunSpec, str]] = field(default_factory=list)  # (run, "new" | "resume" | "retry" | "rerun")
    finished: list[RunSpec] = field(default_factory=list)
    failed: list[RunSpec] = field(default_factory=list)  # left alone without retry_failed
    corrupt: list[RunSpec] = field(default_factory=list)  # unreadable status.json, left alone
    active: list[RunSpec] = field(default_factory=list)  # a live worker or job has it
    other_code: dict[str, int] = field(default_factory=dict)  # code version → finished runs kept
    current_code: str | None = None

    def summary(self) -> str:
        kinds = {k: sum(1 for _, r in self.start if r == k) for k in ("new", "resume", "retry", "rerun")}
        parts = [
            f"{len(self.start)} to run ({', '.join(f'{v} {k}' for k, v in kinds.items() if v) or 'none'})",
            f"{len(self.finished)} finished (skipped)",
        ]
        if self.failed:
            parts.append(f"{len(self.failed)} failed (skipped; --retry-failed retries them)")
        if self.corrupt:
            parts.append(
                f"{len(self.corrupt)} with an unreadable status.json (skipped; `sweep status` names "
                "them, --retry-failed sets the file aside and resumes them)"
            )
        if self.active:
            parts.append(f"{len(self.active)} still running from an earlier launch (watched)")
        if self.other_code:
            versions = ", ".join(f"{v or 'unrecorded'}: {n}" for v, n in sorted(self.other_code.items(), key=str))
            parts.append(
                f"note: {sum(self.other_code.values())} finished run(s) came from other code than "
                f"{self.current_code} ({versions}); --rerun-other-code redoes them"
            )
        return "; ".join(parts)


def plan_runs(runs: list[RunSpec], retry_failed: bool = False, rerun_other_code: bool = False) -> Plan:
    """What to do with each run; the caller holds the sweep lock, so no other launcher is alive.
    A finished run whose last attempt ran other code than this checkout is kept (and counted in
    `other_code`) unless `rerun_other_code`."""
    plan = Plan(current_code=code_version(provenance()))
    statuses = [read_status(run.run_dir) for run in runs]
    live = Liveness.probe(statuses, launcher_alive=False)
    for run, status in zip(runs, statuses, strict=True):
        state = status.get("state") if status else None
        if state is None:
            plan.start.append((run, "new"))
        elif state == "finished":
            code = code_version(status)
            if code == plan.current_code:
                plan.finished.append(run)
            elif rerun_other_code:
                plan.start.append((run, "rerun"))
            else:
                plan.finished.append(run)
                plan.other_code[code] = plan.other_code.get(code, 0) + 1
        elif state in ("failed", CORRUPT):
            (
                plan.start.append((run, "retry"))
                if retry_failed
                else (plan.failed if state == "failed" else plan.corrupt).append(run)
            )
        elif live.alive(run.run_dir, status):
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
        raise SweepError(
            f"{spec.where()}: output: can not write the sweep folder {folder}: {e.strerror or e}"
        ) from None


def prepare(run: RunSpec, fresh: bool = False) -> None:
    """config.yaml and a pending status.json (keeping attempts and timings of earlier tries; an
    unreadable status.json is set aside, never overwritten). `fresh`: the run starts over (other
    code finished it); its whole old record moves to <sweep folder>/.superseded/<id>-<time>/."""
    if fresh and run.run_dir.exists():
        dest = run.run_dir.parent / ".superseded" / f"{run.id}-{time.strftime('%Y%m%dT%H%M%S')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(run.run_dir, dest)
    atomic_write_text(run.run_dir / CONFIG_FILE, OmegaConf.to_yaml(run.cfg, resolve=True))
    status = read_status(run.run_dir)
    if status is not None and status.get("state") == CORRUPT:
        kept = set_aside(run.run_dir / STATUS_FILE)
        status = {**new_status(), "note": f"the earlier unreadable status.json is kept as {kept.name}"}
    status = status or new_status(run.label, run.variant, run.seed)
    status.update(
        state="pending",
        label=run.label,
        variant=run.variant,
        seed=run.seed,
        slurm_job_id=None,
        pid=None,
        pid_start=None,
        error=None,
        traceback=None,
    )
    write_status(run.run_dir, status)


def worker_threads(spec: SweepSpec) -> int | None:
    """Torch threads per local worker: N workers share this machine's cores (torch's default of
    one thread per core each would oversubscribe them). Slurm jobs get their own cores."""
    if spec.launcher["name"] != "local":
        return None
    processes = max(1, int(spec.launcher.get("workers", 1))) * tasks_per_node(spec.launcher)
    return max(1, (os.cpu_count() or 1) // processes)


def make_executor(spec: SweepSpec):
    import submitit

    la, logs = spec.launcher, spec.folder / "submitit" / "%j"
    if la["name"] == "local":
        ex = submitit.LocalExecutor(folder=logs)
        ex.update_parameters(timeout_min=la["timeout_min"], tasks_per_node=tasks_per_node(la))
        return ex
    ex = submitit.SlurmExecutor(folder=logs, max_num_timeout=la["max_requeue"])
    params: dict[str, Any] = dict(
        job_name=f"stare_lab:{spec.name}",
        partition=la["partition"],
        account=la["account"],
        qos=la["qos"],
        constraint=la["constraint"],
        cpus_per_task=la["cpus_per_task"],
        mem=f"{la['mem_gb']}GB",
        time=int(la["timeout_min"]),
        array_parallelism=la["array_parallelism"],
        nodes=la["nodes"],
        ntasks_per_node=tasks_per_node(la),
        signal_delay_s=la["signal_delay_s"],
        setup=list(la["setup"]),
        additional_parameters={"requeue": True, **la["additional"]},
    )
    if la["gpus_per_node"]:
        params["gpus_per_node"] = la["gpus_per_node"]
    if processes_per_run(la) > 1:  # a rank that exits with an error ends the others at once (not after ddp_timeout)
        params["srun_args"] = ["--kill-on-bad-exit=1"]
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


@dataclass
class Tracked:
    run: RunSpec
    job: Any = None  # a submitit Job of this run alone, or None (see `queue_workers`)
    queue_workers: list = field(default_factory=list)  # local QueueWorker jobs given this run; with none
    # and no job, the run is watched through its record


def submit_run(executor, worker: RunWorker, run: RunSpec):
    """Submit one run; a local job's process is recorded as the run's holder (a lease) until its
    worker starts, so a re-run after this driver dies watches it instead of starting a second."""
    job = _without_sigint(lambda: executor.submit(worker, str(run.run_dir)))
    _lease([run], job)
    return job


def submit_queue(executor, worker: QueueWorker, runs: list[RunSpec], timeout_min: float):
    """Start one local queue worker over `runs`, holder (lease) of those still pending. Its time
    limit is `timeout_min` (the launcher's, per run) for each run it may take."""
    executor.update_parameters(timeout_min=timeout_min * len(runs))
    job = _without_sigint(lambda: executor.submit(worker, [str(run.run_dir) for run in runs]))
    _lease(runs, job)
    return job


def _lease(runs: list[RunSpec], job) -> None:
    pid = getattr(getattr(job, "_process", None), "pid", None)  # the local job's controller process
    if not pid:
        return
    start, host = process_start(pid), socket.gethostname()
    for run in runs:
        if (read_status(run.run_dir) or {}).get("state") == "pending":
            update_status(run.run_dir, pid=pid, pid_start=start, host=host)


class Starter:
    """Starts queued runs. Local runs of one process go to queue workers: while fewer than
    `workers` are alive, new ones are started, each given every queued run (they share them out
    through the runs' claims); the one-run-per-process start-up (interpreter, imports, exit: ~8 s
    of the demo's ~25 s per run) is then paid once per worker. A run of several processes (local)
    is one job per run, at most `workers` at once; on Slurm, the array is submitted before and
    only a watched run that lost its worker is submitted here, one job each."""

    def __init__(self, spec: SweepSpec, executor, execute: Execute | None):
        la, threads = spec.launcher, worker_threads(spec)
        self.executor = executor
        self.queued = la["name"] == "local" and tasks_per_node(la) == 1
        self.workers = int(la.get("workers") or 10**9)  # Slurm: the array's parallelism caps it
        self.timeout_min = float(la["timeout_min"])
        self.worker = QueueWorker(execute, threads) if self.queued else RunWorker(execute, threads)
        self.queue_jobs: list = []

    def start(self, queue: list[RunSpec], waiting: list[Tracked]) -> None:
        """Move what can start now from `queue` into `waiting`."""
        if not self.queued:
            while queue and sum(1 for t in waiting if t.job is not None) < self.workers:
                run = queue.pop(0)
                waiting.append(Tracked(run, submit_run(self.executor, self.worker, run)))
            return
        free = min(self.workers - len(self.live_jobs()), len(queue))
        if free <= 0:
            return
        jobs = [submit_queue(self.executor, self.worker, queue, self.timeout_min) for _ in range(free)]
        self.queue_jobs += jobs
        waiting += [Tracked(run, queue_workers=jobs) for run in queue]
        queue.clear()

    def live_jobs(self) -> list:
        self.queue_jobs = [job for job in self.queue_jobs if not job.done()]
        return self.queue_jobs


def _without_sigint(start: Callable[[], Any]) -> Any:
    """Start local jobs with SIGINT ignored: a Ctrl-C at the terminal reaches every process of the
    foreground group, and submitit's controllers would each print a KeyboardInterrupt traceback.
    The driver stops them itself (`stop_job`), and Python keeps an inherited SIG_IGN."""
    if threading.current_thread() is not threading.main_thread():
        return start()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return start()
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_job(job) -> None:
    """Stop a job: SIGTERM for a local one (its worker records the run interrupted), scancel on Slurm."""
    process = getattr(job, "_process", None)
    if process is not None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    else:
        job.cancel(check=False)


def launch_runs(
    spec: SweepSpec, plan: Plan, echo: Callable[[str], None] = print, executor=None, execute: Execute | None = None
) -> dict[str, int]:
    """Start the plan's runs, watch them and the active ones until all end; returns counts by state.
    `execute` replaces the real runner in the workers (tests)."""
    executor = executor or make_executor(spec)
    starter = Starter(spec, executor, execute)
    for run, kind in plan.start:
        prepare(run, fresh=kind == "rerun")
    queue = [run for run, _ in plan.start]
    waiting = [Tracked(run) for run in plan.active]
    if spec.launcher["name"] == "slurm" and queue:
        waiting += _submit_array(executor, starter.worker, queue)
        queue = []
    counts = {"finished": len(plan.finished), "failed": 0, "interrupted": 0}
    watch = SlurmWatch()
    with _progress(len(queue) + len(waiting), echo) as advance:
        try:
            while queue or waiting:
                starter.start(queue, waiting)
                live, fresh = watch.look(waiting)
                for t in [t for t in waiting if watch.ended(t, live, fresh)]:
                    waiting.remove(t)
                    state = reconcile(t)
                    if state == "watch":  # another worker holds the run: follow it instead
                        waiting.append(Tracked(t.run))
                    elif state == "resume":  # its earlier worker died while we watched
                        prepare(t.run)
                        queue.append(t.run)
                    else:
                        counts[state] = counts.get(state, 0) + 1
                        advance(t.run, state)
                time.sleep(POLL_S if (queue or waiting) else 0)
        except KeyboardInterrupt:
            _interrupt(spec, [t.job for t in waiting if t.job is not None] + starter.live_jobs(), echo)
            raise
    return counts


def _submit_array(executor, worker: RunWorker, runs: list[RunSpec]) -> list[Tracked]:
    from submitit.core.utils import FailedJobError

    try:
        with executor.batch():
            jobs = [executor.submit(worker, str(run.run_dir)) for run in runs]
    except (FailedJobError, OSError) as e:
        raise SweepError(f"launcher: Slurm refused the job array: {first_line(str(e).split('stderr:')[-1])}") from None
    for run, job in zip(runs, jobs, strict=True):
        status = read_status(run.run_dir) or {}
        if status.get("state") == "pending":  # the worker may already have started and written its own
            update_status(run.run_dir, slurm_job_id=str(job.job_id))
    return [Tracked(run, job) for run, job in zip(runs, jobs, strict=True)]


class SlurmWatch:
    """When a tracked job has ended. Each round takes one `Liveness` look; Slurm is asked (one
    squeue call) at most every FORCE_CHECK_S. The per-launch memory of jobs that left Slurm's
    queue lives here, not in module state."""

    def __init__(self):
        self.asked = 0.0
        self.slurm: dict[str, str] | None = None
        self.gone_since: dict[str, float] = {}
        self.unanswered = 0

    def look(self, waiting: list[Tracked]) -> tuple[Liveness, bool]:
        """(this round's liveness, whether Slurm was asked this round)."""
        statuses = [read_status(t.run.run_dir) for t in waiting]
        fresh = time.time() - self.asked >= FORCE_CHECK_S
        if fresh:
            self.asked = time.time()
            live = Liveness.probe(statuses, ask_slurm=any(_is_slurm(t.job) for t in waiting))
            # An unanswered squeue (a busy controller) counts as "still queued", up to 30 looks in
            # a row, so a loaded cluster never ends a sweep's wait early.
            self.unanswered = self.unanswered + 1 if live.slurm is None else 0
            self.slurm = live.slurm
        else:
            live = Liveness(socket.gethostname(), self.slurm, launcher_alive=False)
        return live, fresh

    def ended(self, t: Tracked, live: Liveness, fresh: bool) -> bool:
        if t.queue_workers:
            return _queued_run_ended(t)
        if t.job is None:  # another worker's run: its record and its liveness tell
            status = read_status(t.run.run_dir) or {}
            return status.get("state") not in ("pending", "running") or (
                fresh and not live.alive(t.run.run_dir, status)
            )
        if not _is_slurm(t.job):  # local jobs: submitit knows their process
            return t.job.done()
        if not t.job.done(force_check=fresh):
            return False
        # A requeued (pre-empted, timed-out, `scontrol requeue`d) job can look done to submitit (it
        # may even hold the first attempt's result) while Slurm requeues it. Slurm's queue decides;
        # and a run whose worker did not record an end must stay out of the queue for a grace
        # period before the sweep stops waiting for it.
        job_id = str(t.job.job_id)
        queued = self.unanswered <= 30 if self.slurm is None else live.slurm_job_live(job_id)
        if queued:
            self.gone_since.pop(job_id, None)
            return False
        if (read_status(t.run.run_dir) or {}).get("state") in ("finished", "failed"):
            return True
        gone = self.gone_since.setdefault(job_id, time.time())
        return time.time() - gone > REQUEUE_GRACE_S


def _queued_run_ended(t: Tracked) -> bool:
    """A run given to queue workers: ended when recorded ended or when its worker let go of it
    without recording an end; while still pending, once every queue worker given it has exited."""
    state = _queued_state(t)
    if state == "pending":
        return all(job.done() for job in t.queue_workers)
    if state == "orphaned":  # wait for its worker's job to end, so that its reason can be recorded
        return _died(t) is not None or all(job.done() for job in t.queue_workers)
    return state != "running"


def _queued_state(t: Tracked) -> str | None:
    """The run's recorded state, or "orphaned" for a run recorded running whose claim nobody
    holds: its worker died (a worker records the end before it releases the claim)."""
    run_dir = t.run.run_dir
    state = (read_status(run_dir) or {}).get("state")
    if state != "running" or claim_held(run_dir):
        return state
    state = (read_status(run_dir) or {}).get("state")  # read again: it may have ended meanwhile
    return "orphaned" if state == "running" else state


def _is_slurm(job) -> bool:
    if job is None:
        return False
    from submitit.slurm.slurm import SlurmJob

    return isinstance(job, SlurmJob)


def reconcile(t: Tracked) -> str:
    """The run's final state once its job ended: a job that died without the worker saying so is
    recorded failed; "watch" when another worker holds the run, "resume" when a watched run's
    worker is gone."""
    if t.queue_workers:
        return _reconcile_queued(t)
    error, result = None, None
    if t.job is not None:
        try:
            result = t.job.result()
        except Exception as e:  # noqa: BLE001 - the job's failure, recorded below if the worker could not
            error = f"{type(e).__name__}: {first_line(str(e)) or ''}"
    if isinstance(result, dict) and result.get("claimed_elsewhere"):
        return "watch"
    status = read_status(t.run.run_dir) or {}
    state = status.get("state")
    if state in ("pending", "running"):
        if t.job is None:
            return "resume"
        from stare_lab.sweep.ranks import latest_peer_failure

        error = latest_peer_failure(t.run.run_dir) or error  # a multi-process run: the first rank that failed
        update_status(
            t.run.run_dir,
            state="failed",
            error=error or "the job ended without a result",
            traceback=_job_log_tail(t.job),
            pid=None,
        )
        state = "failed"
    return state or "failed"


def _reconcile_queued(t: Tracked) -> str:
    """A queued run's state once `_queued_run_ended`: as recorded; failed with submitit's reason
    when a queue worker given it died while running it; else "watch" (no queue worker took it, or
    one of another launch runs it: the watch resumes it when nobody holds it)."""
    state = _queued_state(t)
    if state not in LIVE and state != "orphaned":
        return state or "failed"
    died = _died(t)
    if state == "orphaned" and died is not None:
        return reconcile(Tracked(t.run, died))
    return "watch"


def _died(t: Tracked):
    """A queue worker given this run that exited without a result (killed), or None."""
    return next((job for job in t.queue_workers if job.done() and not job.paths.result_pickle.exists()), None)


def _job_log_tail(job, lines: int = 40) -> str | None:
    try:
        text = job.stderr() or ""
    except Exception:  # noqa: BLE001 - logs are a courtesy
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


def _interrupt(spec: SweepSpec, jobs: list, echo) -> None:
    if spec.launcher["name"] != "local":
        echo("interrupted: the Slurm jobs keep running; `sweep run` again watches them, `sweep status` shows them")
        return
    for job in jobs:
        stop_job(job)
    deadline = time.time() + STOP_WAIT_S  # let the workers record `interrupted`
    while time.time() < deadline and not all(job.done() for job in jobs):
        time.sleep(0.2)
    echo("interrupted: local runs stopped; `sweep run` again resumes them")


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
