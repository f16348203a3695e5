"""How many seeds a claim needs: the power of `compare_arms`' test, projected from a comparison.

`seeds_needed` takes each row of `compare_arms`' output (its seed and problem variances and the
problems' df) and finds the fewest seeds per arm at which the same t-test detects a `delta`-point
difference with the given power (`power_at`: the noncentral t, with Satterthwaite's df from 3 seeds
and the 2-seed interval's equivalent df below, as the comparison itself; stare_lab.analysis.compare).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special

from stare_lab.analysis.compare import MIN_SATTERTHWAITE_SEED_DF, ComparisonError, df_with_quantile, t_quantile

MAX_SEEDS = 1000


def power_at(delta: float, var_problem, var_seed, seeds, df_problem, confidence: float = 0.95) -> np.ndarray:
    """Power of the two-sided t-test at 1 − confidence to detect `delta` points with `seeds` seeds per arm.

    Var(D) = var_problem + var_seed / seeds (points²; var_seed: arm's plus baseline's one-seed variance);
    df by Satterthwaite from df_problem and seeds − 1 (one seed term, as paired; a lower bound unpaired); at
    2 seeds the df equivalent to compare_arms' interval there (the seed term at t(1), the problem term at
    t(df_problem): `df_with_quantile`), the power then that of a t-test with this df (an approximation).
    """
    seeds = np.asarray(seeds, dtype=float)
    v_seed = np.asarray(var_seed, dtype=float) / seeds
    var = var_problem + v_seed
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = np.where(var_problem > 0, var_problem**2 / df_problem, 0.0) + v_seed**2 / np.maximum(seeds - 1, 1)
        nu = np.where(denom > 0, var**2 / denom, np.inf)
        nu = np.maximum(np.where(np.isfinite(seeds), nu, df_problem), 1.0)
        two = seeds - 1 < MIN_SATTERTHWAITE_SEED_DF
        if np.any(two):  # as compare_arms at 2 seeds: each part at its own quantile
            alpha = 1 - confidence
            q_problem = -special.stdtrit(np.maximum(df_problem, 1), alpha / 2)
            crit = np.sqrt(t_quantile(1, alpha) ** 2 * v_seed + q_problem**2 * var_problem) / np.sqrt(var)
            nu = np.where(two, df_with_quantile(np.where(var > 0, crit, t_quantile(1, alpha)), alpha), nu)
        lam = np.where(var > 0, abs(delta) / np.sqrt(var), np.inf)
    t_c = special.stdtrit(nu, 1 - (1 - confidence) / 2)
    lam = np.minimum(lam, 1e6)
    # P(T' > t) + P(T' < −t) for the noncentral T' (cdf(−t, λ) = sf(t, −λ): no NaN far out)
    power = (1 - special.nctdtr(nu, lam, t_c)) + (1 - special.nctdtr(nu, -lam, t_c))
    return np.where(lam < 1e6, power, 1.0)


def seeds_needed(
    comparison: pd.DataFrame,
    delta: float = 2.0,
    power: float = 0.8,
    confidence: float = 0.95,
    max_seeds: int = MAX_SEEDS,
) -> pd.DataFrame:
    """Seeds per arm (the arm and the baseline alike) for a `delta`-point difference to be detected
    with `power` by the test of `compare_arms`, projected from each row's observed seed and problem
    variance (the same problems). One row per row of `comparison`: arm, benchmark, seeds (now),
    power_now (at the seeds it has), seeds_needed (≥ 2; NaN where the seed variance is unknown; inf
    where more than max_seeds are needed), limit ("problems" where even infinitely many seeds would
    not reach `power`: the problems' own variation is too large, more problems are needed).
    Per comparison, at α = 1 − confidence: a claim that must survive Holm over m arms needs more."""
    if not 0 < power < 1:
        raise ComparisonError(f"power {power!r}: expected a value in (0, 1)")
    if not delta > 0:
        raise ComparisonError(f"delta {delta!r}: expected a difference in points > 0")
    if not 0 < confidence < 1:
        raise ComparisonError(f"confidence {confidence!r}: expected a value in (0, 1)")
    rows = []
    for r in comparison.itertuples(index=False):
        v_seed = r.var_seed_arm + r.var_seed_base
        known = np.isfinite(r.var_problem) and np.isfinite(v_seed)
        row = {"arm": r.arm, "benchmark": r.benchmark, "seeds": r.seeds, "power_now": math.nan}
        row.update(seeds_needed=math.nan, limit="seed variance unknown" if not known else "")
        if known:

            def power_with(s: float, r=r, v_seed=v_seed) -> float:
                return float(power_at(delta, r.var_problem, v_seed, s, r.df_problem, confidence))

            row["power_now"] = power_with(r.seeds)
            row["seeds_needed"] = _fewest_seeds(power_with, power, max_seeds)
            if not np.isfinite(row["seeds_needed"]):
                row["limit"] = "problems" if power_with(math.inf) < power else f"> {max_seeds} seeds"
        rows.append(row)
    return pd.DataFrame(rows, columns=["arm", "benchmark", "seeds", "power_now", "seeds_needed", "limit"])


def _fewest_seeds(power_with, target: float, max_seeds: int) -> float:
    """The fewest seeds (≥ 2) whose power reaches `target` (power grows with seeds: bisection); inf if none."""
    if power_with(2) >= target:
        return 2.0
    if power_with(max_seeds) < target:
        return math.inf
    lo, hi = 2, max_seeds  # power(lo) < target ≤ power(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_with(mid) >= target else (mid, hi)
    return float(hi)


def welch_power(delta: float, var_terms, seeds, alpha: float) -> np.ndarray:
    """Power of the one-sided Welch t-test at level `alpha` to detect `delta` (the quantity's units) in a
    combination Σ c_a · mean_a of arms with `seeds` seeds each, seeds as the unit: var_terms are each arm's
    c_a² · (one seed's variance); the df is Welch-Satterthwaite's, the power the noncentral t's."""
    seeds = np.asarray(seeds, dtype=float)
    terms = np.asarray(var_terms, dtype=float)
    var = terms.sum() / seeds
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.maximum(var**2 / ((terms**2).sum() / (seeds**2 * np.maximum(seeds - 1, 1))), 1.0)
        lam = np.where(var > 0, abs(delta) / np.sqrt(var), np.inf)
    t_c = special.stdtrit(df, 1 - alpha)
    return np.where(np.isfinite(lam), 1 - special.nctdtr(df, np.minimum(lam, 1e6), t_c), 1.0)


def welch_seeds_needed(delta: float, var_terms, alpha: float, power: float = 0.8, max_seeds: int = MAX_SEEDS) -> float:
    """The fewest seeds per arm (≥ 2) at which `welch_power` reaches `power`; inf beyond max_seeds, NaN where
    the variances are unknown or `delta` is 0."""
    if not np.all(np.isfinite(var_terms)) or not delta > 0:
        return math.nan
    return _fewest_seeds(lambda s: float(welch_power(delta, var_terms, s, alpha)), power, max_seeds)
