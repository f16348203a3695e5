"""`stare-lab dashboard SWEEP`: the sweep's W&B workspace, saved to W&B or written as its specification.

    stare-lab dashboard sweeps/X.yaml [--offline] [--name NAME] [--out FILE]

SWEEP is a sweep file, a packaged sweep's name, or a sweep's run folder. The workspace is built
from what the sweep's runs logged (stare_lab.dashboard.view) and its specification is always
written to `<sweep output>/<sweep name>/wandb_dashboard.json`: the library's own JSON of the
workspace (`Workspace._spec`, i.e. `wandb_workspaces.workspaces.internal.View` dumped by alias,
the view that `Workspace.save()` sends; `load_workspace` reads it back). With a W&B key
(`WANDB_API_KEY` set and `WANDB_MODE` not offline or disabled) and without --offline, the
workspace is also saved to the runs' W&B project; saving again updates the same view (its name and
id are kept in the JSON file). Without a key, one line says how to publish it.

Exit codes: 0 written (and saved); 1 W&B's files could not be read, or saving to W&B failed (the
specification is written); 2 a user mistake, said in one line, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stare_lab.config.run_config import ConfigError
from stare_lab.core.utils import atomic_write_text
from stare_lab.dashboard.logged import LoggedRun, WandbFilesError, read_logged_runs
from stare_lab.plan.schema import SweepError, load_sweep
from stare_lab.record import find_run_dirs

SPEC_FILE = "wandb_dashboard.json"
OFFLINE_MODES = ("offline", "disabled", "dryrun")


class DashboardError(Exception):
    """A user mistake: one line, exit 2."""


class PublishError(Exception):
    """W&B did not take the workspace: one line, exit 1."""


@dataclass
class Dashboard:
    sweep: str
    path: Path  # the specification
    workspace: Any  # wandb_workspaces.workspaces.Workspace
    runs: int  # training runs shown
    without_wandb: int  # run folders without W&B files (logger none, or not started)
    summary_run: bool  # `stare-lab table --wandb`'s run is shown
    url: str | None = None  # where it was saved; None: written only


def wandb_online() -> bool:
    """Whether a W&B key is set and W&B is not told to stay offline (as stare_lab.training.tracking's `auto` mode)."""
    return bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE", "").lower() not in OFFLINE_MODES


def sweep_folder(sweep: Path | str) -> tuple[str | None, Path]:
    """(the sweep's name, its run folder) of a sweep file, a packaged sweep's name or a run folder
    (whose name is then read from its runs' W&B group)."""
    path = Path(sweep)
    if path.is_dir():
        return None, path
    if not path.is_file() and (path.suffix or len(path.parts) > 1):
        raise DashboardError(f"no such sweep file or run folder: {path}")
    spec = load_sweep(path)
    return spec.name, spec.folder


def build_dashboard(
    sweep: Path | str, *, publish: bool | None = None, out: Path | str | None = None, name: str | None = None
) -> Dashboard:
    """Build the sweep's workspace, write its specification, and save it to W&B when `publish`
    (None: when `wandb_online()`). Raises DashboardError (nothing written), WandbFilesError, and
    PublishError (the specification is written)."""
    label, folder = sweep_folder(sweep)
    if not folder.is_dir():
        raise DashboardError(f"sweep {label!r} has no run folder yet ({folder}): run it first")
    run_dirs = find_run_dirs(folder)
    logged = read_logged_runs([(d, None) for d in run_dirs] + [(folder, None)])
    training = [r for r in logged if r.job_type != "summary"]
    if not training:
        raise DashboardError(
            f"no run under {folder} has W&B files yet (a run writes them under <run>/wandb unless logger=none)"
        )
    sweep_name = label or _most_common(r.group for r in training) or folder.name
    project = _most_common(r.project for r in training) or "stare_lab"
    shown = [r for r in logged if r.group == sweep_name and r.project == project]
    if not any(r.job_type != "summary" for r in shown):
        raise DashboardError(f"no run under {folder} was logged to W&B group {sweep_name!r} of project {project!r}")
    from stare_lab.dashboard.view import build_workspace  # deferred: wandb_workspaces, wandb and pandas

    workspace = build_workspace(sweep_name, shown, _entity(training), project, name)
    path = Path(out) if out is not None else folder / SPEC_FILE
    result = Dashboard(
        sweep=sweep_name,
        path=path,
        workspace=workspace,
        runs=sum(r.job_type != "summary" for r in shown),
        without_wandb=len(run_dirs) - len({f.parent.parent.parent for r in training for f in r.files}),
        summary_run=any(r.job_type == "summary" for r in shown),
    )
    _reuse_view(workspace, path)
    write_spec(workspace, path)
    if publish if publish is not None else wandb_online():
        result.url = _save(workspace)
        write_spec(workspace, path)  # now with the view's name and id: the next save updates it
    return result


def write_spec(workspace: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(workspace._spec, indent=1) + "\n")


def load_workspace(path: Path | str) -> Any:
    """The workspace of a written specification (as `Workspace.from_url` builds one from W&B's)."""
    import wandb_workspaces.workspaces as ws  # deferred: wandb_workspaces (with wandb and pydantic)
    from wandb_workspaces.workspaces import internal

    return ws.Workspace._from_model(internal.View.model_validate_json(Path(path).read_text()))


def _reuse_view(workspace: Any, path: Path) -> None:
    """Keep the name and id of the view saved from the same file before, so saving updates it."""
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    same = (before.get("project"), before.get("displayName")) == (workspace.project, workspace.name)
    if same and before.get("name") and before.get("id") and before.get("entity"):
        workspace.entity = before["entity"] if not workspace.entity else workspace.entity
        if workspace.entity == before["entity"]:
            workspace._internal_name, workspace._internal_id = before["name"], before["id"]


def _save(workspace: Any) -> str:
    import wandb  # deferred: only a save to W&B needs it

    try:
        if not workspace.entity:
            workspace.entity = wandb.Api().default_entity or ""
        if not workspace.entity:
            raise PublishError("no W&B entity: set logger.entity in the sweep or WANDB_ENTITY")
        workspace.save()
        return str(workspace.url)
    except PublishError:
        raise
    except Exception as e:  # network, authentication, server answers: all end in the same line
        raise PublishError(f"W&B did not save the workspace: {_first_line(e)}") from e


def _entity(runs: list[LoggedRun]) -> str:
    configured = [(r.config.get("logger") or {}).get("entity") for r in runs]
    return _most_common([r.entity for r in runs] + configured) or os.environ.get("WANDB_ENTITY", "")


def _most_common(values) -> str | None:
    counts = Counter(v for v in values if v)
    return counts.most_common(1)[0][0] if counts else None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _panels(workspace: Any) -> int:
    return sum(len(s.panels) for s in workspace.sections)


def publish_after_sweep(folder: Path | str) -> str | None:
    """After `stare-lab sweep run`: with a W&B key set, save the sweep's dashboard and print one line.
    Returns that line; None when there was nothing to do (no key, or no run logged to W&B). A failure
    is printed as one line too, and never raised: the sweep itself is done."""
    if not wandb_online():
        return None
    try:
        d = build_dashboard(Path(folder), publish=True)
        line = f"W&B dashboard of sweep {d.sweep!r}: {d.url}"
    except DashboardError:
        return None
    except Exception as e:  # the sweep's runs are finished whatever W&B answers
        line = f"stare-lab: W&B dashboard not saved: {_first_line(e)}"
    print(line, file=sys.stderr if line.startswith("stare-lab:") else sys.stdout, flush=True)
    return line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every stare-lab command
        raise DashboardError(f"{self.prog}: {message}")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="stare-lab dashboard", description="The sweep's W&B workspace (docs/dashboard.md).")
    p.add_argument("sweep", help="sweep file, packaged sweep name, or a sweep's run folder")
    p.add_argument("--offline", action="store_true", help="write the specification only, even with a W&B key")
    p.add_argument("--name", default=None, help="the workspace's name (default: '<sweep> (stare-lab)')")
    p.add_argument("--out", type=Path, default=None, help=f"the specification (default: <sweep folder>/{SPEC_FILE})")
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
        d = build_dashboard(a.sweep, publish=False if a.offline else None, out=a.out, name=a.name)
    except (DashboardError, SweepError, ConfigError) as e:
        print(f"stare-lab: error: {_first_line(e)}", file=sys.stderr)
        return 2
    except (WandbFilesError, PublishError) as e:
        print(f"stare-lab: error: {_first_line(e)}", file=sys.stderr)
        return 1
    what = f"W&B dashboard of sweep {d.sweep!r}: {_panels(d.workspace)} panels on {d.runs} runs"
    if d.url:
        print(f"{what}, saved: {d.url} (specification: {d.path})")
    else:
        print(f"{what}, written to {d.path}; to publish it: {_publish_hint(a.sweep, a.offline)}")
    if not d.summary_run:
        print(
            f"stare-lab: no summary run yet: `stare-lab table {a.sweep} --wandb` logs the comparison table and "
            "forest plot; then build the dashboard again",
            file=sys.stderr,
        )
    return 0


def _publish_hint(sweep: str, offline_flag: bool) -> str:
    command = f"stare-lab dashboard {sweep}"
    if offline_flag and wandb_online():
        return command + " (without --offline)"
    if os.environ.get("WANDB_API_KEY"):
        return f"WANDB_MODE=online {command}"
    return f"WANDB_API_KEY=... {command}"
