"""A run's evaluation results: eval/<benchmark>/<settings key>.json and the per-sample .parquet beside it,
one pair per benchmark, settings and checkpoint step (docs/run_record.md), and the older layouts
(eval/<benchmark>.json, eval/step-<N>/<benchmark>.json) still read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stare_lab.core.utils import atomic_write
from stare_lab.record.files import EVAL_DIR, read_json

_STEP_DIR = re.compile(r"step-(\d+)")

# What an evaluation result depends on besides the model: results differing in any of these (or in
# the checkpoint step) are different results and live side by side.
EVAL_SETTINGS = ("n", "temperature", "top_p", "max_tokens", "verifier", "engine")
RESULT_SETTINGS = EVAL_SETTINGS + ("num_problems",)  # what a stored result states besides its metrics
# A setting a result written before it existed did not state, and the value it had then.
SETTING_DEFAULTS = {"engine": "transformers"}


def result_setting(result: dict[str, Any], key: str) -> Any:
    """A stored result's evaluation setting; one written before the setting existed has its old value."""
    return result.get(key, SETTING_DEFAULTS.get(key))


def _num(x: Any) -> str:
    return f"{float(x):g}"


def settings_key(settings: dict[str, Any], step: int | None) -> str:
    """The file stem of one evaluation: `step-2_n4_t1_p0.7_m8_exact` (step `final` when unknown)."""
    return (
        f"step-{'final' if step is None else step}_n{int(settings['n'])}_t{_num(settings['temperature'])}"
        f"_p{_num(settings['top_p'])}_m{int(settings['max_tokens'])}_{settings['verifier']}"
        + ("" if result_setting(settings, "engine") == "transformers" else f"_{settings['engine']}")
    )


# The per-sample parquet of an evaluation: one row per sampled answer (column, pyarrow type).
SAMPLE_COLUMNS = (
    ("problem_id", "string"),
    ("sample_index", "int64"),
    ("answer", "string"),
    ("extracted", "string"),  # the answer the verifier extracted (None: nothing to extract)
    ("gold", "string"),
    ("correct", "bool_"),
    ("length", "int64"),  # completion tokens
    ("score", "float64"),  # the verifier's score: 1.0 / 0.0, or a dataset's partial credit (correct: 1.0)
)


def eval_result_path(run_dir: Path | str, benchmark: str, settings: dict[str, Any], step: int | None) -> Path:
    """`eval/<benchmark>/<settings key>.json`; the per-sample parquet sits beside it."""
    return Path(run_dir) / EVAL_DIR / benchmark / f"{settings_key(settings, step)}.json"


def write_eval_result(run_dir: Path | str, result: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """`eval/<benchmark>/<key>.parquet` (one row per sample) and `.json` (settings inside), atomically.
    A result under the same settings and step is replaced; any other is kept."""
    import pyarrow as pa  # deferred: `sweep status` and the tables read records without it
    import pyarrow.parquet as pq

    path = eval_result_path(run_dir, result["benchmark"], result, result["step"])
    result = {**result, "settings_key": path.stem}
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in SAMPLE_COLUMNS])
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    atomic_write(path.with_suffix(".parquet"), lambda tmp: pq.write_table(table, tmp))
    text = json.dumps(result, indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def eval_files(run_dir: Path | str) -> Iterator[tuple[Path, bool | None, int | None]]:
    """(json path, final?, step from the folder name) of every evaluation result, both layouts:
    eval/<benchmark>/<key>.json (final? read from the file: None here), and the older
    eval/<benchmark>.json (final) and eval/step-<N>/<benchmark>.json (intermediate)."""
    root = Path(run_dir) / EVAL_DIR
    for p in sorted(root.glob("[!.]*.json")):  # not the .x.json.tmp of a write in progress
        yield p, True, None
    for sub in sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []:
        m = _STEP_DIR.fullmatch(sub.name)
        for p in sorted(sub.glob("[!.]*.json")):
            yield (p, False, int(m.group(1))) if m else (p, None, None)


def read_eval_results(run_dir: Path | str) -> list[dict[str, Any]]:
    """Every evaluation result of a run, each with `path`, `benchmark`, `final` and `step` filled in."""
    out = []
    for path, final, dir_step in eval_files(run_dir):
        data = read_json(path)
        if data is None:
            continue
        data.setdefault("benchmark", path.parent.name if final is None else path.stem)
        data["step"] = data.get("step", dir_step)
        data["final"] = bool(data.get("final", True)) if final is None else final
        out.append({**data, "path": str(path)})
    return out


def same_settings(result: dict[str, Any], settings: dict[str, Any]) -> bool:
    return all(_same(result_setting(result, k), settings.get(k)) for k in EVAL_SETTINGS)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def find_eval_result(
    run_dir: Path | str, benchmark: str, settings: dict[str, Any], step: int | None, final: bool
) -> dict[str, Any] | None:
    """The result of this benchmark under exactly these settings at this step, in either layout."""
    for r in read_eval_results(run_dir):
        if r["benchmark"] == benchmark and r["final"] == final and r.get("step") == step and same_settings(r, settings):
            return r
    return None


def eval_metric(run_dir: Path | str, benchmark: str, metric: str, step: int | None = None) -> float | None:
    """A metric of the final evaluation (or the one at `step`) of a benchmark; among several
    settings, the newest result that reports the metric."""
    found = [
        r
        for r in read_eval_results(run_dir)
        if r["benchmark"] == benchmark
        and (r["final"] if step is None else (not r["final"] and r.get("step") == step))
        and (r.get("metrics") or {}).get(metric) is not None
    ]
    if not found:
        return None
    newest = max(found, key=lambda r: Path(r["path"]).stat().st_mtime)
    return float(newest["metrics"][metric])


def problem_counts(samples: Path | str):
    """(problem ids, correct samples, samples) per problem of an evaluation's per-sample parquet, problems
    in first-seen order; `correct` is NaN for a problem with a sample without a verdict (a null `correct`),
    so that no comparison counts it as wrong. Arrays: str, float, int (numpy)."""
    import numpy as np
    import pyarrow.parquet as pq  # deferred: `sweep status` reads records without it

    # problem ids read as a dictionary: the codes count without a string per sample
    table = pq.read_table(samples, columns=["problem_id", "correct"], read_dictionary=["problem_id"])
    table = table.unify_dictionaries().combine_chunks()
    problem = table.column("problem_id").chunk(0) if table.num_rows else None
    if problem is None:
        return np.array([], dtype=str), np.array([], dtype=float), np.array([], dtype=int)
    ids, codes = np.asarray(problem.dictionary.to_pylist(), dtype=object), problem.indices.to_numpy()
    correct = table.column("correct")
    judged = ~correct.is_null().to_numpy(zero_copy_only=False)
    hits = correct.fill_null(False).to_numpy(zero_copy_only=False).astype(float)
    n = np.bincount(codes, minlength=len(ids))
    c = np.bincount(codes, weights=hits, minlength=len(ids))
    c[np.bincount(codes, weights=~judged, minlength=len(ids)) > 0] = np.nan
    seen = n > 0  # a dictionary may hold an id no sample has
    return ids[seen].astype(str), c[seen], n[seen]
