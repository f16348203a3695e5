"""The jobs of a launch: submitting them (with a lease on their runs), telling when they ended,
reconciling a run's record with its job's end, and stopping them.

A launcher (stare_lab.launchers) chooses among these: its `starter` is a `QueueStarter`
(local queue workers: N processes share the queued runs), a `RunStarter` (one job per run, at most
N at once) or one of its own, and its `watch` a `JobWatch` (or a subclass that knows its
scheduler). A started process is recorded as its pending runs' holder until a worker takes their
claim, so a re-run after the driver died watches it instead of starting a second.
"""

from __future__ import annotations

import abc
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from stare_lab.launchers.liveness import LIVE, Liveness, process_start
from stare_lab.launchers.ranks import latest_peer_failure
from stare_lab.launchers.run_spec import RunSpec
from stare_lab.record import claim_held, first_line, read_status, update_status

# Records (and, through Liveness, Slurm: one batched query) are looked at every FORCE_CHECK_S.
FORCE_CHECK_S = 10.0
# Ctrl-C: how long the processes of a local job left running after its grace (stop_local) get to go once killed.
KILL_WAIT_S = 5.0

# What a job calls, as the jobs see it: stare_lab.sweep.worker's RunWorker (a run's folder -> its
# status) and QueueWorker (the queued runs' folders -> their statuses). Named here by their calls,
# not imported: the workers run the runner, a layer above the launchers that submit them.
RunJob = Callable[[str], dict[str, Any]]
QueueJob = Callable[[list[str]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Workers:
    """The callables a launch's jobs run (stare_lab.sweep.worker), given to the launcher's starter."""

    run: RunJob  # one run per job
    queue: QueueJob  # a local queue worker: the queued runs one after another


@dataclass
class Tracked:
    run: RunSpec
    job: Any = None  # a submitit Job of this run alone, or None (see `queue_workers`)
    queue_workers: list = field(default_factory=list)  # local QueueWorker jobs given this run; with none
    # and no job, the run is watched through its record


def submit_run(executor, worker: RunJob, run: RunSpec):
    """Submit one run; a local job's process is recorded as the run's holder (a lease) until its
    worker starts."""
    job = _without_sigint(lambda: executor.submit(worker, str(run.run_dir)))
    _lease([run], job)
    return job


def submit_queue(executor, worker: QueueJob, runs: list[RunSpec], timeout_min: float):
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


class Starter(abc.ABC):
    """Starts queued runs: `begin` takes what is submitted at once (a Slurm array), `start` moves
    what can start now from the queue into the tracked runs, `live_jobs` are the jobs to stop on
    Ctrl-C besides the tracked runs' own."""

    def begin(self, queue: list[RunSpec]) -> list[Tracked]:
        return []

    @abc.abstractmethod
    def start(self, queue: list[RunSpec], waiting: list[Tracked]) -> None: ...

    def live_jobs(self) -> list:
        return []


class RunStarter(Starter):
    """One job per run (`RunWorker`), at most `limit` at once."""

    def __init__(self, executor, worker: RunJob, limit: int):
        self.executor, self.worker, self.limit = executor, worker, limit

    def start(self, queue: list[RunSpec], waiting: list[Tracked]) -> None:
        while queue and sum(1 for t in waiting if t.job is not None) < self.limit:
            run = queue.pop(0)
            waiting.append(Tracked(run, submit_run(self.executor, self.worker, run)))


class QueueStarter(Starter):
    """Local runs of one process go to queue workers: while fewer than `workers` are alive, new
    ones are started, each given every queued run (they share them out through the runs' claims);
    the start-up of a process per run (the interpreter, the torch, transformers, TRL and W&B imports,
    and the exit: seconds of CPU, more than a demo run's training steps) is then paid once per worker."""

    def __init__(self, executor, worker: QueueJob, workers: int, timeout_min: float):
        self.executor, self.worker, self.workers, self.timeout_min = executor, worker, workers, timeout_min
        self.queue_jobs: list = []

    def start(self, queue: list[RunSpec], waiting: list[Tracked]) -> None:
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


class JobWatch:
    """When a tracked run has ended. Each round takes one `Liveness` look (records, claims,
    processes); Slurm is asked, in one batched query for every job of the look, at most every
    FORCE_CHECK_S. The per-launch memory of those answers lives here, not in module state."""

    def __init__(self) -> None:
        self.asked = 0.0
        self.slurm: dict[str, str] | None = None

    def ended_runs(self, waiting: list[Tracked]) -> list[Tracked]:
        live, fresh = self.look(waiting)
        return [t for t in waiting if self.ended(t, live, fresh)]

    def look(self, waiting: list[Tracked]) -> tuple[Liveness, bool]:
        """(this round's liveness, whether Slurm was asked this round)."""
        statuses = [read_status(t.run.run_dir) for t in waiting]
        fresh = time.time() - self.asked >= FORCE_CHECK_S
        if fresh:
            self.asked = time.time()
            live = Liveness.probe(statuses, job_ids=self.job_ids(waiting))
            self.answered(live)
            self.slurm = live.slurm
        else:
            live = Liveness(socket.gethostname(), self.slurm, launcher_alive=False)
        return live, fresh

    def job_ids(self, waiting: list[Tracked]) -> list[str]:
        """Scheduler job ids to ask about besides those the live records name."""
        return []

    def answered(self, live: Liveness) -> None:
        """A fresh look's answer (a scheduler's watch counts unanswered queries)."""

    def ended(self, t: Tracked, live: Liveness, fresh: bool) -> bool:
        if t.queue_workers:
            return _queued_run_ended(t)
        if t.job is None:  # another worker's run: its record and its liveness tell
            status = read_status(t.run.run_dir) or {}
            return status.get("state") not in LIVE or (fresh and not live.alive(t.run.run_dir, status))
        return self.job_ended(t, live, fresh)

    def job_ended(self, t: Tracked, live: Liveness, fresh: bool) -> bool:
        return t.job.done()  # local jobs: submitit knows their process


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


def reconcile(t: Tracked) -> str:
    """The run's final state once its job ended: a job that died without the worker saying so is
    recorded failed; "watch" when another worker holds the run, "resume" when a watched run's
    worker is gone."""
    if t.queue_workers:
        return _reconcile_queued(t)
    error, result = None, None
    if t.job is not None:
        try:  # results(): a job of several tasks has one per task (result() refuses those); rank 0's first
            result = t.job.results()[0]
        except Exception as e:  # noqa: BLE001 - the job's failure, recorded below if the worker could not
            error = f"{type(e).__name__}: {first_line(str(e)) or ''}"
    if isinstance(result, dict) and result.get("claimed_elsewhere"):
        return "watch"
    status = read_status(t.run.run_dir) or {}
    state = status.get("state")
    if state in LIVE:
        if t.job is None:
            return "resume"
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


def stop_local(jobs: list, echo: Callable[[str], None], wait_s: float, kill_wait_s: float = KILL_WAIT_S) -> None:
    """Stop local jobs, every wait bounded: SIGTERM (their workers record the runs interrupted and
    leave), up to `wait_s` for them to end, then SIGKILL to what is left, which waits up to
    `kill_wait_s` more. A worker ends late when SIGTERM finds it inside a long call that does not
    return to Python (a training step on a busy node) or in its run's clean-up (W&B's finish, a vLLM
    server's stop); a second Ctrl-C ends the first wait at once. The runs of killed workers are
    recorded interrupted by the driver (`record_stopped`)."""
    for job in jobs:
        stop_job(job)
    try:
        _wait_done(jobs, wait_s)
    except KeyboardInterrupt:  # a second Ctrl-C: the user will not wait for the workers' own records
        pass
    late = [job for job in jobs if not job.done()]
    processes = [p for job in late for p in kill_job(job)]
    psutil.wait_procs(processes, timeout=kill_wait_s)  # gone, their claims let go: `record_stopped` reads them
    killed = f" ({len(late)} killed: still running {wait_s:g} s after SIGTERM)" if late else ""
    echo(f"interrupted: local runs stopped{killed}; `sweep run` again resumes them")


def _wait_done(jobs: list, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all(job.done() for job in jobs):
        time.sleep(0.1)


def kill_job(job) -> list[psutil.Process]:
    """SIGKILL a local job: the processes its submitit controller started (the workers, and theirs)
    first, then the controller, which otherwise lives until its tasks end, holding the driver's
    stdout and stderr (a pipe read to its end, `sweep run | tee`, would not end either). Returns the
    processes signalled."""
    process = getattr(job, "_process", None)
    if process is None or process.poll() is not None:
        return []
    try:
        controller = psutil.Process(process.pid)
        tree = [*controller.children(recursive=True), controller]
    except psutil.NoSuchProcess:
        return []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()  # psutil checks first that the pid still names the same process
    return tree


def record_stopped(tracked: list[Tracked]) -> int:
    """After a Ctrl-C's stop: each run this launch started that is still recorded running, whose
    worker process on this host is gone and whose claim nobody holds (a killed worker; one that ended
    on its own recorded its end before it let go of the claim), is recorded interrupted, to resume at
    the next `sweep run`. A run of a worker elsewhere (a Slurm node, another driver's) is left to its
    worker. Returns how many were recorded."""
    host, recorded = socket.gethostname(), 0
    for t in tracked:
        if t.job is None and not t.queue_workers:
            continue  # only watched: another worker's run
        status = read_status(t.run.run_dir) or {}
        if status.get("state") != "running" or status.get("host") != host or not status.get("pid"):
            continue
        if process_start(int(status["pid"])) == status.get("pid_start") or claim_held(t.run.run_dir):
            continue
        update_status(
            t.run.run_dir,
            state="interrupted",
            error="Ctrl-C in `sweep run`: its worker was killed before it recorded the run's end",
            traceback=None,
            finished=None,
        )
        recorded += 1
    return recorded
