"""`sweep status`: the runs of a sweep by state, their Slurm job ids, each failure's first error line.

Reads only `<sweep folder>/manifest.json` (the runs the last `sweep run` planned) and each run's
status.json: no config is parsed and nothing heavy is imported, so 1,000 runs take milliseconds.
A `pending`/`running` run without a live worker (the policy of stare_lab.launchers.liveness.Liveness,
shared with `sweep run`) is shown as `stalled`: `sweep run` resumes it. A status.json that can not
be parsed is shown as `corrupt` with the problem; nothing is changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stare_lab.launchers.liveness import Liveness, read_manifest
from stare_lab.plan.lock import lock_held
from stare_lab.record import CORRUPT, STATUS_FILE, code_version, read_status

ORDER = ("running", "pending", "stalled", CORRUPT, "interrupted", "failed", "finished", "not started")


def collect(folder: Path, plan: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rows (one per run: id, label, state, attempts, job, duration, error) and the manifest.
    `plan`: the runs ({id, label}) of the sweep file as it is now; default: those of the last `sweep run`."""
    folder = Path(folder)
    manifest = read_manifest(folder) or {"runs": []}
    if plan is not None:
        manifest = {**manifest, "runs": plan}
    planned = {r["id"]: r for r in manifest["runs"]}
    ids = list(planned)
    if folder.is_dir():
        ids += sorted(
            e.name
            for e in os.scandir(folder)
            if e.is_dir() and e.name not in planned and os.path.exists(os.path.join(e.path, STATUS_FILE))
        )
    rows = []
    for run_id in ids:
        status = read_status(folder / run_id)
        meta = planned.get(run_id, {})
        s = status or {}
        rows.append(
            {
                "id": run_id,
                "label": s.get("label") or meta.get("label", ""),
                "planned": run_id in planned,
                "state": s.get("state") or "not started",
                "attempts": s.get("attempts", 0),
                "job": s.get("slurm_job_id"),
                "host": s.get("host"),
                "duration_s": s.get("duration_s"),
                "error": s.get("error"),
                "code": code_version(status),
                "_status": status,
            }
        )
    _mark_stalled(rows, folder)
    return {"rows": rows, "manifest": manifest, "folder": str(folder)}


def _mark_stalled(rows: list[dict[str, Any]], folder: Path) -> None:
    live_rows = [r for r in rows if r["state"] in ("running", "pending")]
    if not live_rows:
        return
    live = Liveness.probe([r["_status"] for r in live_rows], launcher_alive=lock_held(folder))
    for r in live_rows:
        if not live.alive(folder / r["id"], r["_status"]):
            r["state"] = "stalled"


def mixed_code_note(rows: list[dict[str, Any]]) -> str | None:
    """A warning when runs of one table came from different code (rows with a `code` key)."""
    codes: dict[str, int] = {}
    for r in rows:
        codes[r.get("code") or "unrecorded"] = codes.get(r.get("code") or "unrecorded", 0) + 1
    if len(codes) < 2:
        return None
    return (
        "warning: finished runs come from different code versions ("
        + ", ".join(f"{c}: {n} run{'s' * (n > 1)}" for c, n in sorted(codes.items()))
        + "); "
        "`sweep run --rerun-other-code` redoes those not from this checkout"
    )


def format_status(
    name: str,
    data: dict[str, Any],
    digest: str | None = None,
    show_all: bool = False,
    best: dict[str, Any] | None = None,
) -> str:
    rows, manifest = data["rows"], data["manifest"]
    if not rows:
        return f"sweep {name!r}: not started (no runs under the sweep folder)"
    counts = {s: sum(1 for r in rows if r["state"] == s) for s in ORDER}
    lines = [f"sweep {name!r}: {len(rows)} runs — " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)]
    if digest and manifest.get("digest") and manifest["digest"] != digest:
        lines.append("note: the sweep file changed since the last `sweep run`; run it again to launch the new plan")
    mixed = mixed_code_note([r for r in rows if r["state"] == "finished"])
    if mixed:
        lines.append(mixed)
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
            extra = [
                f"job {r['job']}" if r["job"] else None,
                f"attempts {r['attempts']}" if r["attempts"] else None,
                f"{r['duration_s']:.0f}s" if r.get("duration_s") else None,
                "not in the current plan" if not r["planned"] and manifest["runs"] else None,
            ]
            line = f"  {r['label']:<{width}}  {r['id']}  " + "  ".join(x for x in extra if x)
            if state in ("failed", "interrupted", "stalled", CORRUPT) and r["error"]:
                line += f"\n  {'':<{width}}  error: {r['error']}"
            lines.append(line)
    stale = [r for r in rows if not r["planned"]] if manifest["runs"] else []
    if stale:
        folder = Path(data.get("folder", "."))
        paths = " ".join(str(folder / r["id"]) for r in stale)
        lines.append(
            f"\n{len(stale)} run(s) not in the current plan (an earlier grid): `table`, `plot` and `view` leave them "
            f"out (--all-runs shows them); to remove them: rm -r {paths}"
        )
    if best is not None:
        params = " ".join(f"{k}={v}" for k, v in best["params"].items())
        lines.append(
            f"\nbest trial: #{best['number']} value={best['value']:.6g} {params} (run {best['run_id']}; "
            f"{best['n_trials']} trials in the study)"
        )
    return "\n".join(lines)
