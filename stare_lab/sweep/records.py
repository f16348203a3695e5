"""Sweep-level records and the one liveness policy of `sweep run` and `sweep status`.

The run record itself (status.json, metrics, checkpoints, eval) lives in stare_lab.record. This
module keeps the sweep manifest and answers "is someone still working on this run?" with one
batched Slurm query per look (`Liveness.probe`) and one policy (`Liveness.alive`):

1. a finished, failed or interrupted run has no worker;
2. a run whose claim (`<run_dir>/.claim`, flock'ed by its worker) is held has one, wherever that
   worker runs, as far as the filesystem's locks reach;
3. a run with a Slurm job id has one while Slurm lists the job in a live state (pending,
   requeued, running); when Slurm does not answer we do not guess: alive;
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

from stare_lab.record import claim_held, new_status, now_iso  # noqa: F401 - new_status: benchmarks/sweep_scale.py
from stare_lab.utils import atomic_write_json

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


def slurm_states() -> dict[str, str] | None:
    """Every job Slurm still knows, one squeue call: {job id: state}, array tasks as `A_i`.
    Empty where Slurm is not installed (no job of this machine's can be alive); None when
    squeue does not answer (a busy controller)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "--states=all", "-o", "%i %T"], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        return {}
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


@dataclass(frozen=True)
class Liveness:
    """One look at the workers of a set of runs (see the module docstring for the policy)."""

    host: str
    slurm: dict[str, str] | None  # squeue's answer; None: not asked or no answer
    launcher_alive: bool  # the `sweep run` that queued pending runs still runs

    @classmethod
    def probe(
        cls, statuses: Iterable[dict[str, Any] | None], launcher_alive: bool = False, ask_slurm: bool = False
    ) -> Liveness:
        """Slurm is asked once, when a live record names a job (or `ask_slurm`)."""
        ask_slurm = ask_slurm or any(s and s.get("state") in LIVE and s.get("slurm_job_id") for s in statuses)
        return cls(socket.gethostname(), slurm_states() if ask_slurm else None, launcher_alive)

    def slurm_job_live(self, job_id: str) -> bool:
        if self.slurm is None:
            return True
        state = self.slurm.get(str(job_id))
        return state is not None and state.split()[0] not in SLURM_ENDED

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
