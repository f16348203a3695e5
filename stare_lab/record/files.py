"""The run folder's file names, where run folders are, and the small pieces every part of the record
uses: the record's error, times, an error's first line, a JSON file read without raising, a damaged
file set aside."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stare_lab.core.utils import atomic_write_text

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"
EVAL_DIR = "eval"
WANDB_DIR = "wandb"
CLAIM_FILE = ".claim"  # flock'ed by the one worker executing the run
RULE_STATE_FILE = "rule_state.json"  # written by the trainer into each checkpoint
TASK_FILE = "task.json"  # a generated task's splits: sizes, seeds, held-out collisions removed
_NOT_RUNS = {CHECKPOINT_DIR, EVAL_DIR, WANDB_DIR}  # folders of a run, never searched for runs


class RecordError(Exception):
    """A run record that can not be used as it is (one line naming the file and the problem)."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def first_line(text: str | None) -> str | None:
    if not text or not text.strip():
        return None if text is None else text
    return text.strip().splitlines()[0]


def elapsed(since: float) -> float:
    return round(time.time() - since, 3)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a record file, or None when missing or unparsable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_task_record(run_dir: Path | str, record: dict[str, Any]) -> Path:
    """`<run_dir>/task.json`: what a task that generates its problems records of its splits, atomically."""
    path = Path(run_dir) / TASK_FILE
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def bad_copy_path(path: Path) -> Path:
    """Where a damaged record file is kept: `<name>.bad-<time>` beside it."""
    return path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}")


def set_aside(path: Path) -> Path:
    """Rename a damaged record file out of the way, keeping it (`bad_copy_path`)."""
    dest = bad_copy_path(path)
    os.replace(path, dest)
    return dest


def find_run_dirs(root: Path | str | Iterable[Path | str]) -> list[Path]:
    """Run directories (those holding `config.yaml`) at or below each root, sorted."""
    roots = [root] if isinstance(root, (str, Path)) else list(root)
    found: list[Path] = []
    for r in roots:
        found.extend(_walk(Path(r), depth=4))
    return sorted(dict.fromkeys(found))


def _walk(path: Path, depth: int) -> list[Path]:
    if (path / CONFIG_FILE).is_file():
        return [path]
    if depth == 0 or not path.is_dir():
        return []
    out: list[Path] = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and child.name not in _NOT_RUNS and not child.name.startswith("."):
            out.extend(_walk(child, depth - 1))
    return out
