"""Run records on disk (docs/run_record.md): status.json, the sweep manifest, and liveness.

status.json is written atomically (temp file + rename) by the launcher (pending, with the Slurm
job id once submitted) and by the worker (running, finished, failed, interrupted). Beyond the
contract's keys it keeps `label`, `variant`, `seed`, `pid`, `pid_start` and `restarts` so that
`sweep status` never parses a config and a re-run can tell a live worker from a dead one.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stare_lab.utils import atomic_write_json

STATUS_FILE = "status.json"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
STATES = ("pending", "running", "finished", "failed", "interrupted")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_status(run_dir: Path, status: dict[str, Any]) -> dict[str, Any]:
    atomic_write_json(Path(run_dir) / STATUS_FILE, status)
    return status


def new_status(label: str | None = None, variant: str | None = None, seed: int | None = None) -> dict[str, Any]:
    return {"state": "pending", "attempts": 0, "host": None, "slurm_job_id": None, "created": now_iso(),
            "started": None, "finished": None, "duration_s": 0.0, "error": None, "traceback": None,
            "label": label, "variant": variant, "seed": seed, "pid": None, "pid_start": None, "restarts": 0}


def update_status(run_dir: Path, **changes: Any) -> dict[str, Any]:
    status = read_status(run_dir) or new_status()
    status.update(changes)
    return write_status(run_dir, status)


def process_start(pid: int) -> str | None:
    """The kernel's start time of a process (field 22 of /proc/PID/stat): tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie is dead, only not reaped


def slurm_active(job_id: str) -> bool | None:
    """True while Slurm still runs or queues the job, False once it ended, None if Slurm can't say."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return False if "Invalid job id" in out.stderr else None
    return bool(out.stdout.strip())


def holder_alive(status: dict[str, Any]) -> bool:
    """Whether the worker or job recorded in a pending/running status may still be working on it.

    A Slurm job is asked about (queued, running or requeued counts as alive); a local worker is
    alive when its PID on this host still exists with the same start time. A record from another
    host without a Slurm job can not be checked and counts as dead (its launcher lock is gone).
    """
    if status.get("state") not in ("pending", "running"):
        return False
    job = status.get("slurm_job_id")
    if job:
        return bool(slurm_active(job))
    pid = status.get("pid")
    if pid and status.get("host") == socket.gethostname():
        return process_start(int(pid)) == status.get("pid_start")
    return False


def write_manifest(folder: Path, sweep: str, digest: str, runs: list[dict[str, Any]], launcher: str) -> None:
    """The runs a `sweep run` planned: what `sweep status` lists without expanding the sweep again."""
    atomic_write_json(Path(folder) / MANIFEST_FILE, {"sweep": sweep, "digest": digest, "launcher": launcher,
                                                     "written": now_iso(), "runs": runs})


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / MANIFEST_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def first_line(text: str | None) -> str | None:
    if not text:
        return text
    return text.strip().splitlines()[0] if text.strip() else None


def elapsed(since: float) -> float:
    return round(time.time() - since, 3)


def self_identity() -> dict[str, Any]:
    """host, pid and Slurm ids of the current process (the worker)."""
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
            "slurm_job_id": job, "restarts": int(env.get("SLURM_RESTART_COUNT", "0") or 0)}
