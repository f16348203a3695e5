"""The one liveness policy of `sweep run` and `sweep status`, and the sweep manifest.

The run record itself (status.json, metrics, checkpoints, eval) lives in stare_lab.record. This
module answers "is someone still working on this run?" with one batched Slurm query per look
(`Liveness.probe`: submitit's own `sacct` query, for every job at once) and one policy
(`Liveness.alive`):

1. a finished, failed or interrupted run has no worker;
2. a run whose claim (`<run_dir>/.claim`, flock'ed by its worker) is held has one, wherever that
   worker runs, as far as the filesystem's locks reach;
3. a run with a Slurm job id has one while Slurm's accounting lists the job in a live state
   (pending, requeued, running); when Slurm does not answer we do not guess: alive;
4. a run with a pid on this host (its worker, or the local job that will start it) has one
   while that process exists with the same start time;
5. a pid on another host without Slurm is judged by its claim alone (rule 2): without it, dead;
6. a pending run with neither has one while the `sweep run` that queued it holds the sweep lock.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stare_lab.core.utils import atomic_write_json
from stare_lab.record import claim_held, now_iso

MANIFEST_FILE = "manifest.json"
LIVE = ("pending", "running")
# Slurm states of a job that will not run again (anything else is queued, running or requeued)
SLURM_ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)


def process_start(pid: int) -> str | None:
    """The kernel's start time of a process (field 22 of /proc/PID/stat): tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie is dead, only not reaped


def slurm_states(job_ids: Iterable[str]) -> dict[str, str] | None:
    """The states of these Slurm jobs, one batched `sacct` call (submitit's SlurmInfoWatcher's
    query and parser: one `-j` per job, an array's tasks as `A_i`): {job id: state}. A task of an
    array accounting lists, missing itself, is PENDING: it is leaving the array's pending range (a
    started task gets a record of its own, which reaches accounting a moment later). A job accounting
    does not list at all yet is asked of the controller (`squeue_states`: slurmdbd records a job
    some seconds after its submission), so a look is one sacct, plus one squeue only right after a
    submission; a job neither lists is absent (ended long ago, or never this cluster's). Empty where
    Slurm is not installed (no job of this machine's can be alive); None when sacct or squeue does
    not answer (a busy controller or database)."""
    job_ids = [str(job) for job in job_ids if job]
    ids = sorted({job.split("_")[0] for job in job_ids})
    if not ids:
        return {}
    command = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]
    for job in ids:
        command += ["-j", job]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return {}
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    from submitit.slurm.slurm import SlurmInfoWatcher  # deferred: submitit, asked only on a Slurm sweep

    states = {job: info.get("State", "") for job, info in SlurmInfoWatcher().read_info(out.stdout).items()}
    arrays = {job.split("_")[0] for job in states}
    for job in set(job_ids) - set(states):
        if "_" in job and job.split("_")[0] in arrays:  # a task leaving the array's pending range: its own
            states[job] = "PENDING"  # record reaches accounting a moment later (seen every few looks)
    missing = sorted(set(job_ids) - set(states))
    if missing:  # accounting lags the controller: a job submitted a moment ago is not in sacct yet
        queued = squeue_states(missing)
        if queued is None:
            return None
        states.update(queued)
    return states


def squeue_states(job_ids: list[str]) -> dict[str, str] | None:
    """{job id: state} of these jobs as the controller lists them (`squeue`, an array's tasks one by
    one): the live jobs that accounting does not list yet. A job it does not know is absent (ended);
    None when squeue does not answer."""
    ids = ",".join(sorted({job.split("_")[0] for job in job_ids}))
    try:
        out = subprocess.run(
            ["squeue", "--array", "--noheader", "--format=%i|%T", f"--jobs={ids}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        return {}
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # squeue refuses a list of only unknown ids (purged after MinJobAge: ended long ago)
        return {} if "Invalid job id" in out.stderr else None
    states = {}
    for line in out.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job:
            states[job] = state
    return states


@dataclass(frozen=True)
class Liveness:
    """One look at the workers of a set of runs (see the module docstring for the policy)."""

    host: str
    slurm: dict[str, str] | None  # sacct's answer; None: not asked or no answer
    launcher_alive: bool  # the `sweep run` that queued pending runs still runs

    @classmethod
    def probe(
        cls, statuses: Iterable[dict[str, Any] | None], launcher_alive: bool = False, job_ids: Iterable[str] = ()
    ) -> Liveness:
        """Slurm is asked once, about the jobs live records name and `job_ids` (a launch's jobs)."""
        ids = [s["slurm_job_id"] for s in statuses if s and s.get("state") in LIVE and s.get("slurm_job_id")]
        ids += [str(job) for job in job_ids]
        return cls(socket.gethostname(), slurm_states(ids) if ids else None, launcher_alive)

    def slurm_job_live(self, job_id: str) -> bool:
        if self.slurm is None:
            return True
        state = self.slurm.get(str(job_id))
        if not state:
            return False
        return state.split()[0] not in SLURM_ENDED

    def alive(self, run_dir: Path, status: dict[str, Any] | None) -> bool:
        if not status or status.get("state") not in LIVE:
            return False
        if claim_held(run_dir):
            return True
        if status.get("slurm_job_id"):
            return self.slurm_job_live(status["slurm_job_id"])
        if status.get("pid"):
            if status.get("host") != self.host:
                return False
            return process_start(int(status["pid"])) == status.get("pid_start")
        return status.get("state") == "pending" and self.launcher_alive


def self_identity() -> dict[str, Any]:
    """host, pid and Slurm ids of the current process (the worker)."""
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
        "slurm_job_id": job,
        "restarts": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
    }


def write_manifest(folder: Path, sweep: str, digest: str, runs: list[dict[str, Any]], launcher: str) -> None:
    """The runs a `sweep run` planned: what `sweep status` lists without expanding the sweep again."""
    atomic_write_json(
        Path(folder) / MANIFEST_FILE,
        {"sweep": sweep, "digest": digest, "launcher": launcher, "written": now_iso(), "runs": runs},
    )


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / MANIFEST_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
