"""What `sweep run` does with each run, and the records it writes before starting them.

`plan_runs` decides per run: a finished run is skipped (noting runs finished by other code), an
interrupted one (or one without a live worker: stare_lab.launchers.liveness.Liveness) resumes, a
failed or corrupt one is retried only with `retry_failed`, and one whose worker or job is alive
is watched. `prepare` writes a run's config.yaml and a pending status.json. The caller holds the
sweep lock. `current_runs` is the plan as the reading commands see it (table, plot, view): the runs
the sweep file gives now.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from stare_lab.core.utils import atomic_write_text
from stare_lab.launchers.errors import SweepError
from stare_lab.launchers.liveness import Liveness, read_manifest
from stare_lab.launchers.run_spec import RunSpec
from stare_lab.methods.outside import current_rule_modules
from stare_lab.methods.registry import rule_module
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import SweepSpec
from stare_lab.record import (
    CONFIG_FILE,
    CORRUPT,
    STATUS_FILE,
    code_version,
    new_status,
    provenance,
    read_status,
    set_aside,
    write_status,
)


@dataclass
class Plan:
    start: list[tuple[RunSpec, str]] = field(default_factory=list)  # (run, "new" | "resume" | "retry" | "rerun")
    finished: list[RunSpec] = field(default_factory=list)
    failed: list[RunSpec] = field(default_factory=list)  # left alone without retry_failed
    corrupt: list[RunSpec] = field(default_factory=list)  # unreadable status.json, left alone
    active: list[RunSpec] = field(default_factory=list)  # a live worker or job has it
    other_code: dict[str | None, int] = field(default_factory=dict)  # code version (None: unrecorded) → runs kept
    current_code: str | None = None

    def summary(self) -> str:
        kinds = {k: sum(1 for _, r in self.start if r == k) for k in ("new", "resume", "retry", "rerun")}
        parts = [
            f"{len(self.start)} to run ({', '.join(f'{v} {k}' for k, v in kinds.items() if v) or 'none'})",
            f"{len(self.finished)} finished (skipped)",
        ]
        if self.failed:
            parts.append(f"{len(self.failed)} failed (skipped; --retry-failed retries them)")
        if self.corrupt:
            parts.append(
                f"{len(self.corrupt)} with an unreadable status.json (skipped; `sweep status` names "
                "them, --retry-failed sets the file aside and resumes them)"
            )
        if self.active:
            parts.append(f"{len(self.active)} still running from an earlier launch (watched)")
        if self.other_code:
            versions = ", ".join(f"{v or 'unrecorded'}: {n}" for v, n in sorted(self.other_code.items(), key=str))
            parts.append(
                f"note: {sum(self.other_code.values())} finished run(s) came from other code than "
                f"{self.current_code} ({versions}); --rerun-other-code redoes them"
            )
        return "; ".join(parts)


def plan_runs(runs: list[RunSpec], retry_failed: bool = False, rerun_other_code: bool = False) -> Plan:
    """What to do with each run; the caller holds the sweep lock, so no other launcher is alive.
    A finished run whose last attempt ran other code than this checkout is kept (and counted in
    `other_code`) unless `rerun_other_code`."""
    own = provenance()
    plan = Plan(current_code=code_version(own))
    statuses = [read_status(run.run_dir) for run in runs]
    live = Liveness.probe(statuses, launcher_alive=False)
    for run, status in zip(runs, statuses, strict=True):
        state = status.get("state") if status else None
        if not status or state is None:
            plan.start.append((run, "new"))
        elif state == "finished":
            code = code_version(status)
            modules = current_rule_modules(run.config, rule_module(run.config["method"]["name"]))
            if code == code_version({**own, "rule_modules": modules}):
                plan.finished.append(run)
            elif rerun_other_code:
                plan.start.append((run, "rerun"))
            else:
                plan.finished.append(run)
                plan.other_code[code] = plan.other_code.get(code, 0) + 1
        elif state in ("failed", CORRUPT):
            (
                plan.start.append((run, "retry"))
                if retry_failed
                else (plan.failed if state == "failed" else plan.corrupt).append(run)
            )
        elif live.alive(run.run_dir, status):
            plan.active.append(run)
        else:
            plan.start.append((run, "resume" if status.get("attempts") else "new"))
    return plan


def current_runs(spec: SweepSpec) -> list[tuple[str, Path]]:
    """(label, run folder) of every run of the sweep's current plan, in expansion order: those its
    last `sweep run` wrote in the folder's manifest when the sweep file has not changed since (the
    manifest keeps the file's digest; `sweep status` lists the same runs), else the file expanded
    again (Hydra composes every run: ~0.3 s of a table's start)."""
    manifest = read_manifest(spec.folder) or {}
    if manifest.get("digest") and manifest.get("digest") == spec.digest and manifest.get("runs"):
        return [(str(r["label"]), spec.folder / str(r["id"])) for r in manifest["runs"]]
    return [(r.label, r.run_dir) for r in expand_sweep(spec)]


def check_output(spec: SweepSpec) -> None:
    """The sweep folder can be created and written, or one line saying why not."""
    folder = spec.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise SweepError(
            f"{spec.where()}: output: can not write the sweep folder {folder}: {e.strerror or e}"
        ) from None


def prepare(run: RunSpec, fresh: bool = False) -> None:
    """config.yaml and a pending status.json (keeping attempts and timings of earlier tries; an
    unreadable status.json is set aside, never overwritten). `fresh`: the run starts over (other
    code finished it); its whole old record moves to <sweep folder>/.superseded/<id>-<time>/."""
    if fresh and run.run_dir.exists():
        dest = run.run_dir.parent / ".superseded" / f"{run.id}-{time.strftime('%Y%m%dT%H%M%S')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(run.run_dir, dest)
    atomic_write_text(run.run_dir / CONFIG_FILE, OmegaConf.to_yaml(run.cfg, resolve=True))
    status = read_status(run.run_dir)
    if status is not None and status.get("state") == CORRUPT:
        kept = set_aside(run.run_dir / STATUS_FILE)
        status = {**new_status(), "note": f"the earlier unreadable status.json is kept as {kept.name}"}
    status = status or new_status(run.label, run.variant, run.seed)
    status.update(
        state="pending",
        label=run.label,
        variant=run.variant,
        seed=run.seed,
        slurm_job_id=None,
        pid=None,
        pid_start=None,
        error=None,
        traceback=None,
    )
    write_status(run.run_dir, status)
