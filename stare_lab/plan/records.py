"""A reading command's plan from the records: runs of a rule the registry does not know.

`status`, `table`, `plot` and `view` import no rule kept outside the package (stare_lab.methods.outside).
A run of such a rule expands with its parameters as the sweep gives them, without the rule's
defaults, so its id (a hash of the resolved config) is not known from the sweep file alone. The
record that ran it is: `resolve_from_records` takes, among the run directories with the run's label,
the one whose config is the run's own once the rule's values are taken from the record (its full
parameters and `trainer.num_iterations`) — checked by recomputing the recorded run id, so an edited
sweep (another base value, another parameter) matches no earlier record. A run with no such record
has not been launched: it keeps a provisional id no folder has, and shows as not started.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml

from stare_lab.config.run_config import run_id
from stare_lab.record import CONFIG_FILE

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def recorded_configs(folder: Path | str) -> list[dict[str, Any]]:
    """The config.yaml of each run directory directly under a sweep folder, by folder name; an
    unreadable one is passed over (`sweep status` names it)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path) / CONFIG_FILE
        if not entry.is_dir() or not path.is_file():
            continue
        try:
            data = yaml.load(path.read_text(), Loader=_Loader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("run"), dict) and isinstance(data.get("method"), dict):
            out.append(data)
    return out


def resolve_from_records(runs: list, folder: Path) -> None:
    """Give each unresolved run (`RunSpec.resolved` False) the id, folder and config of the record
    that ran it (module docstring); in place."""
    pending = [r for r in runs if not r.resolved]
    if not pending:
        return
    by_label: dict[str, list[dict[str, Any]]] = {}
    for cfg in recorded_configs(folder):
        by_label.setdefault(str(cfg["run"].get("label")), []).append(cfg)
    for run in pending:
        for record in by_label.get(run.label, []):
            if _same_run(run.config, record, run_id):
                run.id = str(record["run"]["id"])
                run.run_dir = Path(folder) / run.id
                run.config = record
                run.resolved = True
                break


def _same_run(config: dict[str, Any], record: dict[str, Any], run_id) -> bool:
    method, recorded = config["method"], record["method"]
    params = recorded.get("params") or {}
    if method["name"] != recorded.get("name") or not isinstance(params, dict):
        return False
    if any(k not in params or _plain(params[k]) != _plain(v) for k, v in (method.get("params") or {}).items()):
        return False
    trainer = dict(config["trainer"])
    if trainer.get("num_iterations") is None:
        trainer["num_iterations"] = (record.get("trainer") or {}).get("num_iterations")
    candidate = {**config, "method": {**method, "params": params}, "trainer": trainer}
    return run_id(candidate) == record["run"].get("id")


def _plain(value: Any) -> Any:
    """A value as a record writes it (stare_lab.config.run_config._jsonable): infinities as strings, tuples as lists."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
