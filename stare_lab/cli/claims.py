"""`stare-lab claims FILE`: a sweep's declared claims decided from its records (docs/claims.md).

    stare-lab claims SWEEP.yaml|CLAIMS.yaml [--format md|latex|csv] [--out DIR] [--alpha 0.05]

FILE is a sweep file with a `claims:` block, or a claims file of its own: `sweep:` (a sweep file,
beside the claims file or a path, or a packaged sweep's name) and `claims:`. The claims are checked
against the sweep's planned runs before any record is read (one line, exit 2); the records are read,
never re-trained: finished runs of the current plan (the declared `controls:` included).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import NoReturn

from stare_lab.cli.common import UserError, parse
from stare_lab.core.utils import OneLineParser, atomic_write_text
from stare_lab.launchers.errors import SweepError
from stare_lab.launchers.liveness import read_manifest
from stare_lab.plan.claims import Fail, check_claims, parse_claims
from stare_lab.plan.schema import SweepSpec, parse_sweep, read_sweep_file
from stare_lab.record import CONFIG_FILE, find_run_dirs
from stare_lab.record.arms import flatten

CLAIMS_FILE_KEYS = ("sweep", "claims", "description")


def cmd_claims(argv: list[str]) -> int:
    p = OneLineParser(prog="stare-lab claims")
    p.add_argument("file", help="a sweep file with claims:, or a claims file (sweep: and claims:)")
    p.add_argument("--format", choices=["md", "latex", "csv"], default="md")
    p.add_argument("--out", type=Path, default=None, help="also write claims.md, .tex, .csv and claims.png here")
    p.add_argument("--alpha", type=float, default=0.05, help="the family's level, in (0, 0.5)")
    a = parse(p, argv)
    if not 0 < a.alpha < 0.5:
        raise UserError(f"--alpha {a.alpha:g}: expected a level in (0, 0.5)")
    spec, claims, planned = _checked(a.file)
    report = _report(spec, claims, _run_folders(spec, set(planned)), a.alpha)
    report.design = _design(spec, planned)
    rendered = {"md": report.to_markdown(), "latex": report.to_latex(), "csv": report.to_csv()}
    print(rendered[a.format])
    if a.out:
        for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv")):
            atomic_write_text(a.out / f"claims.{ext}", rendered[fmt])
        report.figure(a.out / "claims.png")
        print(f"stare-lab: claims.md, claims.tex, claims.csv and claims.png written to {a.out}", file=sys.stderr)
    return 0


def load_claims(file: str) -> tuple[SweepSpec, list]:
    """(the sweep, its claims) of a sweep file or a claims file, checked alone (SweepError, one line)."""
    path, text, data = read_sweep_file(file)
    where = str(path)
    if isinstance(data, dict) and "sweep" in data and "base" not in data:
        unknown = [k for k in data if k not in CLAIMS_FILE_KEYS]
        if unknown:
            raise SweepError(f"{where}: unknown key {unknown[0]!r}; a claims file has {', '.join(CLAIMS_FILE_KEYS)}")
        claims = parse_claims(data.get("claims"), _fail(where))
        target = path.parent / str(data["sweep"])
        spec, _ = load_claims(str(target if target.is_file() else data["sweep"]))
        return spec, claims
    if not isinstance(data, dict):
        raise SweepError(f"{where}: a sweep file is a mapping (or a claims file: sweep: and claims:)")
    spec = parse_sweep(data, where=where, folder=path.parent, reading=True)
    spec.path, spec.digest = path, hashlib.sha256(text.encode()).hexdigest()
    return spec, spec.claims


def _fail(where: str) -> Fail:
    def fail(key: str, msg: str) -> NoReturn:
        raise SweepError(f"{where}: {key}: {msg}" if key else f"{where}: {msg}")

    return fail


def _checked(file: str) -> tuple[SweepSpec, list, dict[str, dict]]:
    """The sweep, its claims checked against its plan, and the plan ({run folder name: flat config})."""
    spec, claims = load_claims(file)
    if not claims:
        raise UserError(f"{spec.where()}: no claims: (declare them in the sweep, or in a claims file)")
    if spec.search is not None:
        raise UserError(f"{spec.where()}: a search has no arms to compare")
    planned = _plan(spec)
    check_claims(claims, list(planned.values()), spec.controls, spec.where())
    return spec, claims, planned


def _design(spec: SweepSpec, planned: dict[str, dict]):
    """A sequential design's section (its states recomputed from the records: stare_lab.sweep.sequential)."""
    if spec.design is None:
        return None
    from stare_lab.sweep.look_report import design_summary  # deferred: scipy and pandas
    from stare_lab.sweep.sequential import planned_runs, sequential_state

    return design_summary(sequential_state(spec, planned_runs(spec, planned)))


def _plan(spec: SweepSpec) -> dict[str, dict]:
    """{run folder name: flat resolved config} of the sweep's current plan: the runs its last `sweep run`
    wrote in the manifest, with the configs they recorded, when the file has not changed since and every
    one has its record (no Hydra composition); else the file expanded again."""
    from stare_lab.record.frames import _read_config  # deferred: pandas

    manifest = read_manifest(spec.folder) or {}
    if manifest.get("digest") == spec.digest and manifest.get("runs"):
        dirs = [spec.folder / str(r["id"]) for r in manifest["runs"]]
        if all((d / CONFIG_FILE).is_file() for d in dirs):
            return {d.name: _read_config(d) for d in dirs}
    from stare_lab.plan.expand import expand_sweep  # deferred: Hydra

    return {r.run_dir.name: flatten(r.config) for r in expand_sweep(spec)}


def _run_folders(spec: SweepSpec, planned: set[str]) -> list[Path]:
    """The recorded runs of the plan (the declared controls' included: the expansion plans them)."""
    if not spec.folder.is_dir():
        raise UserError(f"no records under {spec.folder} yet: run `stare-lab sweep run {spec.path}` first")
    return [d for d in find_run_dirs(spec.folder) if d.name in planned]


def _report(spec: SweepSpec, claims: list, runs: list[Path], alpha: float):
    from stare_lab.analysis.claims_report import ClaimsReport  # deferred: pandas, scipy
    from stare_lab.analysis.verdicts import decide, missing_metrics, not_finished, sweep_frames

    problems, training, states = sweep_frames(runs, claims)
    finished = int((states["state"] == "finished").sum()) if len(states) else 0
    if not finished:
        raise UserError(f"no finished runs under {spec.folder} yet (`stare-lab sweep status {spec.path}`)")
    problem = missing_metrics(claims, training)
    if problem:
        raise UserError(problem)
    notes = [n for n in [not_finished(states)] if n]
    frame = decide(claims, problems, training, alpha)
    return ClaimsReport(frame, claims, spec.name, finished, alpha, notes)
