"""The lines under a table: evaluation settings, disagreements, missing runs, duplicate seeds, code versions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from stare_lab.config.inputs import benchmark_source
from stare_lab.core.controls import BASE, CONTROLS
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
            source = benchmark_source(b)
            if source and source.startswith("builtin:"):
                sources.append(f"{b}: the built-in {source.split(':', 1)[1]} task's held-out split")
            elif source:
                sources.append(f"{b}: {Path(source).name if Path(source).is_file() else source}")
    return labels, ([f"Problems: {'; '.join(sources)}."] if sources else [])


# ---- settings other than the rule (issue 26.6) ------------------------------------------------------------------

# Config keys a table's arms may differ in besides their rule, read from each run's config.yaml: how the policy is
# trained and on what (the trainer, the model, the task, the world size) and the rule's scope; not the rule's own
# parameters (they are the rule), not how evaluation samples (the settings line says that), and not the keys
# below, which change how often a run saves, logs or keeps batches, or its memory, not what it computes.
SETTING_PREFIXES = ("cfg.trainer.", "cfg.model.", "cfg.task.")
SETTING_KEYS = ("cfg.method.params.scope", "cfg.run.processes")
NOT_COMPUTING = frozenset(
    {
        "save_steps", "save_total_limit", "logging_steps", "grad_geometry_every", "keep_batches_every",
        "stats_chunk_tokens", "attn_chunk_queries", "js_chunk_positions", "ddp_timeout_s", "gradient_checkpointing",
        "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_server_gpus", "vllm_server_node",
    }
)  # fmt: skip
AGGREGATION = "loss aggregation"


def _aggregation(cfg: pd.Series) -> str | None:
    """How a run averages its per-token loss: verl's token mean per micro-batch (scope microbatch with
    trainer.microbatch_aggregation verl, the default) or TRL's loss_type; None where the record does not say."""
    scope = cfg.get("cfg.method.params.scope")
    if scope == "microbatch" and cfg.get("cfg.trainer.microbatch_aggregation", "verl") in ("verl", None):
        return "verl's token mean per micro-batch"
    loss_type = cfg.get("cfg.trainer.loss_type")
    return None if _absent(loss_type) else f"TRL's {loss_type}"


def _absent(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _counts(key: str, cfg: pd.Series) -> bool:
    """Whether `key` (a cfg.* column) is a training setting of this run (see SETTING_PREFIXES)."""
    leaf = key.rsplit(".", 1)[-1]
    if key in SETTING_KEYS:
        return True
    if not key.startswith(SETTING_PREFIXES) or leaf in NOT_COMPUTING:
        return False
    if any(word in leaf.lower() for word in ("seed", "dir", "path", "output")):
        return False  # differ per run by construction (arms.splits_arm)
    if leaf.startswith("vllm_") and cfg.get("cfg.trainer.use_vllm") is not True:
        return False
    if leaf.startswith("microbatch_") and cfg.get("cfg.method.params.scope") != "microbatch":
        return False
    if leaf == "distributed" and int(cfg.get("cfg.run.processes") or 1) <= 1:
        return False
    return True


def _value_text(value) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:g}"
    return str(value)


def arm_settings(values: pd.DataFrame) -> pd.DataFrame:
    """arm × setting: each arm's training settings besides its rule (one run per arm: the runs of an arm share
    them, collect splits arms that do not), with the derived "loss aggregation"; NaN where a record lacks one."""
    if values.empty:
        return pd.DataFrame()
    first = values.drop_duplicates("arm").set_index("arm")
    cfg_cols = [c for c in first.columns if c.startswith("cfg.")]
    rows = {}
    for arm, cfg in first[cfg_cols].iterrows():
        row = {k.removeprefix("cfg."): cfg[k] for k in cfg_cols if _counts(k, cfg) and not _absent(cfg[k])}
        aggregation = _aggregation(cfg)
        if aggregation is not None:
            row[AGGREGATION] = aggregation
        rows[str(arm)] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def confound_notes(values: pd.DataFrame, baseline: str | None) -> list[str]:
    """One note naming every setting besides the rule in which the table's arms differ, with each value's arms
    (the baseline's value first), and the matched control where the table has one (an arm with the baseline's
    rule at the other value); nothing when the arms differ only in their rule."""
    # base trains 0 steps: its trainer settings do not act, and it differs from every arm by design
    settings = arm_settings(values).drop(index=BASE, errors="ignore")
    if settings.empty or len(settings) < 2:
        return []
    rule_of = values.drop_duplicates("arm").set_index("arm")["rule"].astype(str).to_dict()
    base_rule = rule_of.get(baseline) if baseline is not None else None
    parts, controls_missing = [], False
    order = [AGGREGATION] + sorted(c for c in settings.columns if c != AGGREGATION)
    for key in [k for k in order if k in settings.columns]:
        column = settings[key].dropna()
        if len(column) < 2:
            continue
        texts = column.map(_value_text)
        if texts.nunique() < 2:
            continue
        groups = {v: sorted(texts.index[texts == v]) for v in texts.unique()}
        first = texts.get(baseline) if baseline in texts.index else None
        ranked = sorted(groups, key=lambda v: (v != first, -len(groups[v]), v))
        items = []
        for v in ranked:
            arms = groups[v]
            shown = _arm_list(arms, baseline)
            control = [
                a
                for a in arms
                if a != baseline and a not in CONTROLS and base_rule is not None and rule_of.get(a) == base_rule
            ]
            if v != first and first is not None:
                if set(arms) <= set(CONTROLS):  # the control differs from the baseline in this setting by design
                    shown += ": the control"
                elif control:
                    shown += f"; matched control: {', '.join(control)}"
                else:
                    controls_missing = True
            items.append(f"{v} ({shown})")
        parts.append(f"{key}: " + ", ".join(items))
    if not parts:
        return []
    text = "Arms differ in more than their rule (from each run's config.yaml): " + "; ".join(parts) + "."
    if baseline is not None and baseline in settings.index:
        text += (
            f" A difference to {baseline} then mixes the rule with these settings"
            + (
                "; compare an arm with a matched control (the baseline's rule at the arm's setting; "
                'docs/sweeps.md, "Matched controls")'
                if controls_missing
                else "; compare each such arm with its matched control named here"
            )
            + "."
        )
    return [text]


def _arm_list(arms: list[str], baseline: str | None, most: int = 4) -> str:
    """ "a, b, c"; the baseline's group, when long, as "full and 15 other arms" (every arm that differs from the
    baseline is named)."""
    if baseline not in arms or len(arms) <= most:
        return ", ".join(([baseline] if baseline in arms else []) + [a for a in arms if a != baseline])
    return f"{baseline} and {len(arms) - 1} other arms"
