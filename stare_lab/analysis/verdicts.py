"""A sweep's claims decided from its records: the frames each claim reads, and `decide` over them.

`decide(claims, problems, training)` works on in-memory frames (what a simulation passes): `problems`
one row per (arm, seed, benchmark, problem) with correct and n (collect.collect_problems' columns),
`training` one row per (arm, run, step, metric) with its value (collect.collect_training's). It returns
hypotheses.verdicts' frame. `sweep_frames(runs)` reads those frames from run folders: finished runs
only, one evaluation setting per benchmark (the one the claim's avg@n or pass@k needs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stare_lab.analysis.compare import ComparisonError
from stare_lab.analysis.hypotheses import ALPHA, Outcome, score_outcome, score_tables, seed_outcome, verdicts
from stare_lab.plan.claims import Claim, Quantity
from stare_lab.record import (
    RESULT_SETTINGS,
    problem_counts,
    read_eval_results,
    read_metric_values,
    read_status,
    result_setting,
)
from stare_lab.record.frames import _runs  # one parse of each config, arms named as everywhere


def decide(claims: list[Claim], problems: pd.DataFrame, training: pd.DataFrame | None, alpha: float = ALPHA):
    """Each claim's outcome (a text where its data are missing), Holm over the claims, the verdicts."""
    return verdicts(claims, [claim_outcome(c, problems, training, alpha) for c in claims], alpha)


def claim_outcome(claim: Claim, problems: pd.DataFrame, training: pd.DataFrame | None, alpha: float = ALPHA):
    """One claim's Outcome before Holm, or the text saying why its data can not decide it."""
    try:
        return _outcome(claim, problems, training, alpha)
    except ComparisonError as e:
        return str(e)


def _outcome(claim: Claim, problems: pd.DataFrame, training: pd.DataFrame | None, alpha: float) -> Outcome | str:
    q = claim.quantity
    if q.kind == "metric":
        values = metric_values(training, q, claim.arms)
    else:
        rows = _setting_rows(problems[problems["arm"].isin(claim.arms)], q)
        if "settings" in rows.columns and (rows.groupby("benchmark")["settings"].nunique() > 1).any():
            mixed = rows.groupby(["benchmark", "settings"])["arm"].unique()
            raise ComparisonError(
                "the arms were evaluated under different settings: "
                + "; ".join(f"{b} {s}: {', '.join(a)}" for (b, s), a in mixed.items())
            )
        if q.kind == "score":
            arms = score_tables(rows, claim)
            lacking = [a for a in claim.arms if a not in arms]
            if lacking:
                return f"no {q.score}@{q.k} results of {', '.join(lacking)}"
            return score_outcome(claim, arms, alpha)
        values = seed_scores(rows, q, claim.arms)
    lacking = [f"{a} ({len(values.get(a, []))})" for a in claim.arms if len(values.get(a, [])) < 2]
    if lacking:
        return f"runs with {q.name}: {', '.join(lacking)}; a comparison over seeds needs ≥ 2 per arm"
    if q.kind == "spread" and min(len(v) for v in values.values()) < 3:
        return "a seed spread needs ≥ 3 finished runs per arm"
    return seed_outcome(claim, values, alpha, spread=q.kind == "spread")


def _setting_rows(problems: pd.DataFrame, q: Quantity) -> pd.DataFrame:
    """avg@N: the results drawn with n = N; pass@K: those with the fewest samples n ≥ K per benchmark."""
    if q.score == "avg":
        return problems[problems["n"] == q.k]
    rows = problems[problems["n"] >= q.k]
    fewest = rows.groupby("benchmark")["n"].transform("min")
    return rows[rows["n"] == fewest]


def seed_scores(problems: pd.DataFrame, q: Quantity, arms: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each run's final avg@n (mean over problems of c/n; over several benchmarks their mean), per arm."""
    rows = problems[problems["arm"].isin(arms)]
    if q.benchmarks:
        rows = rows[rows["benchmark"].isin(q.benchmarks)]
    per = rows.assign(score=rows["correct"] / rows["n"]).groupby(["arm", "seed", "benchmark"])["score"].mean()
    runs = per.groupby(["arm", "seed"]).agg(["mean", "size"])
    wanted = len(q.benchmarks) or rows.groupby("arm")["benchmark"].nunique().min()
    runs = runs[runs["size"] == wanted]
    return {a: g["mean"].to_numpy(float) for a, g in runs.groupby(level="arm")}


def metric_values(training: pd.DataFrame | None, q: Quantity, arms: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each run's value of the metric (its last logged value, or its mean over the window), per arm."""
    if training is None or training.empty:
        return {}
    unit = "run" if "run" in training.columns else "seed"
    rows = training[(training["metric"] == q.metric) & training["arm"].isin(arms)]
    rows = rows[np.isfinite(rows["value"].to_numpy(float))]
    if q.steps is not None:
        rows = rows[(rows["step"] >= q.steps[0]) & (rows["step"] <= q.steps[1])]
    elif q.last_steps:
        last = rows.groupby(["arm", unit])["step"].transform("max")
        rows = rows[rows["step"] > last - q.last_steps]
    else:
        rows = rows.sort_values("step").groupby(["arm", unit]).tail(1)
    per = rows.groupby(["arm", unit])["value"].mean()
    return {a: g.to_numpy(float) for a, g in per.groupby(level="arm")}


# -- from the records ------------------------------------------------------------------------------


def sweep_frames(runs, claims: list[Claim]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(problems, training, states) of the runs (a folder or run folders): the per-problem counts of every
    final evaluation and the claims' training metrics, of the finished runs of the claims' arms, and every
    run's state. Only what the claims read is read (`stare-lab claims` over 500 runs: docs/performance.md)."""
    arms = {a for c in claims for a in c.arms}
    metrics = sorted({c.quantity.metric for c in claims if c.quantity.kind == "metric"})
    metric_arms = {a for c in claims if c.quantity.kind == "metric" for a in c.arms}
    states: list[dict] = []
    problems: dict[str, list] = {k: [] for k in PROBLEMS}
    training: dict[str, list] = {k: [] for k in TRAIN}
    for run_dir, ident, _ in _runs(runs):
        state = (read_status(run_dir) or {}).get("state", "unknown")
        states.append({**ident, "state": state, "path": str(run_dir)})
        if state != "finished" or ident["arm"] not in arms:
            continue
        for result in read_eval_results(run_dir):
            samples = Path(result["path"]).with_suffix(".parquet")
            if result["final"] and samples.is_file():
                ids, correct, n = problem_counts(samples)
                settings = ", ".join(str(result_setting(result, k)) for k in RESULT_SETTINGS if k != "num_problems")
                _extend(problems, ident, len(ids), problem=ids, correct=correct, n=n,
                        benchmark=[str(result["benchmark"])] * len(ids), settings=[settings] * len(ids))  # fmt: skip
        if ident["arm"] in metric_arms:
            for metric, pairs in read_metric_values(run_dir, metrics).items():
                steps, values = zip(*pairs, strict=True) if pairs else ((), ())
                _extend(training, ident, len(steps), step=steps, value=values, metric=[metric] * len(steps))
    problems_frame = pd.DataFrame({k: np.concatenate(v) if v else [] for k, v in problems.items()})
    problems_frame = problems_frame.assign(correct=problems_frame["correct"].astype(float))
    if len(problems_frame):
        problems_frame = problems_frame.assign(seed=_seed_labels(problems_frame))
    training_frame = pd.DataFrame({k: np.concatenate(v) if v else [] for k, v in training.items()})
    return problems_frame, training_frame, pd.DataFrame(states)


PROBLEMS = ["arm", "seed", "run", "benchmark", "settings", "problem", "correct", "n"]
TRAIN = ["arm", "seed", "run", "step", "metric", "value"]


def _extend(columns: dict[str, list], ident: dict, length: int, **arrays) -> None:
    """Append one run's arrays, its arm, seed and run repeated on every row."""
    for key in ("arm", "seed", "run"):
        columns[key].append(np.full(length, ident[key], dtype=object))
    for key, values in arrays.items():
        text = key in ("problem", "benchmark", "settings", "metric")
        columns[key].append(np.asarray(values, dtype=object if text else None))


def _seed_labels(problems: pd.DataFrame) -> pd.Series:
    """The seed of each row; two runs of one arm with one seed (or none) stay two seeds (seed:run)."""
    runs = problems.drop_duplicates(["arm", "run"])
    twice = runs.duplicated(["arm", "seed"], keep=False) | runs["seed"].isna()
    label = runs["seed"].astype(str).where(~twice, runs["seed"].astype(str) + ":" + runs["run"].astype(str))
    return problems["run"].map(dict(zip(runs["run"], label, strict=True)))


def missing_metrics(claims: list[Claim], training: pd.DataFrame) -> str | None:
    """The first claim whose metric no finished run of one of its arms logged (a refusal, one line)."""
    if training.empty:
        logged: dict[str, set] = {}
    else:
        logged = {a: set(g["metric"].unique()) for a, g in training.groupby("arm")}
    for claim in claims:
        q = claim.quantity
        if q.kind != "metric":
            continue
        for arm in claim.arms:
            if arm in logged and q.metric not in logged[arm]:
                some = ", ".join(sorted(m for m in logged[arm] if "/" not in m)[:8])
                return f"claim {claim.id}: the runs of arm {arm!r} did not log {q.metric!r} (they logged {some}, ...)"
    return None


def not_finished(states: pd.DataFrame) -> str | None:
    """A note naming the runs left out because they did not finish."""
    other = states[states["state"] != "finished"]
    if other.empty:
        return None
    counts = ", ".join(f"{n} {s}" for s, n in other["state"].value_counts().items())
    return f"{len(other)} of {len(states)} runs are not finished ({counts}) and are left out."
