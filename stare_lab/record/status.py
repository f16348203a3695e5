"""A run's status.json (its state, attempts, host, error; docs/run_record.md) and its claim, the flock
that the one worker executing the run holds. A status.json that can not be parsed reads as the
`corrupt` state naming the problem, never as a run not started, and is set aside when rewritten."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from stare_lab.core.utils import atomic_write_json
from stare_lab.record.files import CLAIM_FILE, CONFIG_FILE, STATUS_FILE, now_iso, set_aside

STATES = ("pending", "running", "finished", "failed", "interrupted")
CORRUPT = "corrupt"  # read_status's state for a status.json it can not parse


def new_status(label: str | None = None, variant: str | None = None, seed: int | None = None) -> dict[str, Any]:
    return {
        "state": "pending",
        "attempts": 0,
        "host": None,
        "slurm_job_id": None,
        "created": now_iso(),
        "started": None,
        "finished": None,
        "duration_s": 0.0,
        "error": None,
        "traceback": None,
        "label": label,
        "variant": variant,
        "seed": seed,
        "pid": None,
        "pid_start": None,
        "restarts": 0,
    }


def read_status(run_dir: Path | str) -> dict[str, Any] | None:
    """status.json, None when there is none, or `{"state": "corrupt", "error": ...}` when it can
    not be parsed (a run with a garbled record must not look like one never started)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        return {"state": CORRUPT, "error": f"{path}: unreadable ({e})"}
    try:
        status = json.loads(text)
    except ValueError as e:
        return {"state": CORRUPT, "error": f"{path}: not JSON ({e})"}
    if not isinstance(status, dict) or status.get("state") not in STATES:
        return {"state": CORRUPT, "error": f"{path}: no valid state in {text[:60]!r}"}
    return status


def write_status(run_dir: Path | str, status: dict[str, Any]) -> dict[str, Any]:
    """Atomically; on a full disk (no room for the temp file), a compact record without the
    traceback is written over the old file in place, which needs no new blocks."""
    path = Path(run_dir) / STATUS_FILE
    try:
        atomic_write_json(path, status)
    except OSError as e:
        if e.errno != errno.ENOSPC or not path.is_file():
            raise
        compact = json.dumps({**status, "traceback": None}, separators=(",", ":")).encode()
        if len(compact) > path.stat().st_size:
            raise
        with open(path, "r+b") as f:
            f.write(compact)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    return status


def update_status(run_dir: Path | str, **changes: Any) -> dict[str, Any]:
    status = read_status(run_dir)
    if status is not None and status.get("state") == CORRUPT:
        set_aside(Path(run_dir) / STATUS_FILE)  # kept beside the new record, never overwritten
        status = None
    status = status or new_status()
    status.update(changes)
    return write_status(run_dir, status)


# ------------------------------------------------------------------------------------ claim
class RunClaim:
    """The one worker executing a run holds an exclusive flock on `<run_dir>/.claim`.

    The kernel drops it when the holder dies (SIGKILL included), and on a filesystem whose locks
    reach every host (local disk, NFSv4, Lustre mounted with `flock`) other hosts see it too.
    Whoever holds it may train; anyone else only watches.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / CLAIM_FILE
        self._fd: int | None = None

    def acquire(self, wait_s: float = 2.0) -> bool:
        """Take the claim; False if another process holds it. The short wait covers `claim_held`,
        which takes a shared lock for a moment to look."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.time() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.time() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def claim_held(run_dir: Path | str) -> bool:
    """Whether a live process holds the run's claim (probed without waiting)."""
    return flock_held(Path(run_dir) / CLAIM_FILE)


def flock_held(path: Path) -> bool:
    """Whether a live process holds an flock on `path` (probed with a shared lock, without waiting)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def run_label(run_dir: Path | str) -> str:
    """The run's readable label (config.yaml's run.label, e.g. `stare seed=0`), else its id or folder name."""
    run_dir = Path(run_dir)
    try:
        run = (yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}).get("run") or {}
        return str(run.get("label") or run.get("id") or run_dir.name)
    except (OSError, yaml.YAMLError, AttributeError):
        return run_dir.name
