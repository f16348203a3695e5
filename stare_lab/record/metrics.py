"""A run's metrics.jsonl: one JSON row per logged step, appended and fsync'ed step by step (not atomic,
unlike the other files). Its readers tolerate a torn last row and return the unreadable lines beside
the good rows; a resumed run drops the rows after its checkpoint, keeping a damaged file aside."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from stare_lab.core.utils import atomic_write, atomic_write_text
from stare_lab.record.files import METRICS_FILE, bad_copy_path


def metrics_path(run_dir_or_file: Path | str) -> Path:
    p = Path(run_dir_or_file)
    return p / METRICS_FILE if p.is_dir() else p


def scan_metrics(run_dir_or_file: Path | str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(rows, bad lines as (line number, text)) of metrics.jsonl; a missing file has neither."""
    try:
        lines = metrics_path(run_dir_or_file).read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    rows, bad = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad.append((n, line))
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and not isinstance(row["step"], bool):
            rows.append(row)
        else:
            bad.append((n, line))
    return rows, bad


def read_metrics(run_dir_or_file: Path | str) -> list[dict[str, Any]]:
    """The parseable rows of metrics.jsonl (see `scan_metrics` for the others)."""
    return scan_metrics(run_dir_or_file)[0]


def write_metrics(run_dir: Path | str, rows: list[dict[str, Any]]) -> None:
    """Replace metrics.jsonl with `rows` (in step order), atomically."""
    text = "".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"]))
    atomic_write_text(metrics_path(run_dir), text)


def append_metrics(run_dir: Path | str, row: dict[str, Any]) -> None:
    with open(Path(run_dir) / METRICS_FILE, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(run_dir_or_file: Path | str, last_step: int) -> tuple[int, Path | None]:
    """Keep rows with step ≤ last_step (the checkpoint being resumed) so no step is logged twice.

    Returns (rows dropped, where the old file was kept when it held unreadable lines other than a
    torn last one: damage is set aside, not silently erased).
    """
    path = metrics_path(run_dir_or_file)
    if not path.is_file():
        return 0, None
    rows, bad = scan_metrics(path)
    n_lines = len(path.read_text(errors="replace").splitlines())
    kept_copy = None
    if any(n != n_lines for n, _ in bad):
        kept_copy = bad_copy_path(path)
        atomic_write(kept_copy, lambda tmp: Path(tmp).write_bytes(path.read_bytes()))
    keep = [r for r in rows if r["step"] <= last_step]
    # rewritten even when nothing is dropped: a torn last line must go too
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(rows) - len(keep), kept_copy


def read_metric_values(run_dir_or_file: Path | str, names: list[str]) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value)]} of a few metrics, in file order, as `scan_metrics` would give them (a null
    value is NaN, a row without the name has no entry, an unparsable line is skipped) without parsing every
    row: each whole row (one `json.dumps` line, as `append_metrics` writes it) is searched for the names'
    `"name": value` pairs; a row the search can not read is parsed as JSON."""
    try:
        lines = metrics_path(run_dir_or_file).read_text(errors="replace").splitlines()
    except OSError:
        return {n: [] for n in names}
    patterns = {n: re.compile(r'[{,] "' + re.escape(json.dumps(n)[1:-1]) + r'": ([^,}]+)') for n in names}
    out: dict[str, list[tuple[int, float]]] = {n: [] for n in names}
    for line in lines:
        step = _STEP.match(line)
        if step is None or not line.endswith("}"):
            _parsed(line, out)
            continue
        for name, pattern in patterns.items():
            found = pattern.search(line)
            if found:
                value = _number(found.group(1))
                if value is not None:
                    out[name].append((int(step.group(1)), value))
    return out


_STEP = re.compile(r'^\{"step": (\d+)[,}]')


def _number(text: str) -> float | None:
    """A JSON value as `scan_metrics`' readers take it: null is NaN; true, false and strings are not numbers."""
    if text == "null":
        return math.nan
    try:
        return float(text) if text not in ("true", "false") and not text.startswith('"') else None
    except ValueError:
        return None


def _parsed(line: str, out: dict[str, list[tuple[int, float]]]) -> None:
    """A row the fast search can not read (another key order, a torn line): parsed as `scan_metrics` does."""
    try:
        row = json.loads(line)
    except ValueError:
        return
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, (int, float)) or isinstance(step, bool):
        return
    for name in out:
        value = row.get(name, ...)
        if value is None:
            out[name].append((int(step), math.nan))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name].append((int(step), float(value)))
