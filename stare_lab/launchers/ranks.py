"""The ranks of one multi-process run: who keeps the record, and how a rank's death is told.

A run of N processes is one submitit job of N tasks (local `processes`, Slurm `nodes` ×
`tasks_per_node`). Every task calls `RunWorker`; rank 0 alone takes the run's claim and keeps
status.json, metrics.jsonl and the W&B run. Ranks meet in `<run_dir>/.ranks/<attempt>/`, where
<attempt> is the job id and Slurm's restart count (a requeued job is a new attempt):

- `go.json`, written by rank 0 once it holds the claim (or knows the run must not start: claimed
  by another worker, already finished). The other ranks wait for it at most GO_WAIT_S before
  starting torch.distributed, so a run that rank 0 does not start never leaves them waiting in a
  rendezvous, and no rank is taken for a second worker.
- `rank-<r>.json`: each rank's host, pid and rendezvous (MASTER_ADDR:PORT and the address it
  resolves to) at start, and its first error line when it fails. While the rank lives, a daemon
  thread touches the file every HEARTBEAT_S (its mtime is the heartbeat). When rank 0's own error
  is only the echo of a peer's death (a closed gloo/NCCL connection, a timed-out collective, or
  SIGTERM from Slurm's --kill-on-bad-exit), the run's error is the first failed rank's line instead
  (with its node when that is not rank 0's); a rank that died without a line (SIGKILL, OOM killer,
  its node lost) is named with its pid, its node when it ran on another one, and the step: on rank
  0's node by its pid, on another node by a heartbeat that stopped for STALE_S (watched from rank
  0's clock, so the nodes' clocks need not agree; the run folder is on a filesystem every node sees).

Rendezvous itself is submitit's job environment (`TorchDistributedEnvironment().export`): see
docs/distributed.md §5.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from stare_lab.core.utils import atomic_write_text
from stare_lab.launchers.liveness import process_start
from stare_lab.record import first_line, read_json, read_metrics

RANKS_DIR = ".ranks"
# Non-zero ranks wait this long for rank 0 to take the claim (it does so within seconds of start).
GO_WAIT_S = 300.0
# Rank 0, failing, waits this long for a peer's error line to land (the peer fails at the same moment).
PEER_WAIT_S = 5.0
# A rank touches its file this often; one on another node whose file stayed untouched for STALE_S is dead.
HEARTBEAT_S = 0.5
STALE_S = 3.0
# Rank 0 errors that only echo a peer's death: the run's error is then the peer's line.
ECHOES = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "received sigterm",
    "nccl",
    "gloo",
    "socket",
    "terminated",
    "watchdog",
)


def attempt_key() -> str:
    """This job attempt: submitit's job id, plus Slurm's restart count (requeues keep the id)."""
    import submitit  # deferred: submitit, asked only inside a job

    env = submitit.JobEnvironment()
    return f"{env.job_id}-{os.environ.get('SLURM_RESTART_COUNT', '0') or '0'}"


class RankGate:
    """The rank files of one attempt of one run (see the module docstring)."""

    def __init__(self, run_dir: Path | str, key: str, rank: int, world: int):
        self.dir = Path(run_dir) / RANKS_DIR / key
        self.rank, self.world = rank, world

    def started(self) -> None:
        self._write_rank({"host": socket.gethostname(), "pid": os.getpid(), "error": None, **_rendezvous()})
        _Heartbeat.follow(self.dir / f"rank-{self.rank}.json")

    def failed(self, error: str) -> None:
        self._write_rank({**(self._read_rank(self.rank) or {}), "error": first_line(error), "time": time.time()})

    def open(self, go: bool, reason: str = "") -> None:
        """Rank 0: let the other ranks start (go) or leave (not go, with the reason)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.dir / "go.json", json.dumps({"go": go, "reason": reason}))

    def wait_open(self, timeout_s: float = GO_WAIT_S) -> tuple[bool, str]:
        """A non-zero rank: (go, reason) from rank 0, or RuntimeError after `timeout_s`."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            data = read_json(self.dir / "go.json")
            if data is not None:
                return bool(data.get("go")), str(data.get("reason") or "")
            time.sleep(0.2)
        raise RuntimeError(f"rank {self.rank}: rank 0 did not start the run within {timeout_s:.0f} s")

    def peer_failure(self, wait_s: float = PEER_WAIT_S, count_dead: bool = True) -> str | None:
        """'rank r: <first error line>' of the first failed other rank, or (`count_dead`) one that
        died without a line: on this host by its pid, on another by its stopped heartbeat (then at
        least STALE_S is waited); None when every other rank is alive and quiet. Under SIGTERM (a
        requeue or cancel reaches every rank) a rank gone without a line is not a failure."""
        here = socket.gethostname()
        deadline = time.monotonic() + wait_s
        beats: dict[int, tuple[float | None, float]] = {}  # rank: (mtime seen, when first seen so)
        while True:
            now = time.monotonic()
            dead = None
            errors = []
            for r in range(self.world):
                if r == self.rank:
                    continue
                info = self._read_rank(r) or {}
                if info.get("error"):
                    node = f" on {info['host']}" if info.get("host") and info["host"] != here else ""
                    errors.append((info.get("time") or 0, r, node, info["error"]))
                    continue
                if not count_dead or dead is not None or not info.get("pid"):
                    continue
                if info.get("host") == here:
                    if _dead_here(info):
                        dead = (
                            f"rank {r} (pid {info['pid']}) died without an error line{self._at_step()} "
                            "(killed by a signal or out of memory)"
                        )
                    continue
                if r not in beats:  # a rank on another node: its heartbeat needs STALE_S to tell
                    deadline = max(deadline, now + STALE_S + 2 * HEARTBEAT_S)
                mtime = _mtime(self.dir / f"rank-{r}.json")
                seen, since = beats.get(r, (None, now))
                if mtime != seen:
                    beats[r] = (mtime, now)
                elif now - since >= STALE_S:
                    dead = (
                        f"rank {r} on {info.get('host')} (pid {info['pid']}) died without an error line"
                        f"{self._at_step()} (no heartbeat for {now - since:.0f} s: its node or its process was lost)"
                    )
            if errors:
                _, r, node, line = min(errors)
                return f"rank {r}{node}: {line}"
            if dead or now >= deadline:
                return dead
            time.sleep(0.2)

    def _at_step(self) -> str:
        """' at step N': the step rank 0 was in (one past the last row of the run's metrics.jsonl)."""
        try:
            rows = read_metrics(self.dir.parent.parent)
        except (OSError, ValueError):
            return ""
        return f" at step {max((int(r.get('step') or 0) for r in rows), default=0) + 1}"

    def _write_rank(self, data: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.dir / f"rank-{self.rank}.json", json.dumps(data))

    def _read_rank(self, r: int) -> dict[str, Any] | None:
        return read_json(self.dir / f"rank-{r}.json")


def is_echo(error: str) -> bool:
    """Whether rank 0's error line only reports a peer's death (see ECHOES)."""
    low = error.lower()
    return any(e in low for e in ECHOES)


def _rendezvous() -> dict[str, Any]:
    """This rank's torch rendezvous as exported (stare_lab.sweep.worker) and the address MASTER_ADDR resolves to."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr:
        return {}
    try:
        resolved = socket.gethostbyname(addr)
    except OSError:
        resolved = None
    return {"master": f"{addr}:{port}", "master_ip": resolved}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class _Heartbeat:
    """One daemon thread per process touching the rank file of the gate this process started last
    (a rank is one process; tests start several gates in one)."""

    lock = threading.Lock()
    path: Path | None = None
    thread: threading.Thread | None = None

    @classmethod
    def follow(cls, path: Path) -> None:
        with cls.lock:
            cls.path = path
            if cls.thread is None or not cls.thread.is_alive():
                cls.thread = threading.Thread(target=cls._beat, name="stare-lab-rank-heartbeat", daemon=True)
                cls.thread.start()

    @classmethod
    def _beat(cls) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            path = cls.path
            try:
                if path is not None:
                    os.utime(path)
            except OSError:
                pass


def _dead_here(info: dict[str, Any]) -> bool:
    return (
        bool(info.get("pid")) and info.get("host") == socket.gethostname() and process_start(int(info["pid"])) is None
    )


def latest_peer_failure(run_dir: Path | str) -> str | None:
    """The first error line any rank wrote in the newest attempt of a run (for a job that ended
    without its rank 0 recording anything)."""
    root = Path(run_dir) / RANKS_DIR
    attempts = (
        sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime) if root.is_dir() else []
    )
    if not attempts:
        return None
    errors = []
    for f in attempts[-1].glob("rank-*.json"):
        info = read_json(f) or {}
        if info.get("error"):
            errors.append((info.get("time") or 0, f.stem.replace("-", " "), info["error"]))
    return f"{min(errors)[1]}: {min(errors)[2]}" if errors else None
