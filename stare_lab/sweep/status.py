"""`sweep status`: the runs of a sweep by state, their Slurm job ids, each failure's first error line.

Reads only `<sweep folder>/manifest.json` (the runs the last `sweep run` planned) and each run's
status.json: no config is parsed and nothing heavy is imported, so 1,000 runs take milliseconds.
A `running` run whose worker is gone (no live PID on this host, Slurm no longer has the job) is
shown as `stalled`: `sweep run` resumes it.
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from stare_lab.sweep.records import STATUS_FILE, process_start, read_manifest, read_status

ORDER = ("running", "pending", "stalled", "interrupted", "failed", "finished", "not started")


def collect(folder: Path) -> dict[str, Any]:
    """Rows (one per run: id, label, state, attempts, job, duration, error) and the manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder) or {"runs": []}
    planned = {r["id"]: r for r in manifest["runs"]}
    ids = list(planned)
    if folder.is_dir():
        ids += sorted(e.name for e in os.scandir(folder)
                      if e.is_dir() and e.name not in planned and os.path.exists(os.path.join(e.path, STATUS_FILE)))
    rows = []
    for run_id in ids:
        status = read_status(folder / run_id)
        meta = planned.get(run_id, {})
        rows.append({"id": run_id, "label": (status or {}).get("label") or meta.get("label", ""),
                     "planned": run_id in planned, "state": (status or {}).get("state") or "not started",
                     "attempts": (status or {}).get("attempts", 0), "job": (status or {}).get("slurm_job_id"),
                     "host": (status or {}).get("host"), "duration_s": (status or {}).get("duration_s"),
                     "error": (status or {}).get("error"), "_status": status})
    _mark_stalled(rows, folder)
    return {"rows": rows, "manifest": manifest}


def _mark_stalled(rows: list[dict[str, Any]], folder: Path) -> None:
    running = [r for r in rows if r["state"] in ("running", "pending") and r["_status"]]
    if not running:
        return
    active_jobs = _slurm_jobs() if any(r["job"] for r in running) else None
    host = socket.gethostname()
    launcher_alive = lock_held(folder)
    for r in running:
        s = r["_status"]
        if r["job"]:
            alive = True if active_jobs is None else r["job"] in active_jobs  # Slurm unreachable: don't guess
        elif s.get("pid") and s.get("host") == host:
            alive = process_start(int(s["pid"])) == s.get("pid_start")
        elif s.get("pid"):
            alive = True  # a worker on another host without Slurm: can not be checked from here
        else:
            alive = launcher_alive  # queued by a launcher that has not started it yet
        if not alive:
            r["state"] = "stalled"


def lock_held(folder: Path) -> bool:
    """Whether a `sweep run` holds the sweep's lock right now (probed without waiting)."""
    import fcntl

    from stare_lab.sweep.lock import LOCK_FILE

    try:
        fd = os.open(Path(folder) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _slurm_jobs() -> set[str] | None:
    """Ids of the jobs Slurm still queues or runs (array tasks as A_i and A), None if unknown."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %A"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return set(out.stdout.split())


def format_status(name: str, data: dict[str, Any], digest: str | None = None, show_all: bool = False,
                  best: dict[str, Any] | None = None) -> str:
    rows, manifest = data["rows"], data["manifest"]
    if not rows:
        return f"sweep {name!r}: not started (no runs under the sweep folder)"
    counts = {s: sum(1 for r in rows if r["state"] == s) for s in ORDER}
    lines = [f"sweep {name!r}: {len(rows)} runs — " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)]
    if digest and manifest.get("digest") and manifest["digest"] != digest:
        lines.append("note: the sweep file changed since the last `sweep run`; run it again to launch the new plan")
    width = max(len(r["label"]) for r in rows)
    for state in ORDER:
        group = [r for r in rows if r["state"] == state]
        if not group:
            continue
        if state == "finished" and not show_all and len(group) > 20:
            lines.append(f"\nfinished: {len(group)} runs (--all lists them)")
            continue
        lines.append(f"\n{state} ({len(group)}):")
        for r in group:
            extra = [f"job {r['job']}" if r["job"] else None,
                     f"attempts {r['attempts']}" if r["attempts"] else None,
                     f"{r['duration_s']:.0f}s" if r.get("duration_s") else None,
                     "not in the current plan" if not r["planned"] and manifest["runs"] else None]
            line = f"  {r['label']:<{width}}  {r['id']}  " + "  ".join(x for x in extra if x)
            if state in ("failed", "interrupted", "stalled") and r["error"]:
                line += f"\n  {'':<{width}}  error: {r['error']}"
            lines.append(line)
    if best is not None:
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        lines.append(f"\nbest trial: #{best['number']} value={best['value']:.6g} {params} (run {best['run_id']}; "
                     f"{best['n_trials']} trials in the study)")
    return "\n".join(lines)
