"""Problem/answer records from local JSONL or Parquet files, or from a `datasets` hub name.

Every loader returns plain dicts with the canonical keys `problem`, `answer` and `problem_id`
(all `str`). A field mapping names the source column for each key; a value may be a list of
candidate columns (the first present one wins), so one benchmark config serves both a hub copy
(`question`) and a local file (`problem`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_FIELDS: dict[str, Any] = {"problem": "problem", "answer": "answer", "id": None}
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def load_records(
    source: str,
    *,
    split: str = "test",
    fields: Mapping[str, Any] | None = None,
    subset: str | None = None,
    limit: int | None = None,
) -> list[dict[str, str]]:
    """Load records `{"problem", "answer", "problem_id"}` from `source`.

    source: a local `.jsonl`/`.json` (one object per line) or `.parquet` path (`~` expanded),
        or a `datasets` hub name loaded as `load_dataset(source, subset, split=split)`.
    fields: `{"problem": col, "answer": col, "id": col | None}`; a col may be a list of
        candidates. `id: None` numbers rows "0", "1", ... in file order.
    limit: keep the first `limit` rows.
    Raises FileNotFoundError for a missing local file and ValueError for a missing field.
    """
    mapping = {**DEFAULT_FIELDS, **dict(fields or {})}
    rows, columns = _read_rows(source, split=split, subset=subset)
    if limit is not None:
        rows = rows[: int(limit)]
    problem_col = _pick_column("problem", mapping["problem"], columns, source)
    answer_col = _pick_column("answer", mapping["answer"], columns, source)
    id_col = None if mapping.get("id") is None else _pick_column("id", mapping["id"], columns, source)
    return [
        {
            "problem": _as_text(row[problem_col]),
            "answer": _as_text(row[answer_col]),
            "problem_id": str(i) if id_col is None else _as_text(row[id_col]),
        }
        for i, row in enumerate(rows)
    ]


def is_local_source(source: str) -> bool:
    """A path (has a file suffix we read, or a path separator), as opposed to a hub name."""
    s = os.path.expanduser(str(source))
    return s.lower().endswith(LOCAL_SUFFIXES) or s.startswith((".", "/", "~")) or os.path.exists(s)


def _read_rows(source: str, *, split: str, subset: str | None) -> tuple[list[dict], list[str]]:
    if is_local_source(source):
        path = Path(os.path.expanduser(str(source)))
        if not path.is_file():
            raise FileNotFoundError(f"benchmark/task file not found: {path}")
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq  # deferred: pyarrow, only for a parquet file

            table = pq.read_table(path)
            return table.to_pylist(), list(table.column_names)
        rows = _read_jsonl(path)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        return rows, columns
    import datasets  # deferred: datasets, only for a hub dataset

    ds = datasets.load_dataset(source, subset, split=split)
    return list(ds), list(ds.column_names)


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def _pick_column(key: str, wanted: str | Sequence[str], columns: Iterable[str], source: str) -> str:
    candidates = [wanted] if isinstance(wanted, str) else [str(c) for c in wanted]
    present = list(columns)
    for c in candidates:
        if c in present:
            return c
    raise ValueError(
        f"{source}: field {key!r} maps to column {' or '.join(map(repr, candidates))}, "
        f"which is missing; columns present: {present}"
    )


def _as_text(value: Any) -> str:
    """Canonical string for a problem, answer or id (hub copies store some answers as floats or lists)."""
    if isinstance(value, (list, tuple)):
        return ", ".join(_as_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)
