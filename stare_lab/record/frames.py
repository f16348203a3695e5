"""Run directories → tidy pandas DataFrames (the run record is in docs/run_record.md).

Analysis reads records only: `config.yaml`, `status.json`, `metrics.jsonl` and `eval/`. It never
needs W&B. Every reader tolerates a record that is still being written: a run without `eval/`
yet, a missing `status.json`, a `metrics.jsonl` whose last line a crash cut short.

Arms. Runs are grouped into *arms*: runs differing only in seed belong to one arm and aggregate
together, named as stare_lab.record.arms says (the rule label, e.g. `rsi_band[0.5,1]`, a control's
name, and the other config keys that differ within a label appended).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from stare_lab.record import (
    CONFIG_FILE,
    EVAL_SETTINGS,
    RESULT_SETTINGS,
    code_version,
    find_run_dirs,
    read_eval_results,
    read_status,
    result_setting,
    scan_metrics,
)
from stare_lab.record.arms import arm_names, flatten, rule_label

log = logging.getLogger(__name__)

RUN_COLUMNS = ["sweep", "run", "label", "rule", "arm", "seed"]
EVAL_COLUMNS = RUN_COLUMNS + ["step", "final", "benchmark", "metric", "value", *RESULT_SETTINGS]
PROBLEM_COLUMNS = RUN_COLUMNS + ["benchmark", *RESULT_SETTINGS, "problem", "correct", "n"]
TRAIN_COLUMNS = RUN_COLUMNS + ["step", "metric", "value"]
STATE_COLUMNS = RUN_COLUMNS + ["state", "attempts", "error", "code", "path"]
SETTING_COLUMNS = EVAL_SETTINGS  # what a column must not mix (num_problems: the problem check of compare_arms)


class SettingsMismatch(ValueError):
    """Results of one benchmark computed under different evaluation settings would share a column."""


# yaml's C loader where the build has it (same result, ~10× faster on a run's config).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# flat config by (path, size, modification time): `table`, `plot` and the page read each run's
# config.yaml several times (arms, training curves, evaluations); one parse per file version.
_CONFIGS: dict[tuple[str, int, int], dict[str, Any]] = {}


def _read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CONFIG_FILE
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _CONFIGS:
            cfg = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
            _CONFIGS[key] = flatten(cfg) if isinstance(cfg, dict) else {}
    except (OSError, yaml.YAMLError) as err:
        log.warning("%s: unreadable config.yaml (%s)", run_dir, err)
        return {}
    return dict(_CONFIGS[key])


def _identity(run_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    seed = cfg.get("seed")
    method = cfg.get("method.name", "unknown")
    return {
        "sweep": str(cfg.get("run.sweep") or run_dir.parent.name),
        "run": str(cfg.get("run.id") or run_dir.name),
        "label": str(cfg.get("run.label") or cfg.get("run.id") or run_dir.name),
        "rule": str(method),
        "arm": rule_label(method, cfg.get("run.variant")),
        "seed": int(seed) if isinstance(seed, (int, float)) and seed == seed else pd.NA,
    }


def _runs(root) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """[(run_dir, identity, flat config)] with arms split on differing non-seed config keys."""
    runs = []
    for run_dir in find_run_dirs(root):
        cfg = _read_config(run_dir)
        runs.append((run_dir, _identity(run_dir, cfg), cfg))
    for (_, ident, _), arm in zip(runs, arm_names([cfg for _, _, cfg in runs]), strict=True):
        ident["arm"] = arm
    return runs


def _eval_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per (benchmark, metric) of every evaluation result, final and intermediate."""
    rows = []
    for data in read_eval_results(run_dir):
        settings = {k: result_setting(data, k) for k in RESULT_SETTINGS}
        base = {"step": data.get("step"), "final": data["final"], "benchmark": str(data["benchmark"]), **settings}
        for metric, value in (data.get("metrics") or {}).items():
            if isinstance(value, (list, tuple)) and len(value) == 2:
                rows.append({**base, "metric": f"{metric}_lo", "value": value[0]})
                rows.append({**base, "metric": f"{metric}_hi", "value": value[1]})
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append({**base, "metric": metric, "value": float(value)})
    return rows


def collect_runs(root: Path | list[Path]) -> pd.DataFrame:
    """Evaluation results of every run under `root`, long format.

    Columns: sweep, run, label, rule (method.name), arm (rule label, the grouping key), seed,
    step, final (False for intermediate checkpoints' evaluations), benchmark, metric
    (avg@32, avg@32_ci_lo, avg@32_ci_hi, pass@k, maj@32, ...), value (a fraction), the evaluation
    settings n, temperature, top_p, max_tokens, verifier, num_problems, and one `cfg.<key>`
    column per flattened config key. Runs without results contribute no rows.
    """
    frames = []
    for run_dir, ident, cfg in _runs(root):
        rows = _eval_rows(run_dir)
        if rows:
            frame = pd.DataFrame(rows).assign(**ident)
            cfg_cols = pd.DataFrame([{f"cfg.{k}": v for k, v in cfg.items()}] * len(frame))
            frames.append(pd.concat([frame, cfg_cols], axis=1))
    if not frames:
        return pd.DataFrame(columns=EVAL_COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    cfg_cols = sorted(c for c in df.columns if c.startswith("cfg."))
    df = df[EVAL_COLUMNS + cfg_cols]
    df["seed"] = df["seed"].astype("Int64")
    df["step"] = df["step"].astype("Int64")
    return df


def _problem_rows(run_dir: Path, ident: dict[str, Any]) -> list[pd.DataFrame]:
    """Per-problem counts of each final evaluation that kept its samples (the parquet beside its json)."""
    import pyarrow.parquet as pq  # deferred: pyarrow, only for the per-problem tables

    frames = []
    for data in read_eval_results(run_dir):
        samples = Path(data["path"]).with_suffix(".parquet")
        if not data["final"] or not samples.is_file():
            continue
        try:
            table = pq.read_table(samples, columns=["problem_id", "correct"]).to_pandas()
        except (OSError, ValueError) as err:
            log.warning("%s: unreadable samples (%s)", samples, err)
            continue
        # a sample without a verdict (null `correct`) leaves its problem's count NaN, which compare_arms refuses
        # naming the row, rather than a sum that would count it as wrong
        counts = (
            table.assign(_unjudged=table["correct"].isna())
            .groupby("problem_id", sort=True)
            .agg(correct=("correct", "sum"), n=("correct", "size"), _unjudged=("_unjudged", "any"))
            .reset_index()
        )
        unjudged = counts.pop("_unjudged")
        if unjudged.any():
            log.warning("%s: %d problem(s) with a sample without a verdict", samples, int(unjudged.sum()))
            counts["correct"] = counts["correct"].astype(float).mask(unjudged)
        settings = {k: result_setting(data, k) for k in RESULT_SETTINGS if k != "n"}  # n: the samples drawn, counted
        frames.append(
            counts.rename(columns={"problem_id": "problem"}).assign(
                **ident, benchmark=str(data["benchmark"]), **settings
            )
        )
    return frames


def collect_problems(root: Path | list[Path]) -> pd.DataFrame:
    """Per-problem results of every run's final evaluations: the input of `compare.compare_arms`.

    One row per (run, benchmark, evaluation setting, problem): sweep, run, label, rule, arm, seed,
    benchmark, the evaluation settings (record.RESULT_SETTINGS), problem (problem id), correct (samples
    judged correct) and n (samples drawn for the problem, counted: the setting n). Results without
    stored samples contribute no rows.
    """
    frames = [f for run_dir, ident, _ in _runs(root) for f in _problem_rows(run_dir, ident)]
    if not frames:
        return pd.DataFrame(columns=list(dict.fromkeys(PROBLEM_COLUMNS)))
    df = pd.concat(frames, ignore_index=True)
    df["seed"] = df["seed"].astype("Int64")
    return df[list(dict.fromkeys(PROBLEM_COLUMNS))]


def _metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Long rows of metrics.jsonl; unreadable lines (a crash's torn last line) are skipped and logged."""
    records, bad = scan_metrics(run_dir)
    for n, _ in bad:
        log.warning("%s/metrics.jsonl:%d: skipped an unparsable line (truncated by a crash?)", run_dir, n)
    rows = []
    for record in records:
        for metric, value in record.items():
            if metric in ("step", "time") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                rows.append({"step": int(record["step"]), "metric": metric, "value": float(value)})
    return rows


def collect_training(root: Path | list[Path]) -> pd.DataFrame:
    """Training metrics of every run (metrics.jsonl), long format.

    Columns: sweep, run, label, rule, arm, seed, step, metric, value.
    """
    frames = []
    for run_dir, ident, _ in _runs(root):
        rows = _metric_rows(run_dir)
        if rows:
            frames.append(pd.DataFrame(rows).assign(**ident))
    if not frames:
        return pd.DataFrame(columns=TRAIN_COLUMNS)
    df = pd.concat(frames, ignore_index=True)[TRAIN_COLUMNS]
    df["seed"] = df["seed"].astype("Int64")
    return df


def run_states(root: Path | list[Path]) -> pd.DataFrame:
    """One row per run: sweep, run, label, rule, arm, seed, state, attempts, error, path.

    `state` is status.json's state, "unknown" when the file is missing, "corrupt" when unreadable. The
    frame doubles as the `expected` runs of `results_table`.
    """
    rows = []
    for run_dir, ident, _ in _runs(root):
        status = read_status(run_dir) or {}
        if status.get("state") == "corrupt":
            log.warning("%s", status["error"])
        rows.append(
            {
                **ident,
                "state": status.get("state", "unknown"),
                "attempts": status.get("attempts"),
                "error": status.get("error"),
                "code": code_version(status),
                "path": str(run_dir),
            }
        )
    df = pd.DataFrame(rows, columns=STATE_COLUMNS)
    df["seed"] = df["seed"].astype("Int64")
    return df


def settings_label(row) -> str:
    """ "n=32, T=1.0, top-p=0.7, max tokens 4096, math_verify" for a result row."""
    return (
        f"n={row['n']}, T={row['temperature']}, top-p={row['top_p']}, max tokens {row['max_tokens']}, {row['verifier']}"
    )


def select_settings(
    final: pd.DataFrame, where: dict[str, Any] | None = None, mix: bool = False
) -> tuple[pd.DataFrame, list[str]]:
    """Keep, per benchmark, results of one evaluation setting so a column never mixes settings.

    `where` keeps only results with those settings (e.g. {"n": 64}). Then, per benchmark, the
    setting most runs have is used when every run with a result has it (other settings are named
    in a note); otherwise `SettingsMismatch` names the settings and their runs, unless `mix`, which
    keeps each run's result under the common setting where it has one, else its own, with a note.
    """
    if final.empty or not set(SETTING_COLUMNS) <= set(final.columns):
        return final, []
    for key, value in (where or {}).items():
        if key not in SETTING_COLUMNS:
            raise SettingsMismatch(f"--where {key}: unknown setting; valid: {', '.join(SETTING_COLUMNS)}")
        final = final[final[key].astype(str) == str(value)]
    final = final.assign(_settings=final.apply(settings_label, axis=1) if len(final) else pd.Series(dtype=str))
    kept, notes = [], []
    for bench, rows in final.groupby("benchmark", sort=True):
        groups = rows.groupby("_settings")["run"].agg(lambda r: sorted(set(r)))
        runs = set(rows["run"])
        best = max(groups.index, key=lambda g: (len(groups[g]), g))
        others = [g for g in groups.index if g != best]
        if set(groups[best]) == runs:
            if others:
                notes.append(
                    f"{bench}: also evaluated with "
                    + "; ".join(f"{g} ({len(groups[g])} runs)" for g in others)
                    + "; not shown (choose with --where)."
                )
            kept.append(rows[rows["_settings"] == best])
        elif mix:
            own = rows[(rows["_settings"] == best) | ~rows["run"].isin(groups[best])]
            kept.append(own)
            notes.append(
                f"{bench}: cells mix evaluation settings (--mix-settings): "
                + "; ".join(f"{g} (runs {', '.join(groups[g])})" for g in groups.index)
                + "."
            )
        else:
            raise SettingsMismatch(
                f"{bench}: runs were evaluated with different settings ("
                + "; ".join(f"{g}: {len(groups[g])} runs" for g in groups.index)
                + "); one column would mix them: choose one "
                "with --where KEY=VALUE, or pass --mix-settings"
            )
    return pd.concat(kept).drop(columns="_settings"), notes
