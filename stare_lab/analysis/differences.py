"""What a results table claims: each arm's difference to the baseline with its interval (compare.py).

From the runs a table shows (tables.results_table's `values`) and their per-problem samples
(collect.collect_problems): the compare_arms input, the refusals (arms on other problems or
settings, a missing baseline), the caption, the notes under the table and the seeds-needed table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from stare_lab.analysis.compare import (
    AVG_COLUMN,
    METHOD_SHORT,
    TWO_SEEDS,
    ComparisonError,
    compare_arms,
)
from stare_lab.analysis.power import seeds_needed
from stare_lab.core.controls import BASE
from stare_lab.record import RESULT_SETTINGS

_SAMPLE_KEYS = [k for k in RESULT_SETTINGS if k != "n"]  # collect_problems counts n per problem


def check_comparable(values: pd.DataFrame, baseline: str, benchmarks: list[str]) -> None:
    """Refuse (ComparisonError, one line) what a comparison with `baseline` can not mean."""
    arms = sorted(set(values["arm"]))
    if baseline not in arms:
        raise ComparisonError(
            f"baseline arm {baseline!r} has no results; arms: {', '.join(arms) or 'none'} "
            "(choose one with --baseline ARM, or --baseline none for means only)"
        )
    for bench in benchmarks:
        rows = values[values["column"] == bench]
        if rows.empty or set(rows["arm"]) == {baseline}:
            continue
        if baseline not in set(rows["arm"]):
            raise ComparisonError(f"benchmark {bench!r}: the baseline {baseline!r} has no results there")
        keys = [k for k in RESULT_SETTINGS if k in rows.columns]
        settings = rows[keys].astype(str).agg(", ".join, axis=1)
        if settings.nunique() > 1:
            groups = rows.groupby(settings)["run"].agg(lambda r: len(set(r)))
            raise ComparisonError(
                f"benchmark {bench!r}: arms were evaluated under different settings or problem sets "
                f"({'; '.join(f'{keys_text(keys, s)}: {n} runs' for s, n in groups.items())}); "
                "they can not be compared (choose one with --where, or --baseline none)"
            )


def keys_text(keys: list[str], joined: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, joined.split(", "), strict=False))


def comparison_input(
    values: pd.DataFrame, per_problem: pd.DataFrame, benchmarks: list[str]
) -> tuple[pd.DataFrame, list[str]]:
    """compare_arms' input for the runs of `values`, and the benchmarks whose runs all kept samples."""
    keep = values[values["column"].isin(benchmarks)].drop_duplicates(["run", "column"])
    keys = ["run", "benchmark", *[k for k in _SAMPLE_KEYS if k in keep.columns and k in per_problem.columns]]
    wanted = keep[keys + ["arm", "seed", "n"]].rename(columns={"n": "_n"})  # values' benchmark is its column
    samples = per_problem.drop(columns=["arm", "seed"], errors="ignore")
    joined = _keyed(samples, keys).merge(_keyed(wanted, keys), on=keys)
    joined = joined[joined["n"].astype(str) == joined["_n"].astype(str)]
    covered = joined.groupby("benchmark")["run"].agg(lambda r: set(r))
    complete = [b for b in benchmarks if covered.get(b, set()) == set(keep.loc[keep["column"] == b, "run"])]
    joined = joined[joined["benchmark"].isin(complete)]
    # a seed is one run of its arm: two runs of an arm with one seed (warned about) stay two seeds, unpaired
    runs = joined.drop_duplicates(["arm", "run"])
    twice = runs.duplicated(["arm", "seed"], keep=False) | runs["seed"].isna()
    label = runs["seed"].astype(str).where(~twice, runs["seed"].astype(str) + ":" + runs["run"].astype(str))
    joined = joined.assign(seed=joined["run"].map(dict(zip(runs["run"], label, strict=True))))
    return joined[["arm", "seed", "benchmark", "problem", "correct", "n"]], complete


def _keyed(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Join keys as text, numbers by value (30 and 30.0 are one num_problems; a missing one is "nan")."""

    def text(v) -> str:
        if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
            return f"{float(v):g}"
        return str(v)

    return frame.assign(**{k: frame[k].map(text) for k in keys})


def compare_values(
    values: pd.DataFrame,
    per_problem: pd.DataFrame | None,
    baseline: str,
    benchmarks: list[str],
    comparable: list[str],
    confidence: float,
    seed: int,
) -> tuple[pd.DataFrame | None, list[str]]:
    """compare_arms over the table's runs of the `comparable` benchmarks (None when none kept samples)
    and notes on what was left out; the Avg. row only when every benchmark of the table is in."""
    if per_problem is None or per_problem.empty:
        return None, ["No per-problem samples: differences have no interval and nothing is in bold."]
    data, complete = comparison_input(values, per_problem, comparable)
    notes = [f"{b}: not every run kept its per-problem samples: no interval." for b in comparable if b not in complete]
    if not complete or data.empty or set(data["arm"]) == {baseline}:
        return None, notes
    comparison = _families(data, baseline, confidence, seed)
    if len(complete) < len(benchmarks):
        comparison = comparison[comparison["benchmark"] != AVG_COLUMN]  # an Avg. over fewer benchmarks differs
    return comparison.reset_index(drop=True), notes


def _families(data: pd.DataFrame, baseline: str, confidence: float, seed: int) -> pd.DataFrame:
    """compare_arms with two Holm families: the arms against the baseline, and, apart, the baseline's RL
    gain over `base` (the untrained model). The gain is the table's own check that training did anything,
    declared by `controls: [base]`, not one of the comparisons of rules; in the arms' family its p-value
    would take a Holm step from every rule (and need p < α/m itself), so it is a family of one."""
    arms = set(data["arm"])
    if baseline == BASE:  # --baseline base: every arm's gain over the untrained model, one family
        return compare_arms(data, baseline=baseline, confidence=confidence, seed=seed)
    parts = []
    if arms - {baseline, BASE}:
        parts.append(compare_arms(data[data["arm"] != BASE], baseline=baseline, confidence=confidence, seed=seed))
    if BASE in arms and baseline != BASE:
        gain = data[data["arm"].isin([BASE, baseline])]
        parts.append(compare_arms(gain, baseline=baseline, confidence=confidence, seed=seed))
    return pd.concat(parts, ignore_index=True)


def attach(cells: pd.DataFrame, comparison: pd.DataFrame | None, delta: float) -> pd.DataFrame:
    """cells + ci_lo, ci_hi (fractions), p_value, p_holm, verdict, excludes_0 (the per-comparison interval),
    seeds_needed (for `delta` points), bold (better or worse after Holm) and dagger (the interval excludes 0
    while the verdict after Holm is "n.s.": shown with †, never bold)."""
    cols = ["ci_lo", "ci_hi", "p_value", "p_holm", "verdict", "excludes_0", "seeds_needed"]
    if comparison is None or comparison.empty:
        empty = {c: math.nan for c in cols if c not in ("verdict", "excludes_0")}
        return cells.assign(**empty, verdict="", excludes_0=False, bold=False, dagger=False)
    found = comparison.rename(columns={"arm": "rule"})
    found = found.assign(ci_lo=found["ci_lo"] / 100, ci_hi=found["ci_hi"] / 100)
    found["seeds_needed"] = seeds_needed(comparison, delta=delta)["seeds_needed"].to_numpy()
    out = cells.merge(found[["rule", "benchmark", *cols]], on=["rule", "benchmark"], how="left")
    out["verdict"] = out["verdict"].fillna("")
    out["excludes_0"] = out["excludes_0"].astype("boolean").fillna(False).astype(bool)
    out["bold"] = out["verdict"].isin(["better", "worse"])
    out["dagger"] = out["excludes_0"] & ~out["bold"]
    return out


def _arms_compared(comparison: pd.DataFrame) -> int:
    """The most arms Holm corrected over in one column (the tests with a p-value)."""
    tested = comparison[comparison["p_value"].notna() & (comparison["arm"] != BASE)]  # base: a family of its own
    return int(tested.groupby("benchmark")["arm"].nunique().max()) if len(tested) else 0


def _holm_only(comparison: pd.DataFrame) -> pd.DataFrame:
    """Rows whose per-comparison interval excludes 0 while the verdict after Holm is "n.s." (shown with †)."""
    return comparison[comparison["excludes_0"].astype(bool) & (comparison["verdict"] == "n.s.")]


def _two_seeds(comparison: pd.DataFrame) -> bool:
    return bool((comparison["note"].astype(str) == TWO_SEEDS).any())


def caption(
    metric: str, comparison: pd.DataFrame | None, values: pd.DataFrame, baseline: str | None, confidence: float
) -> str:
    """The method, the confidence, the seeds and the problems, in one sentence; the intervals are said to be
    per comparison, the bold to be Holm's."""
    seeds = values.drop_duplicates(["arm", "run"]).groupby("arm")["run"].size()
    seed_text = f"{seeds.min()}" if len(seeds) and seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    text = f"{metric} in %, {values['arm'].nunique()} arms × {seed_text} seeds"
    if comparison is None or comparison.empty or baseline is None:
        return text + "; mean ± std over seeds, no intervals."
    per_bench = comparison[comparison["benchmark"] != AVG_COLUMN].drop_duplicates("benchmark")
    problems = ", ".join(f"{b} {int(p)}" for b, p in zip(per_bench["benchmark"], per_bench["problems"], strict=True))
    m = _arms_compared(comparison) if comparison["p_value"].notna().any() else 0
    method = METHOD_SHORT + ("; at 2 seeds the seed part at t(1)" if _two_seeds(comparison) else "")
    dagger = f"; †: the interval excludes 0 but p_holm ≥ {1 - confidence:.2g}" if len(_holm_only(comparison)) else ""
    return (
        f"{text}; problems: {problems}. Differences to {baseline} in points with per-comparison {confidence:.0%} "
        f"intervals over seeds and problems ({method}), not adjusted for the {m} arms; bold: better/worse after "
        f"Holm's correction over the {m} arms (p_holm < {1 - confidence:.2g}){dagger}."
    )


def method_notes(comparison: pd.DataFrame | None, baseline: str, confidence: float) -> list[str]:
    if comparison is None or comparison.empty:
        return []
    m = _arms_compared(comparison) if comparison["p_value"].notna().any() else 0
    paired = comparison["paired"].fillna(False).astype(bool)
    some = " (and by seed where seeds match)" if paired.any() else ""
    pairing = "by problem" + (" and by seed" if paired.all() else some)
    notes = [
        f"Intervals: {confidence:.0%} per comparison (each difference on its own, not adjusted for the other "
        f"arms), seeds and problems as crossed random effects, paired {pairing}, t with Satterthwaite's df "
        f"(stare_lab.analysis.compare_arms). p-values are Holm-corrected over the {m} arms compared with "
        f"{baseline} in each column; bold where p_holm < {1 - confidence:.2g} (better/worse); every other "
        "difference is not distinguishable from noise. p-values: results.csv."
    ]
    alpha = 1 - confidence
    holm_only = _holm_only(comparison)
    if len(holm_only):
        items = ", ".join(
            f"{r.arm} on {r.benchmark} (p {r.p_value:.2g}, p_holm {r.p_holm:.2g})" for r in holm_only.itertuples()
        )
        notes.append(
            f"†: the per-comparison interval excludes 0, but after Holm's correction over the {m} arms p_holm ≥ "
            f"{alpha:.2g}, so the difference is not distinguishable from noise across the table: {items}."
        )
    if _two_seeds(comparison):
        notes.append(
            "2 seeds: the seed variance rests on 1 degree of freedom, so in those intervals the seed part takes "
            "t with 1 df and the problem part its own df (half-width √(t(1)² · seed part + t(ν)² · problem part)), "
            "which holds the 95% level however seed and problem variance balance (Satterthwaite's df did not: "
            'docs/statistics.md, "Two seeds"); they are wide where the seeds vary, and only a difference large on '
            "both seeds can be bold. A third seed narrows them most."
        )
    if comparison["note"].astype(str).str.startswith("seed").any():
        notes.append("One seed: the seed variance is unknown, so those intervals cover problems and sampling only.")
    return notes


def seeds_markdown(comparison: pd.DataFrame | None, columns: list, delta: float = 2.0, power: float = 0.8,
                   confidence: float = 0.95) -> str:  # fmt: skip
    """The seeds-needed table: rule × column, seeds per arm for a `delta`-point difference at `power`."""
    if comparison is None or comparison.empty:
        return "Seeds needed: no intervals (no per-problem samples or no arm besides the baseline).\n"
    need = seeds_needed(comparison, delta=delta, power=power, confidence=confidence)
    shown = [c for c in columns if c in set(need["benchmark"])]
    lines = [
        f"Seeds per arm (the arm and the baseline alike) to detect a {delta:g}-point difference with power "
        f"{power:g} (two-sided, α = {1 - confidence:.2g} per comparison, the same problems), from the observed "
        "seed and problem variance:",
        "",
        "| rule | seeds now | " + " | ".join(str(c) for c in shown) + " |",
        "|:--|--:|" + "--:|" * len(shown),
    ]
    by = need.set_index(["arm", "benchmark"])
    for arm in dict.fromkeys(need["arm"]):
        now = int(need.loc[need["arm"] == arm, "seeds"].min())
        cells = [_seeds_text(by.loc[(arm, c)]) if (arm, c) in by.index else "–" for c in shown]
        lines.append(f"| {arm} | {now} | " + " | ".join(cells) + " |")
    lines += ["", "∞: more problems are needed (their variation alone keeps the power below target); ?: one seed."]
    return "\n".join(lines) + "\n"


def _seeds_text(row) -> str:
    value = row["seeds_needed"]
    if not np.isfinite(value):
        return "?" if np.isnan(value) else ("∞" if row["limit"] == "problems" else str(row["limit"]))
    return str(int(value))


def seeds_line(comparison: pd.DataFrame | None, delta: float = 2.0) -> str | None:
    """One line for LaTeX: seeds per arm for `delta` points on the aggregate column."""
    if comparison is None or comparison.empty:
        return None
    need = seeds_needed(comparison, delta=delta)
    col = AVG_COLUMN if (need["benchmark"] == AVG_COLUMN).any() else need["benchmark"].iloc[0]
    part = need[need["benchmark"] == col]
    items = ", ".join(f"{r['arm']} {_seeds_text(r)}" for _, r in part.iterrows())
    return f"Seeds per arm for a {delta:g}-point difference at power 0.8 ({col}): {items}."
