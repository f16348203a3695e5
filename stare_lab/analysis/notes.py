"""The lines under a table: evaluation settings, disagreements, missing runs, duplicate seeds, code versions."""

from __future__ import annotations

import pandas as pd

from stare_lab.record import EVAL_SETTINGS, SETTING_DEFAULTS

_SHORT = {"temperature": "T", "top_p": "top-p", "max_tokens": "max tokens"}
# sampling first, as papers state them: "T=1.0, top-p=0.7, n=32, max tokens=..., verifier=..."
SETTING_LABELS = {k: _SHORT.get(k, k) for k in sorted(EVAL_SETTINGS, key=lambda k: k not in ("temperature", "top_p"))}


def _fmt_setting(value) -> str:
    if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
        return f"{value:.1f}"
    return str(value)


def settings_notes(final: pd.DataFrame, benchmarks: list[str]) -> list[str]:
    """ "Evaluation: T=1.0, top-p=0.7, n=32; max tokens: aime24 4096, arithmetic 256; ..." plus one
    "settings disagree" line per (benchmark, setting) on which runs differ."""
    rows = final[final["benchmark"].isin(benchmarks)].drop_duplicates(["run", "benchmark"])
    common, per_bench, disagree = [], [], []
    for key, label in SETTING_LABELS.items():
        if key not in rows.columns:
            continue
        by_bench = {}
        for bench in benchmarks:
            sub = rows[rows["benchmark"] == bench]
            groups = sub.groupby(sub[key].map(_fmt_setting), sort=True)["run"].apply(sorted)
            if len(groups) > 1:
                parts = [f"{v} (runs {', '.join(r)})" for v, r in groups.items()]
                disagree.append(f"Settings disagree: {label} on {bench}: " + "; ".join(parts) + ".")
            by_bench[bench] = " / ".join(groups.index) if len(groups) else "?"
        values = set(by_bench.values())
        if values == {_fmt_setting(SETTING_DEFAULTS.get(key))}:
            continue  # the default engine (transformers) goes unsaid; vLLM is named
        if len(values) == 1:
            common.append(f"{label}={values.pop()}")
        else:
            per_bench.append(f"{label}: " + ", ".join(f"{b} {v}" for b, v in by_bench.items()))
    line = "Evaluation: " + ", ".join(common) + ("; " + "; ".join(per_bench) if per_bench else "") + "."
    return [line] + disagree


def missing_notes(final: pd.DataFrame, benchmarks: list[str], expected: pd.DataFrame | None) -> list[str]:
    """ "missing: ..." naming rules with no results, runs with no results and run × benchmark gaps."""
    have = final[final["benchmark"].isin(benchmarks)].groupby("run")["benchmark"].agg(set).to_dict()
    if expected is not None and len(expected):
        key = "arm" if "arm" in expected.columns else "rule"
        runs = expected.assign(arm=expected[key].astype(str))
    else:
        runs = final.drop_duplicates("run")
    items = []
    for arm, group in runs.groupby("arm", sort=True):
        empty = [r for r in group["run"] if not have.get(r)]
        if len(empty) == len(group):
            items.append(f"rule {arm} (no results: runs {', '.join(_describe(group, r) for r in empty)})")
            continue
        items += [f"run {_describe(group, r)} of {arm}" for r in empty]
        for r in group["run"]:
            gaps = [b for b in benchmarks if have.get(r) and b not in have[r]]
            if gaps:
                items.append(f"{', '.join(gaps)} of run {r} ({arm})")
    return ["missing: " + "; ".join(items) + "."] if items else []


def _describe(group: pd.DataFrame, run: str) -> str:
    row = group[group["run"] == run].iloc[0]
    extra = [f"seed {row['seed']}"] if "seed" in row and not pd.isna(row["seed"]) else []
    if "state" in row and isinstance(row["state"], str):
        extra.append(row["state"])
    return f"{run} [{', '.join(extra)}]" if extra else str(run)


def duplicate_notes(values: pd.DataFrame) -> list[str]:
    """Two runs of one arm with the same seed are not independent seeds: say so."""
    if "seed" not in values.columns or values.empty:
        return []
    seeded = values.dropna(subset=["seed"]).drop_duplicates(["arm", "seed", "run"])
    dup = seeded.groupby(["arm", "seed"])["run"].agg(sorted)
    return [
        f"Warning: {arm} has {len(r)} runs with seed {seed} ({', '.join(r)}), counted as separate samples."
        for (arm, seed), r in dup.items()
        if len(r) > 1
    ]


def code_notes(values: pd.DataFrame, expected: pd.DataFrame | None) -> list[str]:
    """A warning when the runs in the table came from different code versions (run_states' `code`)."""
    if expected is None or "code" not in expected.columns or values.empty:
        return []
    shown = expected[expected["run"].isin(set(values["run"]))]
    codes = shown["code"].fillna("unrecorded").value_counts().sort_index()
    if len(codes) < 2:
        return []
    return [
        "Warning: runs come from different code versions: "
        + ", ".join(f"{c} ({n} runs)" for c, n in codes.items())
        + "."
    ]


def benchmark_columns(final: pd.DataFrame, benchmarks: list[str]) -> tuple[dict[str, str], list[str]]:
    """({benchmark: column header with its number of problems}, one note saying where each column's
    problems come from): `math (20)` and "math: the task's held-out split, the first 20 problems of
    math500.jsonl" rather than a bare `math` for a slice of MATH-500."""
    from pathlib import Path

    labels, sources = {}, []
    for b in benchmarks:
        rows = final[final["benchmark"] == b]
        counts = sorted({int(n) for n in rows.get("num_problems", pd.Series(dtype=float)).dropna()})
        if counts:
            labels[b] = f"{b} ({'/'.join(map(str, counts))})"
        own = rows[rows["cfg.task.name"] == b] if "cfg.task.name" in rows.columns else rows.iloc[0:0]
        if len(own):
            source = own["cfg.task.heldout_source"].dropna() if "cfg.task.heldout_source" in own.columns else None
            limit = own["cfg.task.heldout_limit"].dropna() if "cfg.task.heldout_limit" in own.columns else None
            where = f"{Path(str(source.iloc[0])).name}" if source is not None and len(source) else "built in"
            first = f"the first {int(limit.iloc[0])} problems of " if limit is not None and len(limit) else ""
            sources.append(f"{b}: the task's held-out split, {first}{where}")
        else:
            from stare_lab.inputs import benchmark_source

            source = benchmark_source(b)
            if source and source.startswith("builtin:"):
                sources.append(f"{b}: the built-in {source.split(':', 1)[1]} task's held-out split")
            elif source:
                sources.append(f"{b}: {Path(source).name if Path(source).is_file() else source}")
    return labels, ([f"Problems: {'; '.join(sources)}."] if sources else [])
