"""The worker: one run, with its claim and status.json bookkeeping around `stare_lab.run.runner.execute`
(called in one place, `execute_run`).

`run_one(run_dir)` is what every launcher runs (and what `stare-lab train` calls in-process). It
first takes the run's claim (stare_lab.record.RunClaim): a second worker started for the same run
(a re-run that could not see the first one, a duplicate Slurm job) finds it held and leaves
without touching the record. Then: state running → finished | failed | interrupted, attempts,
host, pid, Slurm job id, timings, and the error's first line plus traceback.

`QueueWorker` is the local launcher's worker process: it runs the runs of a list one after another,
each through `run_one`, taking only runs still pending, so that N of them given the same list share
it out and the interpreter with its imports is paid once per worker rather than once per run.

`RunWorker` (one run per job: Slurm, and local runs of several processes) is a submitit
`Checkpointable`: on pre-emption or time-out submitit calls `checkpoint`, which records the run as
interrupted and resubmits the worker itself; the requeued job calls `run_one` again, and the
runner resumes from the last trainer checkpoint (and the same W&B run, whose id is the run id). A
job of several tasks is one multi-process run (`run_rank`): rank 0 is the worker above, the other
ranks train with it and keep no record. Thread count, OpenMP's wait policy and warning filters
are set by `start_worker` when a worker process starts, never on import (stare_lab.launchers.threads);
each attempt records them in its provenance (`threads`).
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import submitit

from stare_lab.config.run_config import load_config
from stare_lab.config.server_layout import is_server_run
from stare_lab.launchers.liveness import self_identity
from stare_lab.launchers.ranks import RANKS_DIR, RankGate, attempt_key, is_echo
from stare_lab.launchers.threads import (
    WorkerThreads,
    apply_wait_policy,
    busy_elsewhere,
    decide_threads,
    omp_num_threads,
    policy_text,
    usable_cpus,
)
from stare_lab.methods.outside import import_run_modules, rule_modules
from stare_lab.methods.registry import rule_module
from stare_lab.models import model_source
from stare_lab.record import (
    CONFIG_FILE,
    CORRUPT,
    RecordError,
    RunClaim,
    elapsed,
    first_line,
    new_status,
    now_iso,
    provenance,
    read_status,
    update_status,
    write_status,
)
from stare_lab.sweep import server_task


class Terminated(BaseException):
    """SIGTERM in a worker: Slurm cancels, requeues or pre-empts the job, or `sweep run` is stopped."""


# What `start_worker` / `run_threads` set in this process: each attempt records it (`threads_record`).
_STARTED: dict[str, Any] = {}
_PLAN: list[WorkerThreads] = [WorkerThreads()]  # what the launcher said (start_worker)
OMP = "OMP_NUM_THREADS"
_EXPORTED: list[str] = []  # the OMP_NUM_THREADS this process exported itself (run_threads), not the user's


def start_worker(threads: WorkerThreads | int | None = None, decide: bool = True) -> dict[str, Any]:
    """Process-wide settings of a worker: OpenMP's wait policy (stare_lab.launchers.threads: PASSIVE with
    a 0.3 ms spin unless the environment says, set before torch loads OpenMP when it has not yet),
    torch threads (`run_threads`; `decide=False`: at the start of each run instead) and warnings.
    `threads`: the launcher's WorkerThreads, or an int: `threads_per_worker`. Returns what it set:
    {"torch", "from", "omp_wait_policy"}."""
    _PLAN[0] = threads if isinstance(threads, WorkerThreads) else WorkerThreads(per_worker=threads or None)
    policy = apply_wait_policy()  # before the first real `import torch` of this process
    import torch  # noqa: F401 - OpenMP loads with it, after the wait policy is set

    # TRL 1.16 itself still uses transformers' deprecated gradient_checkpointing names.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    _STARTED["omp_wait_policy"] = policy
    return run_threads() if decide else dict(_STARTED)


def run_threads() -> dict[str, Any]:
    """Decide this process's torch threads for the run it starts (stare_lab.launchers.threads): the
    launcher's key, else OMP_NUM_THREADS, else the usable cores shared among the workers and left
    free by other processes just now (a 0.25 s look, only then, and only where the share is above one
    thread: the demo's 2 workers on 2 cores take 1 each without it)."""
    import torch  # deferred: the command line's refusals come before torch (docs/design.md, "Fast refusals")

    plan = _PLAN[0]
    if _EXPORTED and os.environ.get(OMP) == _EXPORTED[0]:  # ours, from the last run: decide afresh
        del os.environ[OMP]
    _EXPORTED.clear()
    choice = decide_threads(plan.per_worker, os.environ, usable_cpus(), plan.sharing)
    decided = plan.per_worker is not None or omp_num_threads(os.environ) is not None
    if not decided and choice.threads > 1:  # others' load can only lower it: at 1 thread, no look
        choice = decide_threads(plan.per_worker, os.environ, usable_cpus(), plan.sharing, busy_elsewhere())
    torch.set_num_threads(choice.threads)
    if OMP not in os.environ:
        # accelerate (state.py, PartialState on a multi-process CPU run) sets torch's threads to the node's
        # physical cores / its local processes unless OMP_NUM_THREADS is set: a rank alone on its node took
        # 2 threads where its Slurm task had 1 core, and its statistics moved in the 7th digit
        # (tests/multinode/test_multinode_runs.py). Exported, the decision holds for the whole run.
        _EXPORTED.append(str(choice.threads))
        os.environ[OMP] = _EXPORTED[0]
    _STARTED.update({"torch": choice.threads, "from": choice.source})
    return dict(_STARTED)


def threads_record() -> dict[str, Any]:
    """The attempt's `threads` in its provenance: torch's thread count now, what decided it, and the
    OpenMP wait policy (from `start_worker`; a process that did not call it: torch's default)."""
    import torch  # deferred: as in run_threads

    return {
        "from": "torch's default",
        "omp_wait_policy": policy_text(os.environ),
        **_STARTED,
        "torch": torch.get_num_threads(),
    }


def execute_run(run_dir: Path) -> None:
    """Train and evaluate the run: the real runner, imported at first use (it imports torch)."""
    from stare_lab.run.runner import execute  # deferred: torch, transformers and TRL

    execute(run_dir)


def outside_rule_modules(run_dir: Path) -> list[dict[str, Any]]:
    """Import the run's `run.imports` (a failure is the run's one-line error) and return the record of
    every module of rules kept outside the package it uses (stare_lab.methods.outside.rule_modules)."""
    cfg = load_config(run_dir / CONFIG_FILE)
    imported = import_run_modules(cfg.get("run"))
    return rule_modules(rule_module((cfg.get("method") or {}).get("name")), imported)


def run_one(
    run_dir: Path | str,
    *,
    force: bool = False,
    gate: RankGate | None = None,
    only_pending: bool = False,
    code: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the run in `run_dir`; returns its final status. Raises what the run raised.

    A finished run is not run again unless `force`. When another worker holds the run's claim,
    nothing is done and the status is returned with `claimed_elsewhere: True`. `gate`: this is rank
    0 of a multi-process run; it tells the other ranks whether to start (stare_lab.launchers.ranks).
    `only_pending`: run it only if its record, read under the claim, is still `pending` (queued by
    the launcher and taken by no other worker since); else return the status untouched with
    `skipped: True`. `code`: the provenance of the code this process runs (`loaded_code`), recorded
    for the attempt; None: the checkout's now.
    """
    run_dir = Path(run_dir)
    claim = RunClaim(run_dir)
    if not claim.acquire():
        if gate is not None:
            gate.open(False, "another worker holds the run")
        return {**(read_status(run_dir) or {}), "claimed_elsewhere": True}
    try:
        status = read_status(run_dir) or {}
        if only_pending and status.get("state") != "pending":
            return {**status, "skipped": True}
        return _run_claimed(run_dir, force, gate, code)
    finally:
        claim.release()


def failed_before_requeue(status: dict[str, Any], ident: dict[str, Any]) -> bool:
    """Whether this worker is Slurm's own requeue of the job whose attempt failed the run.

    Slurm requeues a job on its own when a node fails (JobRequeue=1, the default) and runs the same
    submission again with SLURM_RESTART_COUNT > 0, also when no `sweep run` is watching to cancel it
    (SlurmWatch cancels a job still live after its run recorded its end, docs/distributed.md). A run
    that failed resumes only on `sweep run --retry-failed`, which submits a new job; a run this very
    job recorded `interrupted` (pre-emption, time-out, `scontrol requeue`) resumes here as before.
    """
    return (
        status.get("state") == "failed"
        and int(ident.get("restarts") or 0) > 0
        and ident.get("slurm_job_id") is not None
        and str(status.get("slurm_job_id")) == str(ident["slurm_job_id"])
    )


def run_rank(run_dir: Path, rank: int, world: int, key: str) -> dict[str, Any]:
    """One rank of a multi-process run: rank 0 is the run's worker (`run_one`: claim, status.json);
    the others wait for its go, run the same runner (training and evaluation are collective) and
    write nothing but their rank file (stare_lab.launchers.ranks)."""
    gate = RankGate(run_dir, key, rank, world)
    gate.started()
    if rank == 0:
        return run_one(run_dir, gate=gate)
    go, reason = gate.wait_open()
    if not go:
        return {"rank": rank, "skipped": reason}
    try:
        execute_run(run_dir)
    except Terminated:  # a requeue or cancel: rank 0 records it, this rank did not fail
        raise
    except BaseException as e:
        gate.failed(f"{type(e).__name__}: {e}")
        raise
    return {"rank": rank, "state": "finished"}


def _run_claimed(
    run_dir: Path,
    force: bool,
    gate: RankGate | None = None,
    code: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status = read_status(run_dir) or new_status()
    if status.get("state") == CORRUPT:
        if gate is not None:
            gate.open(False, "unreadable status.json")
        raise RecordError(f"{status['error']}; fix or remove it (`sweep run --retry-failed` sets it aside)")
    if status.get("state") == "finished" and not force:
        if gate is not None:
            gate.open(False, "finished")
        return status
    ident = self_identity()
    if failed_before_requeue(status, ident):
        if gate is not None:
            gate.open(False, "failed before Slurm requeued its job")
        return {**status, "skipped": True}
    if not ident["slurm_job_id"]:
        ident["slurm_job_id"] = status.get("slurm_job_id") if ident["host"] == status.get("host") else None
    t0 = time.time()
    attempt = int(status.get("attempts") or 0) + 1
    status.update(
        ident,
        state="running",
        attempts=attempt,
        error=None,
        # training processes: the job's tasks, less a server-mode run's server slots (its WORLD_SIZE, _export_world)
        world_size=min(gate.world, int(os.environ.get("WORLD_SIZE") or gate.world)) if gate else 1,
        traceback=None,
        finished=None,
        started=status.get("started") or now_iso(),
        attempt_started=now_iso(),
    )
    # which code ran each attempt: `sweep run` and the tables compare it with the current code
    code = code or provenance(_device())
    status["provenance"] = [
        *(status.get("provenance") or []),
        {"attempt": attempt, "started": status["attempt_started"], **code, "threads": threads_record()},
    ]
    write_status(run_dir, status)
    if gate is not None:
        gate.open(True)
    try:
        modules = outside_rule_modules(run_dir)
        if modules:  # beside the project's commit: the rule modules of this attempt, with their hashes
            status["provenance"][-1]["rule_modules"] = modules
            write_status(run_dir, status)
        model = model_source(load_config(run_dir / CONFIG_FILE))
        if model:  # a packaged model converted from its file: that file's and the folder's sha256 (docs/models.md)
            status["provenance"][-1]["model"] = model
            write_status(run_dir, status)
        execute_run(run_dir)
    except BaseException as e:  # noqa: BLE001 - recorded, then re-raised
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit, Terminated))
        error = first_line(f"{type(e).__name__}: {e}") or type(e).__name__  # never empty: it starts with the name
        if gate is not None:
            gate.failed(error)
            # under SIGTERM Slurm's KillWait is short: look once, briefly, for a peer's error line
            peer = (
                gate.peer_failure(wait_s=1.0, count_dead=False)
                if interrupted
                else gate.peer_failure()
                if is_echo(error)
                else None
            )
            if peer:  # this rank only saw another one die: that one's line is the run's error
                interrupted, error = False, peer
        status.update(
            state="interrupted" if interrupted else "failed",
            error=error,
            traceback=traceback.format_exc(),
            duration_s=round(float(status.get("duration_s") or 0) + elapsed(t0), 3),
            finished=None if interrupted else now_iso(),
        )
        _record_end(run_dir, status)
        raise
    status.update(
        state="finished", finished=now_iso(), duration_s=round(float(status.get("duration_s") or 0) + elapsed(t0), 3)
    )
    write_status(run_dir, status)
    return status


def _job_tasks():
    """submitit's job environment of a job of several tasks; None for one task or outside a job (a test,
    `stare-lab train`): one process."""
    try:
        env = submitit.JobEnvironment()
    except RuntimeError:
        return None
    return env if env.num_tasks > 1 else None


def _run_task(run_dir: Path, env) -> dict[str, Any]:
    """One task of a job of several: a training rank (`run_rank`), or, in a server-mode run, one of the
    job's last tasks that `run.processes` leaves to the vLLM server (stare_lab.sweep.server_task)."""
    cfg = load_config(run_dir / CONFIG_FILE)
    training = int(cfg.run.get("processes") or env.num_tasks)
    served = is_server_run(cfg) and training < env.num_tasks
    key = attempt_key()
    if served and env.global_rank >= training:
        gate = RankGate(run_dir, key, env.global_rank, env.num_tasks)
        return server_task.serve_slot(run_dir, cfg, gate, env.local_rank, env.num_tasks // env.num_nodes, env.num_nodes)
    _export_world(training if served else env.num_tasks)  # else a mismatch is runner.execute's one-line refusal
    if served:
        os.environ.update(server_task.training_env(run_dir / RANKS_DIR / key, training))
    return run_rank(run_dir, env.global_rank, env.num_tasks, key)


def _export_world(training: int) -> None:
    """Export MASTER_ADDR/PORT, RANK, WORLD_SIZE and LOCAL_RANK from submitit's job environment for
    torch.distributed (accelerate reads them when TRL's config starts it; docs/distributed.md §5), with
    WORLD_SIZE the run's `training` processes (fewer than the job's tasks when a server keeps the last).
    CUDA_VISIBLE_DEVICES is left alone: accelerate selects cuda:LOCAL_RANK itself."""
    # overwrite: RANK/WORLD_SIZE inherited from the shell that ran `sweep run` are not this job's
    dist = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    if training < dist.world_size:
        os.environ["WORLD_SIZE"] = str(training)


def _device() -> str:
    import torch  # deferred: as in run_threads

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"cpu ({os.cpu_count()} cores)"


def _record_end(run_dir: Path, status: dict[str, Any]) -> None:
    # checkpoint() may have recorded `interrupted` already; a SystemExit from submitit's requeue
    # must not turn that into anything else.
    try:
        current = read_status(run_dir) or {}
        if current.get("state") == "interrupted" and status["state"] == "interrupted":
            status["requeued"] = current.get("requeued")
        write_status(run_dir, status)
    except OSError as e:  # e.g. the disk is full: say so; `sweep status` shows the run stalled
        print(f"stare-lab: could not record the run's end in {run_dir}: {e}", file=sys.stderr, flush=True)


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}: the job was cancelled, requeued or pre-empted")


@contextmanager
def _leave_on_sigterm() -> Iterator[None]:
    """SIGTERM raises Terminated (the run records itself interrupted on the way out); then the
    process leaves at once, exit status 143, without a submitit result."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except Terminated:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(143)
    finally:
        signal.signal(signal.SIGTERM, previous)


# What a run imports (the runner imports most of it lazily, at first use)
RUNNER_MODULES = (
    "stare_lab.run.runner",
    "stare_lab.training.trainer",
    "stare_lab.training.trl_loss",
    "stare_lab.training.tracking",
    "stare_lab.models",
    "stare_lab.tasks",
    "stare_lab.evaluation.run_eval",
    "stare_lab.evaluation",
    "stare_lab.viewer.wandb_export",
    "stare_lab.viewer.page",
    "stare_lab.viewer.figures",
)


def loaded_code() -> dict[str, Any]:
    """The provenance of the code a long-lived worker runs: it imports the runner's modules here,
    once, and runs them for every run it takes, whatever the checkout holds by then (a commit
    made during a sweep is not in this process)."""
    for module in RUNNER_MODULES:
        importlib.import_module(module)
    return provenance(_device())


class QueueWorker:
    """The local launcher's worker: `QueueWorker(threads)(run_dirs)` runs the runs still
    pending among `run_dirs`, in order, one at a time (`run_one(..., only_pending=True)`); a run
    another worker has claimed or taken meanwhile is passed over, so N workers given the same list
    share it out, never running a run twice. One process per worker slot rather than per run:
    its interpreter and imports (torch, transformers, TRL, W&B: ~5 s of CPU) and its exit are paid
    once, not by each of the demo's runs (every registered rule × 2 seeds). A run that fails is
    recorded failed by `run_one` and the next one goes on; SIGTERM records the current run
    interrupted and ends the worker."""

    def __init__(self, threads: WorkerThreads | int | None = None):
        self.threads = threads

    def __call__(self, run_dirs: list[str]) -> list[dict[str, Any]]:
        # SIGTERM leaves from the first line (a Ctrl-C while the worker still imports: submitit's own
        # handler would ignore it, and the worker would then take a run)
        with _leave_on_sigterm():
            start_worker(self.threads, decide=False)  # threads: at the start of each run (`_take`)
            code = loaded_code()
            # The ~0.5 M objects of those imports live as long as the worker: out of the collector's
            # reach, so that the full collections every run triggers (accelerate's free_memory at the
            # start of training, ~0.2 s each here) scan only the run's own objects. Numbers unchanged.
            gc.freeze()
            return [self._take(Path(run_dir), code) for run_dir in run_dirs]

    def _take(self, run_dir: Path, code: dict[str, Any] | None) -> dict[str, Any]:
        status = read_status(run_dir) or {}
        if status.get("state") != "pending":  # another worker has it: pass over without the claim's 2 s wait
            return {**status, "skipped": True}
        try:
            run_threads()  # the cores other jobs leave free now
            return run_one(run_dir, only_pending=True, code=code)
        except Exception:  # noqa: BLE001 - run_one recorded it in the run's status.json; the next run goes on
            traceback.print_exc()  # into this worker's submitit log as well
            return read_status(run_dir) or {}


class RunWorker(submitit.helpers.Checkpointable):
    """The submitit callable: `RunWorker(threads)(run_dir)`; requeued as itself on
    pre-emption/time-out."""

    def __init__(self, threads: WorkerThreads | int | None = None):
        self.threads = threads

    def __call__(self, run_dir: str) -> dict[str, Any]:
        # submitit ignores SIGTERM ("bypass") and leaves the job to Slurm's SIGKILL; a requeue
        # (`scontrol requeue`, pre-emption) would then record nothing until KillWait ends. Here
        # SIGTERM records the run interrupted and leaves at once, without a submitit result, so a
        # requeued job still counts as running and a cancelled one ends interrupted (resumable).
        with _leave_on_sigterm():
            start_worker(self.threads)
            tasks = _job_tasks()
            if tasks is None:
                return run_one(Path(run_dir))
            return _run_task(Path(run_dir), tasks)

    def checkpoint(self, run_dir: str, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # The trainer checkpoints every save_steps on its own; there is nothing more to dump here.
        try:
            update_status(
                Path(run_dir),
                state="interrupted",
                requeued=now_iso(),
                error="requeued by Slurm (pre-emption or time-out)",
            )
        except OSError:
            pass
        return submitit.helpers.DelayedSubmission(self, run_dir, *args, **kwargs)
