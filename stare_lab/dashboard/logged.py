"""What a sweep's runs logged to W&B, read back from their own W&B files.

Each run writes a transaction log `<run_dir>/wandb/<offline-run|run>-<time>-<id>/run-<id>.wandb`
(online runs too); a resumed run writes one more folder. The log is read with W&B's own reader,
`wandb leet inspect --json` (one JSON record per line), so the dashboard is built on the keys W&B
holds, not on what stare_lab meant to log. Where this differs from the run record (metrics.jsonl,
eval/), W&B wins: a panel on a key W&B never got would stay empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_lab.record import WANDB_DIR

VISUALIZE = "_wandb.visualize."  # config entries of custom charts (wandb.plot.*): one per chart key


class WandbFilesError(Exception):
    """A W&B transaction log that W&B's reader could not read."""


@dataclass
class LoggedRun:
    """One W&B run as its transaction logs hold it (all folders of the run id together).

    history: numeric keys of history rows; summary: numeric summary keys; media: {key: `_type`}
    (html-file, image-file, table-file, ...) of logged media; charts: {chart key: panel config}
    of custom charts (wandb.plot.*); config: the run's config as logged (nested);
    eval_points: history rows holding `eval/step`.
    """

    run_id: str
    files: list[Path]
    config: dict[str, Any] = field(default_factory=dict)
    project: str | None = None
    entity: str | None = None
    group: str | None = None
    job_type: str | None = None
    history: set[str] = field(default_factory=set)
    summary: set[str] = field(default_factory=set)
    media: dict[str, str] = field(default_factory=dict)
    charts: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_points: int = 0

    @property
    def rule(self) -> str | None:
        method = self.config.get("method")
        return str(method["name"]) if isinstance(method, dict) and "name" in method else None

    @property
    def keys(self) -> set[str]:
        return self.history | self.summary | set(self.media) | set(self.charts)


def wandb_files(folder: Path, run_id: str | None = None) -> list[Path]:
    """The W&B transaction logs under `folder`/wandb (of one run id when given), oldest first."""
    pattern = f"*/run-{run_id}.wandb" if run_id else "*/run-*.wandb"
    return sorted((Path(folder) / WANDB_DIR).glob(pattern), key=lambda p: p.parent.name)


def read_records(log: Path) -> list[dict[str, Any]]:
    """The records of one transaction log, as W&B's reader prints them (`wandb leet inspect --json`)."""
    try:
        out = subprocess.run(_reader(log), capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WandbFilesError(f"{log}: W&B's reader did not run ({e})") from None
    if out.returncode != 0:
        raise WandbFilesError(f"{log}: W&B's reader failed: {(out.stderr or out.stdout).strip()[:200]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip().startswith("{")]


def _reader(log: Path) -> list[str]:
    """The command of `wandb leet inspect --json LOG`. The `wandb` command only starts wandb-core
    with these arguments (wandb/cli/leet.py) after ~0.5 s of Python imports; wandb-core alone takes
    ~30 ms, which counts with one log per run. Without wandb-core, the `wandb` command."""
    try:
        from wandb.util import get_core_path  # deferred: wandb (~0.5 s), for where its core binary is

        core = get_core_path()
    except Exception:  # wandb without its core binary: the command line finds out and says why
        cli = Path(sys.executable).with_name("wandb")
        return [str(cli) if cli.is_file() else "wandb", "leet", "inspect", "--json", str(log)]
    log = log.resolve()
    return [core, "leet", "inspect", "--no-observability", "--json", "--run-file", str(log), str(log.parent.parent)]


def logged_run(logs: list[Path], records: list[list[dict[str, Any]]]) -> LoggedRun:
    """Fold the records of one run's logs (oldest first) into a LoggedRun."""
    run = LoggedRun(run_id=_run_id(logs[0]), files=list(logs))
    for rec in (r for recs in records for r in recs):
        kind = rec.get("type")
        if kind == "run":
            info = rec["run"]
            _merge(run.config, (info.get("config") or {}).get("update") or {})
            run.project = info.get("project") or run.project
            run.entity = info.get("entity") or run.entity
            run.group = info.get("run_group") or run.group
            run.job_type = info.get("job_type") or run.job_type
        elif kind == "config":
            _merge(run.config, (rec["config"] or {}).get("update") or {})
        elif kind == "history":
            item = _flat(rec["history"].get("item") or {})
            run.history |= _numeric(item)
            run.media.update(_media(item))
            run.eval_points += "eval/step" in item
        elif kind == "summary":
            item = _flat((rec["summary"] or {}).get("update") or {})
            run.summary |= _numeric(item)
            run.media.update(_media(item))
    for key, value in list(run.config.items()):
        if key.startswith(VISUALIZE):
            run.charts[key[len(VISUALIZE) :]] = value.get("panel_config", {}) if isinstance(value, dict) else {}
            del run.config[key]
    run.config.pop("_wandb", None)
    return run


def read_logged_runs(folders: Sequence[tuple[Path, str | None]], threads: int | None = None) -> list[LoggedRun]:
    """LoggedRun of each (folder, run id) with W&B files (run id None: every run under the folder);
    folders without any are left out. The reader is one process per log, `threads` at a time."""
    groups: list[list[Path]] = []
    for folder, run_id in folders:
        logs = wandb_files(folder, run_id)
        by_id: dict[str, list[Path]] = {}
        for log in logs:
            by_id.setdefault(_run_id(log), []).append(log)
        groups.extend(by_id.values())
    flat = [log for g in groups for log in g]
    workers = max(1, min(threads or _cores(), len(flat) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        records = dict(zip(flat, pool.map(read_records, flat), strict=True))
    return [logged_run(g, [records[log] for log in g]) for g in groups]


def _run_id(log: Path) -> str:
    return log.name[len("run-") : -len(".wandb")]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _flat(item: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested summary values → dotted keys, the way the reader prints history media (`key._type`)."""
    out: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _numeric(item: dict[str, Any]) -> set[str]:
    """Numeric keys of one record, without W&B's own (`_step`, ...) and the fields of media entries."""
    media = tuple(f"{k}." for k in _media(item))
    return {
        k
        for k, v in item.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_") and not k.startswith(media)
    }


def _media(item: dict[str, Any]) -> dict[str, str]:
    return {k[: -len("._type")]: str(v) for k, v in item.items() if k.endswith("._type") and not k.startswith("_")}
