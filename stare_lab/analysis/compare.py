"""Arms against a baseline: differences with intervals over seeds and problems, and Holm.

Method (`compare_arms`). Each arm's score on a benchmark is avg@n: the mean over problems of
c/n, averaged over its seeds. The difference D to the baseline is modelled with seeds and
problems as crossed random effects (the subjects × items design of Clark 1973; the ANOVA
moments of Searle, Casella & McCulloch, "Variance Components", ch. 4):

    y[a, s, p] = μ_a + π[a, p] + σ[a, s] + ε[a, s, p]          a arm, s seed, p problem

π: problem effects, shared by every arm (the same problems), so only the arm × problem part
of them, Var(π_A − π_B) = A, reaches D; σ: seed effects, Var = σ²_a; ε: seed × problem
interaction and the binomial noise of n samples, Var = ω²_a. With S_a seeds and P problems

    Var(D) = A / P + Σ_a σ²_a / S_a + Σ_a ω²_a / (S_a P)

The terms are estimated from mean squares: σ²_a + ω²_a / P as a whole by the variance of the
arm's seed means (never negative, so its S − 1 degrees of freedom always count), A by the
variance over problems of the seed-averaged difference less Σ ω²_a / S_a (ω²: the seed ×
problem residual mean square), set to 0 when negative. The interval is D ± t(ν) · √Var with ν
from Satterthwaite's formula over the mean squares used; the p-value is the same t-test's, so
p < 1 − confidence exactly when the interval excludes 0.
Pairing: problems always (π cancels). Seeds only where an arm and the baseline have the same
seed values: stare_lab's run seed sets the data order (run/runner.py: `data_seed=seed`), and the
analysis then works on the per-seed, per-problem differences (one "arm" in the formula above).
Elsewhere the two arms' seeds are independent.
The aggregate over benchmarks ("Avg.", the papers' average of per-benchmark scores) is the
same estimator on the weighted sum: problems of different benchmarks are independent, seed
effects are shared across benchmarks (it needs every seed on every benchmark).

Why this and not a bootstrap: sweeps have 2-5 seeds. A bootstrap over 2 seeds has 3 distinct
resamples and any bootstrap over seeds shrinks their variance by (S − 1)/S and ignores that a
variance from S − 1 degrees of freedom is itself uncertain, so its intervals undercover exactly
where seeds are few; the t-interval with Satterthwaite's ν widens honestly instead. A
bootstrap over problems alone ignores the seeds (40% coverage in issue 18's simulation). The
moments are closed-form: 21 arms × 5 seeds × 500 problems take milliseconds (benchmarks/).
With one seed the seed variance is unknown: the interval covers the problems (and the sampling
noise) only, and the `note` column says so.
Two seeds: a seed term then rests on 1 degree of freedom, and Satterthwaite's ν is too optimistic
where it and the problem terms are comparable (a small draw of the seed variance shrinks the
variance and raises ν at once): in benchmarks/coverage_sim.py's no-effect sweeps the 95% interval
excluded 0 in up to ~9% of them on the Avg. row. At 2 seeds (any side with 2 seeds) each part of
the variance therefore takes its own t quantile, as Banerjee's (1961, Sankhyā A) conservative
interval for the Behrens-Fisher problem: half-width √(Σ t(1)² · v_seed + t(ν_p)² · v_problem), ν_p
Satterthwaite's df of the problem terms alone; the p-value is the level at which that interval
touches 0 (so p < 1 − confidence exactly when it excludes 0), and `df` the t df with the same
quantile. It held the level in every simulated balance (1.2-4.4%), at the price of wide intervals
where the seed part matters: only a difference that is large on both seeds is detected. The `note`
column says so (TWO_SEEDS). From 3 seeds Satterthwaite's ν held the level (docs/statistics.md,
"Coverage").
Rliable's views (Agarwal et al. 2021) on the aggregate row: IQM difference and probability of
improvement, with stratified percentile-bootstrap intervals (scipy.stats.bootstrap, each arm's
runs resampled within each benchmark) where every arm has ≥ MIN_BOOTSTRAP_SEEDS seeds.
Multiple arms: Holm's step-down correction over the arms compared on one column (`p_holm`);
`verdict` is better/worse where p_holm < 1 − confidence, else "n.s.". The intervals are per
comparison (each at `confidence`, not adjusted for the other arms): Holm adjusts the p-values
only, so an interval can exclude 0 while the verdict is "n.s."; `excludes_0` says which, and
tables and the forest plot mark such a difference as not significant after Holm.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

# t and noncentral t through scipy.special (what scipy.stats computes them with, a third of its import
# time: `stare-lab table` answers sooner); scipy.stats only for the bootstrap views
from scipy import special

AVG_COLUMN = "Avg."
PER_PROBLEM_COLUMNS = ("arm", "seed", "benchmark", "problem", "correct", "n")
MIN_BOOTSTRAP_SEEDS = 3  # below, a bootstrap over seeds has too few distinct resamples to mean anything
BOOTSTRAP_RESAMPLES = 2000
METHOD_SHORT = "t-interval with Satterthwaite df"
SEED_UNKNOWN = "seed variance unknown (one seed): the interval covers problems only"
# Satterthwaite's df is used where every seed term has at least this many degrees of freedom (3 seeds);
# below (2 seeds), each part of the variance takes its own quantile, the seed part t(1) (module docstring)
MIN_SATTERTHWAITE_SEED_DF = 2
TWO_SEEDS = "2 seeds: the seed part at t(1), the problem part at its own df (Satterthwaite's df undercovers here)"


class ComparisonError(ValueError):
    """Arms that can not be compared as asked (missing baseline, other problems or settings, ...)."""


@dataclass(frozen=True)
class _Moments:
    """Mean squares of one group of seeds (an arm, or the paired differences) over K benchmarks."""

    seeds: int
    seed_scores: np.ndarray  # [S]: Σ_b w_b · mean over problems
    problem_means: list[np.ndarray]  # per benchmark [P_b]: mean over seeds
    ms_resid: np.ndarray  # [K]: seed × problem residual mean square (NaN with one seed)


def _moments(tables: list[np.ndarray], w: float) -> _Moments:
    """tables: per benchmark [S, P_b] per-problem scores of the same S seeds."""
    seeds = tables[0].shape[0]
    seed_scores = sum(w * t.mean(axis=1) for t in tables)
    ms = []
    for t in tables:
        s, p = t.shape
        if s < 2 or p < 2:
            ms.append(math.nan)
            continue
        resid = t - t.mean(axis=1, keepdims=True) - t.mean(axis=0, keepdims=True) + t.mean()
        ms.append(float((resid**2).sum() / ((s - 1) * (p - 1))))
    return _Moments(seeds, np.asarray(seed_scores, float), [t.mean(axis=0) for t in tables], np.asarray(ms))


def contrast(arm: list[np.ndarray], base: list[np.ndarray], paired: bool, confidence: float) -> dict:
    """D = arm − base on the equally weighted mean over benchmarks, with its interval (fractions).

    arm, base: per benchmark [S, P_b] per-problem scores (c/n), problems in the same order;
    paired: seeds in the same order too (rows of arm and base share the data order).
    """
    k = len(arm)
    w = 1.0 / k
    groups = [_moments([a - b for a, b in zip(arm, base, strict=True)], w)] if paired else []
    groups = groups or [_moments(arm, w), _moments(base, w)]
    signs = [1.0] if paired else [1.0, -1.0]
    sizes = [t.shape[1] for t in arm]
    delta = float(sum(sg * g.seed_scores.mean() for sg, g in zip(signs, groups, strict=True)))
    known = [g for g in groups if g.seeds >= 2]
    # Var(D) = A / P + Σ_g Var(seed score_g) / S_g; a seed score's variance (σ² + ω²/P) is estimated as
    # it is (never negative: no truncation, its S − 1 df always count), A = Var(problem diff) − Σ ω²/S
    terms: list[tuple[float, float, float]] = []  # (coefficient, mean square, df): Var = Σ coefficient · mean square
    var_seed = [float(np.var(g.seed_scores, ddof=1)) for g in known]
    terms += [(1.0 / g.seeds, v, g.seeds - 1) for g, v in zip(known, var_seed, strict=True)]
    var_problem = 0.0
    for b, p in enumerate(sizes):
        d = sum(sg * g.problem_means[b] for sg, g in zip(signs, groups, strict=True))
        v_item = float(np.var(d, ddof=1)) if p > 1 else 0.0
        share = float(sum(g.ms_resid[b] / g.seeds for g in known))
        if v_item - share > 0:  # else the arm × problem variance is estimated as 0
            terms.append((w * w / p, v_item, p - 1))
            terms += [(-w * w / (g.seeds * p), g.ms_resid[b], (g.seeds - 1) * (p - 1)) for g in known]
            var_problem += w * w * (v_item - share) / p
    var = max(sum(c * m for c, m, _ in terms), 0.0)
    nu = _satterthwaite(terms)
    seed_df = min((g.seeds - 1 for g in known), default=math.inf)
    se = math.sqrt(var)
    alpha = 1 - confidence
    if seed_df < MIN_SATTERTHWAITE_SEED_DF and se > 0:  # 2 seeds: module docstring, "Two seeds"
        half_at = _separate_quantiles(terms[: len(known)], terms[len(known) :])
        half = half_at(alpha)
        nu = df_with_quantile(half / se, alpha)
        p_value = _level_at(half_at, abs(delta))
    else:
        half = float(-special.stdtrit(nu, alpha / 2)) * se  # t quantile
        if se > 0:
            p_value = float(2 * special.stdtr(nu, -abs(delta) / se))  # two-sided: 2 · P(T ≤ −|t|)
        else:
            p_value = 1.0 if delta == 0 else 0.0
    seed_known = len(known) == len(groups)
    return {
        "delta": delta,
        "ci_lo": delta - half,
        "ci_hi": delta + half,
        "p_value": p_value,
        "se": se,
        "df": nu,
        "paired": paired,
        "var_problem": max(var_problem, 0.0) if seed_known else math.nan,
        "var_seed_arm": var_seed[0] if seed_known else math.nan,
        "var_seed_base": (0.0 if paired else var_seed[1]) if seed_known else math.nan,
        "df_problem": float(sum(sizes) - k),
        "note": (TWO_SEEDS if seed_df < MIN_SATTERTHWAITE_SEED_DF else "") if seed_known else SEED_UNKNOWN,
    }


def _satterthwaite(terms: list[tuple[float, float, float]]) -> float:
    """Satterthwaite's df of Σ c · m over (c, m, df) terms (≥ 1; inf where no term has a variance)."""
    var = sum(c * m for c, m, _ in terms)
    denom = sum((c * m) ** 2 / df for c, m, df in terms if df > 0 and c != 0)
    return max(var * var / denom, 1.0) if denom > 0 and var > 0 else math.inf


def t_quantile(df: float, alpha: float) -> float:
    """The two-sided t quantile t(df, 1 − α/2), from the lower tail (exact for tiny α)."""
    return float(-special.stdtrit(df, alpha / 2))


def _separate_quantiles(seed_terms, problem_terms):
    """The half-width at level α of Banerjee's interval: each seed term with its own t quantile (1 df at
    2 seeds), the problem part with its Satterthwaite df, combined as h(α)² = Σ t(df_i)² · v_i."""
    seeds = [(c * m, df) for c, m, df in seed_terms]
    v_problem = max(sum(c * m for c, m, _ in problem_terms), 0.0)
    nu_problem = _satterthwaite(problem_terms)

    def half(alpha: float) -> float:
        total = sum(t_quantile(df, alpha) ** 2 * v for v, df in seeds)
        if v_problem > 0:
            total += t_quantile(nu_problem, alpha) ** 2 * v_problem
        return math.sqrt(total)

    return half


def _level_at(half, distance: float) -> float:
    """The α at which the interval's half-width `half(α)` (decreasing in α) equals `distance`: the p-value
    of the test the interval inverts (bisection on log α; 0 below 1e-100, where t(1)² would overflow)."""
    if distance == 0:
        return 1.0
    lo, hi = math.log(1e-100), 0.0  # half(e^lo) ≥ distance > half(e^hi) = 0 is searched for
    if half(math.exp(lo)) < distance:
        return 0.0
    for _ in range(52):  # 2^-52 of the log range: float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if half(math.exp(mid)) >= distance else (lo, mid)
    return math.exp(hi)


def df_with_quantile(crit, alpha: float):
    """The t df whose two-sided quantile at α is `crit` (scalar or array; inf where crit is at or below
    the normal's): the interval's equivalent df, reported as `df`. Bisection on log df in [1, 1e9]."""
    crit = np.asarray(crit, dtype=float)
    lo, hi = np.zeros(crit.shape), np.full(crit.shape, math.log(1e9))
    for _ in range(52):  # 2^-52 of the log range: float precision
        mid = (lo + hi) / 2
        above = -special.stdtrit(np.exp(mid), alpha / 2) > crit  # quantile still above crit: more df
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    nu = np.where(crit <= -special.stdtrit(1e9, alpha / 2), np.inf, np.exp(hi))
    return float(nu) if nu.ndim == 0 else nu


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count as a test)."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def _check_input(per_problem: pd.DataFrame, baseline: str, confidence: float) -> pd.DataFrame:
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ComparisonError(f"confidence {confidence!r}: expected a value in (0, 1)")
    missing = [c for c in PER_PROBLEM_COLUMNS if c not in per_problem.columns]
    if missing:
        raise ComparisonError(
            f"per_problem: missing column(s) {', '.join(missing)}; need {', '.join(PER_PROBLEM_COLUMNS)}"
        )
    _check_values(per_problem)
    data = per_problem.assign(arm=per_problem["arm"].astype(str), benchmark=per_problem["benchmark"].astype(str))
    arms = sorted(data["arm"].unique())  # unique(), not set(): pandas' string columns iterate slowly
    if baseline not in arms:
        raise ComparisonError(f"baseline arm {baseline!r} has no results; arms: {', '.join(arms) or 'none'}")
    lacking = sorted(set(data["benchmark"].unique()) - set(data.loc[data["arm"] == baseline, "benchmark"].unique()))
    if lacking:
        others = sorted(data.loc[data["benchmark"] == lacking[0], "arm"].unique())
        raise ComparisonError(
            f"benchmark {lacking[0]!r}: the baseline {baseline!r} has no results there (arms {', '.join(others)})"
        )
    if (data["n"] <= 0).any() or ((data["correct"] < 0) | (data["correct"] > data["n"])).any():
        raise ComparisonError("per_problem: every row needs n ≥ 1 and 0 ≤ correct ≤ n")
    return data.assign(score=data["correct"].astype(float) / data["n"].astype(float))


def _check_values(per_problem: pd.DataFrame) -> None:
    """Refuse a missing value (NaN, None, pd.NA) in any column compare_arms reads, and counts that are not
    finite numbers, naming the column and the first offending row. Unchecked, a NaN count made a NaN
    difference with p = 0 and verdict "worse", and a NaN seed label a fake extra run of the arm."""
    for column in PER_PROBLEM_COLUMNS:
        values = per_problem[column]
        bad = values.isna().to_numpy(bool)
        what, need = "is missing", "every row needs a value in every column"
        if column in ("correct", "n") and not bad.any():
            if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
                bad = ~np.isfinite(values.to_numpy(float))
            else:  # text or objects: each value must be a real number
                bad = np.array([not _finite_number(v) for v in values], dtype=bool)
            what, need = "is not a finite number", "correct and n are counts"
        if bad.any():
            i = int(np.argmax(bad))
            row = per_problem.iloc[i]
            shown = ", ".join(
                f"{c} {_show(row[c])}" for c in PER_PROBLEM_COLUMNS[:4] if c != column and not _missing(row[c])
            )
            raise ComparisonError(
                f"per_problem: column {column!r} {what} ({_show(row[column])}) at row {i} (counting from 0)"
                + (f" ({shown})" if shown else "")
                + f", the first of {int(bad.sum())} such row(s); {need}"
            )


def _finite_number(value) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _show(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or array is not one missing value
        return False


@dataclass(frozen=True)
class _Arm:
    """One arm on one benchmark: its seeds and their per-problem scores."""

    seeds: tuple  # seed labels, sorted
    scores: np.ndarray  # [S, P], problems in the benchmark's order


def _tables(data: pd.DataFrame) -> dict[str, dict[str, _Arm]]:
    """{benchmark: {arm: _Arm}}; every (arm, seed) of a benchmark must have the same problems.

    Index arithmetic over factorized columns (not pivots): pandas' string columns iterate slowly."""
    bench_code, benches = pd.factorize(data["benchmark"], sort=True)
    arm_code, arm_names = pd.factorize(data["arm"], sort=True)
    seed_code, seed_names = pd.factorize(data["seed"], sort=True)
    run_all = arm_code.astype(np.int64) * len(seed_names) + seed_code  # (arm, seed) sorted as a pair
    problem_code, problem_names = pd.factorize(data["problem"], sort=True)
    score_all = data["score"].to_numpy(float)
    out: dict[str, dict[str, _Arm]] = {}
    for code in np.unique(bench_code):
        bench, idx = str(benches[code]), np.flatnonzero(bench_code == code)
        run_ids, run_code = np.unique(run_all[idx], return_inverse=True)
        runs = [(str(arm_names[r // len(seed_names)]), seed_names[r % len(seed_names)]) for r in run_ids]
        prob_ids, prob_code = np.unique(problem_code[idx], return_inverse=True)
        problems = problem_names[prob_ids]
        if len(problems) < 2:
            raise ComparisonError(f"benchmark {bench!r}: {len(problems)} problem; a comparison needs at least 2")
        flat = run_code * len(problems) + prob_code
        counts = np.bincount(flat, minlength=len(runs) * len(problems)).reshape(len(runs), len(problems))
        if (counts > 1).any():
            r, q = np.argwhere(counts > 1)[0]
            raise ComparisonError(
                f"benchmark {bench!r}: arm {runs[r][0]} seed {runs[r][1]} has problem {problems[q]!r} twice"
            )
        if (counts == 0).any():
            r = int(np.argmax((counts == 0).sum(axis=1)))
            raise ComparisonError(
                f"benchmark {bench!r}: arms were evaluated on different problem sets ({runs[r][0]} seed "
                f"{runs[r][1]} lacks {int((counts[r] == 0).sum())} of the {len(problems)} problems); "
                "they can not be compared"
            )
        flat_scores = np.empty(len(runs) * len(problems))
        flat_scores[flat] = score_all[idx]
        scores = flat_scores.reshape(len(runs), len(problems))  # [runs, problems]
        arms: dict[str, list[int]] = {}
        for i, (arm, _) in enumerate(runs):
            arms.setdefault(str(arm), []).append(i)
        out[bench] = {
            arm: _Arm(tuple(runs[i][1] for i in rows), scores[rows]) for arm, rows in arms.items()
        }  # runs are sorted by (arm, seed): each arm's rows in seed order
    return out


def _pair(arm: list[_Arm], base: list[_Arm]) -> tuple[list[np.ndarray], list[np.ndarray], bool] | None:
    """The score arrays, paired when arm and baseline have the same seeds (≥ 2); None when a side's seeds
    differ between benchmarks (its seed scores over benchmarks would not be one run's)."""
    if len({a.seeds for a in arm}) > 1 or len({b.seeds for b in base}) > 1:
        return None
    paired = len(arm[0].seeds) >= 2 and arm[0].seeds == base[0].seeds
    return [a.scores for a in arm], [b.scores for b in base], paired


def _iqm_delta(*samples: np.ndarray, k: int) -> np.ndarray:
    """IQM of the arm's run scores (all benchmarks pooled) − the baseline's; samples: k arm, then k base."""
    arm, base = np.concatenate(samples[:k], axis=-1), np.concatenate(samples[k:], axis=-1)
    return _trim_mean(arm) - _trim_mean(base)


def _trim_mean(x: np.ndarray, cut: float = 0.25) -> np.ndarray:
    """The mean without the lowest and highest int(cut·n) values, as scipy.stats.trim_mean (IQM at 0.25)."""
    n = x.shape[-1]
    k = int(cut * n)
    return np.sort(x, axis=-1)[..., k : n - k].mean(axis=-1)


def _prob_improvement(*samples: np.ndarray, k: int) -> np.ndarray:
    """P(a run of the arm beats a run of the baseline on the same benchmark), ties ½, mean over benchmarks."""
    per_bench = []
    for a, b in zip(samples[:k], samples[k:], strict=True):
        diff = a[..., :, None] - b[..., None, :]
        per_bench.append((diff > 0).mean(axis=(-1, -2)) + 0.5 * (diff == 0).mean(axis=(-1, -2)))
    return np.mean(per_bench, axis=0)


def _aggregate_views(arm: list[np.ndarray], base: list[np.ndarray], confidence: float, rng) -> dict:
    """rliable's IQM difference (points) and probability of improvement, with stratified bootstrap intervals."""
    k = len(arm)
    samples = [t.mean(axis=1) for t in arm] + [t.mean(axis=1) for t in base]  # run scores per benchmark
    out = {}
    for name, fn, scale in (("iqm_delta", _iqm_delta, 100.0), ("prob_improvement", _prob_improvement, 1.0)):
        point = float(fn(*samples, k=k)) * scale
        lo = hi = math.nan
        if min(len(s) for s in samples) >= MIN_BOOTSTRAP_SEEDS:
            from scipy import stats  # the bootstrap alone needs scipy.stats (a slow import)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a degenerate resample (all scores equal) is fine here
                res = stats.bootstrap(
                    samples,
                    lambda *xs, axis=-1, fn=fn: fn(*xs, k=k),
                    n_resamples=BOOTSTRAP_RESAMPLES,
                    vectorized=True,
                    confidence_level=confidence,
                    method="percentile",
                    rng=rng,
                )
            lo, hi = float(res.confidence_interval.low) * scale, float(res.confidence_interval.high) * scale
        out.update({name: point, f"{name}_lo": lo, f"{name}_hi": hi})
    return out


RESULT_COLUMNS = [
    "arm", "benchmark", "delta", "ci_lo", "ci_hi", "p_value", "p_holm", "verdict", "excludes_0", "seeds",
    "baseline_seeds",
    "problems", "paired", "df", "se", "var_problem", "var_seed_arm", "var_seed_base", "df_problem",
    "iqm_delta", "iqm_delta_lo", "iqm_delta_hi", "prob_improvement", "prob_improvement_lo", "prob_improvement_hi",
    "note",
]  # fmt: skip
_POINTS = ("delta", "ci_lo", "ci_hi", "se")


def compare_arms(
    per_problem: pd.DataFrame, baseline: str = "full", confidence: float = 0.95, seed: int = 0, views: bool = True
) -> pd.DataFrame:
    """Each arm's difference to `baseline` per benchmark (and over benchmarks), with intervals over seeds and problems.

    per_problem: one row per (arm, seed, benchmark, problem) with columns arm, seed, benchmark, problem,
    correct (samples judged correct) and n (samples drawn). Every arm and seed of a benchmark must have the
    same problems.
    Returns one row per (arm, benchmark) for every arm but the baseline, and per arm a row with benchmark
    "Avg." (the mean over benchmarks, as papers average AIME24, AMC23, MATH-500, ...) when there are
    several benchmarks: delta, ci_lo, ci_hi (points: percent of avg@n), p_value (two-sided, H0: no
    difference), p_holm (Holm over the arms of that benchmark), verdict ("better" / "worse" where
    p_holm < 1 − confidence, else "n.s."), excludes_0 (the per-comparison interval excludes 0: with
    several arms possibly where the verdict is "n.s."), seeds and baseline_seeds, problems, paired
    (seeds paired), df (at 2 seeds the equivalent df of the 2-seed interval) and se (points), the
    variance components that `seeds_needed` projects from (points²: var_problem, the part more seeds
    do not shrink; var_seed_arm / var_seed_base, one seed's variance of the score or, paired, of the
    difference), rliable's IQM difference and probability of
    improvement with bootstrap intervals (on the "Avg." row, or the only benchmark's), and a note
    (e.g. seed variance unknown with one seed). The method, and why: this module's docstring.
    seed: of the bootstrap's random numbers (the t-intervals use none). views: False leaves rliable's
    views out (their columns NaN): a coverage simulation's many calls need only the intervals.
    Bad input (a missing baseline, a benchmark the baseline lacks, confidence outside (0, 1), arms on
    different problems): ComparisonError, a ValueError naming it.
    """
    data = _check_input(per_problem, baseline, confidence)
    tables = _tables(data)
    rng = np.random.default_rng(seed)
    rows = []
    for arm in sorted(set(data["arm"].unique()) - {baseline}):
        benches = [b for b in tables if arm in tables[b]]
        for bench in benches:
            pair = _pair([tables[bench][arm]], [tables[bench][baseline]])
            assert pair is not None  # one benchmark: one seed set per side
            rows.append(_row(arm, bench, *pair, confidence, rng, views=views and len(tables) == 1))
        if len(tables) > 1:
            pair = (
                _pair([tables[b][arm] for b in tables], [tables[b][baseline] for b in tables])
                if len(benches) == len(tables)
                else None
            )
            if pair is None:
                rows.append({"arm": arm, "benchmark": AVG_COLUMN, "note": "Avg. needs every seed on every benchmark"})
            else:
                rows.append(_row(arm, AVG_COLUMN, *pair, confidence, rng, views=views))
    out = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    p_values, p_holm = out["p_value"].to_numpy(float), np.full(len(out), math.nan)
    for idx in out.groupby("benchmark", sort=False).indices.values():
        p_holm[idx] = holm(p_values[idx])
    out["p_holm"] = p_holm
    significant = out["p_holm"] < 1 - confidence
    out["verdict"] = np.where(significant, np.where(out["delta"] > 0, "better", "worse"), "n.s.")
    out.loc[out["p_value"].isna(), "verdict"] = ""
    out["excludes_0"] = (out["ci_lo"] > 0) | (out["ci_hi"] < 0)  # the per-comparison interval (NaN: False)
    return out


def _row(arm, bench, arm_arrays, base_arrays, paired, confidence, rng, views) -> dict:
    res = contrast(arm_arrays, base_arrays, paired, confidence)
    row = {k: v * 100.0 if k in _POINTS else v for k, v in res.items()}
    row.update({k: row[k] * 1e4 for k in ("var_problem", "var_seed_arm", "var_seed_base")})
    row.update(
        arm=arm,
        benchmark=bench,
        seeds=arm_arrays[0].shape[0],
        baseline_seeds=base_arrays[0].shape[0],
        problems=sum(t.shape[1] for t in arm_arrays),
    )
    if views:
        row.update(_aggregate_views(arm_arrays, base_arrays, confidence, rng))
    return row
