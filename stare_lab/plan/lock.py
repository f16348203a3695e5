"""One `sweep run` at a time per sweep: an flock on `<sweep folder>/.lock`.

The kernel drops an flock when its holder dies (even by SIGKILL), so a crash never leaves the
sweep locked. Python opens files non-inheritable, so the worker processes the launcher starts do
not hold it. The file also records who holds it, for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

from stare_lab.launchers.errors import SweepError
from stare_lab.record import flock_held, now_iso

LOCK_FILE = ".lock"


class SweepLock:
    def __init__(self, folder: Path, sweep: str):
        self.path = Path(folder) / LOCK_FILE
        self.sweep = sweep
        self._fd: int | None = None

    def acquire(self) -> SweepLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise SweepError(f"sweep {self.sweep!r} is already running ({holder}); lock: {self.path}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": now_iso()}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SweepLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        h = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {h['pid']} on {h['host']} since {h['since']}"
    except (ValueError, KeyError):
        return "holder unknown"


def lock_held(folder: Path) -> bool:
    """Whether a `sweep run` holds the sweep's lock right now (probed without waiting)."""
    return flock_held(Path(folder) / LOCK_FILE)
