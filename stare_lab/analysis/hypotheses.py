"""Claims decided: each claim's estimate, interval, one-sided tests and verdict, Holm over the file.

The tests, by quantity (docs/claims.md, docs/statistics.md "Claims"):

- **Held-out scores** (avg@n, or pass@k as each seed's per-problem unbiased pass@k): compare_arms'
  seeds × problems estimator (`compare.contrast`: crossed random effects, Satterthwaite's t, at 2 seeds
  the seed part at t(1)), on the claim's linear combination of arms: D = A − B, or for a gain form
  C = (A − base) − f·(B − base). Arms with the same seeds are combined seed by seed (paired); at most two
  seed sets can meet in one claim. A one-sided test of D against a bound δ0 is the two-sided test of
  D − δ0 = 0 (the arm's scores shifted by δ0, variance unchanged) halved on the side of the estimate.
- **Training metrics** (metrics.jsonl at the last logged step or averaged over a window): one value per
  run, the seeds the unit, Welch's t (unequal variances, Welch-Satterthwaite df) on the combination.
- **Seed spread** of the final score: Brown-Forsythe's test, Welch's t on each seed's absolute deviation
  from its arm's median score, one-sided.

Forms: superiority D > m, inferiority D < −m, non-inferiority D > −m (each one one-sided test; its
opposite decides "contradicted"); equivalence |D| < m by TOST (both one-sided tests at α: p = their
larger p), contradicted when either outer test rejects (p = 2 × the smaller, Bonferroni over the two
sides); retained gain C > 0 and gain below C < 0, which is Fieller's test of the ratio
R = (A − base)/(B − base) against f. The interval shown is the two-sided (1 − 2α) one (the two one-sided
α bounds), per claim: for a gain form Fieller's interval of R, found by inverting the same test (the
fractions ρ whose C(ρ) = (A − base) − ρ·(B − base) is not rejected at 2α two-sided), unbounded where
B − base itself is not distinguishable from 0 at that level.

Verdicts: Holm's step-down correction over the file's m claims, separately for the claims' own tests
and for the opposite tests: supported where the claim's Holm-adjusted p < α, contradicted where the
opposite test's is, else undecided, with the seeds per arm that would decide it at the observed
variances (power 0.8, one-sided at α/(m − d), the Holm level of the next claim decided when d are).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from stare_lab.analysis.compare import ComparisonError, _tables, contrast, holm
from stare_lab.analysis.power import seeds_needed, welch_seeds_needed
from stare_lab.plan.claims import Claim

ALPHA = 0.05
POWER = 0.8
VERDICTS = ("supported", "contradicted", "undecided", "no data")
CLAIM_COLUMNS = [
    "id", "formula", "quantity", "unit", "estimate", "lo", "hi", "bound", "p_support", "p_contra",
    "p_support_holm", "p_contra_holm", "verdict", "seeds", "seeds_needed", "arms", "test", "note",
]  # fmt: skip


@dataclass
class Outcome:
    """One claim's statistics before Holm: estimate and interval (the quantity's unit; a gain form's as the
    fraction retained), the bound the claim is tested against, the two one-sided p-values, and what
    projects the seeds needed (`distance` from the bound; `seeds_at(level)`). `effect` and `se`: the tested
    combination's distance from its bound towards the claim and its standard error, in the quantity's unit
    (a gain form's C = (A − base) − f·(B − base) in points; NaN effect for equivalence), what a sequential
    design reads (stare_lab.analysis.sequential.ClaimLook)."""

    estimate: float
    lo: float
    hi: float
    bound: float
    p_support: float
    p_contra: float
    distance: float
    seeds: str
    arms: str
    test: str
    note: str = ""
    effect: float = math.nan
    se: float = math.nan
    # level → seeds per arm (inf: more than MAX_SEEDS; −inf: no number of seeds, more problems are needed)
    seeds_at: Callable[[float], float] | None = field(default=None, repr=False)


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k per problem, 1 − Π_{i=n−c+1..n} (1 − k/i) (1 where n − c < k), vectorised through
    the cumulative log of the product (stare_lab.evaluation.pass_at_k is the reference; it imports torch)."""
    n, c = np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64)
    if np.any(k > n):
        raise ComparisonError(f"pass@{k} needs k ≤ n samples per problem; some problems have n = {int(n.min())}")
    top = int(n.max()) if n.size else 0
    i = np.arange(1, top + 1, dtype=float)
    logs = np.zeros_like(i)
    logs[i > k] = np.log1p(-k / i[i > k])
    cum = np.concatenate([[0.0], np.cumsum(logs)])  # cum[j] = Σ_{i ≤ j, i > k} log(1 − k/i)
    free = n - c  # i runs over n − c + 1 .. n
    out = 1.0 - np.exp(cum[n] - cum[np.maximum(free, 0)])
    return np.where(free < k, 1.0, out)


# -- held-out scores: the seeds × problems estimator on a combination of arms -------------------------


def score_tables(problems: pd.DataFrame, claim: Claim) -> dict[str, tuple[tuple, list[np.ndarray]]]:
    """{arm: (its seeds, per benchmark [S, P] scores)} of the claim's arms: c/n, or pass@k per problem."""
    q = claim.quantity
    rows = problems[problems["arm"].isin(claim.arms)]
    if rows.empty:
        return {}
    benches = list(q.benchmarks) or sorted(set.intersection(*(set(g["benchmark"]) for _, g in rows.groupby("arm"))))
    rows = rows[rows["benchmark"].isin(benches)]
    n, c = rows["n"].to_numpy(np.int64), rows["correct"].to_numpy(float)
    score = c / n if q.score == "avg" else pass_at_k(n, c.astype(np.int64), q.k)
    tables = _tables(rows.assign(arm=rows["arm"].astype(str), benchmark=rows["benchmark"].astype(str), score=score))
    out = {}
    for arm in claim.arms:
        parts = [tables[b][arm] for b in benches if arm in tables.get(b, {})]
        if len(parts) < len(benches) or not benches:
            continue
        if len({p.seeds for p in parts}) > 1:
            raise ComparisonError(f"claim {claim.id}: arm {arm!r} has other seeds on other benchmarks")
        out[arm] = (parts[0].seeds, [p.scores for p in parts])
    return out


def combine(arms: dict, coefs: dict[str, float], shift: float = 0.0, confidence: float = 1 - 2 * ALPHA) -> dict:
    """compare.contrast of Σ coef · arm − shift (fractions): arms with the same seeds combined seed by seed."""
    classes: dict[tuple, list[np.ndarray]] = {}
    for arm, coef in coefs.items():
        seeds, tables = arms[arm]
        scaled = [coef * t for t in tables]
        prev = classes.get(seeds)
        classes[seeds] = scaled if prev is None else [p + t for p, t in zip(prev, scaled, strict=True)]
    groups = list(classes.values())
    groups[0] = [t - shift for t in groups[0]]
    if len(groups) == 1:
        return contrast(groups[0], [np.zeros_like(t) for t in groups[0]], True, confidence)
    if len(groups) == 2:
        return contrast(groups[0], [-t for t in groups[1]], False, confidence)
    raise ComparisonError(f"arms {', '.join(coefs)} have {len(groups)} different seed sets; at most two can meet")


def _up(res: dict) -> float:
    """P-value of D − shift > 0 from the two-sided test `res` (one-sided: half, on the estimate's side)."""
    p2 = min(max(res["p_value"], 0.0), 1.0)
    return p2 / 2 if res["delta"] > 0 else 1 - p2 / 2


def score_outcome(claim: Claim, arms: dict, alpha: float = ALPHA) -> Outcome:
    a, b, f = claim.a, claim.b, claim.fraction
    gain = claim.form in ("retained_gain", "gain_below")
    coefs = {a: 1.0, b: -f, claim.base: f - 1.0} if gain else {a: 1.0, b: -1.0}
    m = claim.margin / 100.0
    shown = combine(arms, coefs, confidence=1 - 2 * alpha)
    est, (p_s, p_c), bound, res = _form_tests(claim, lambda s: combine(arms, coefs, shift=s), m, shown["delta"])
    est_pts = 100 * est
    lo, hi, shown_est, shown_bound = 100 * shown["ci_lo"], 100 * shown["ci_hi"], est_pts, 100 * bound
    if gain:
        shown_est, lo, hi = _fieller(arms, claim, alpha)
        shown_bound = f
    distance = abs(abs(est) - m) if claim.form == "equivalence" else abs(est - bound)

    def seeds_at(level: float, res=res) -> float:
        if not distance > 0:
            return math.inf
        frame = pd.DataFrame([{"arm": a, "benchmark": "", "seeds": len(arms[a][0]), "df_problem": res["df_problem"]}])
        frame = frame.assign(**{k: res[k] * 1e4 for k in ("var_problem", "var_seed_arm", "var_seed_base")})
        need = seeds_needed(frame, delta=100 * distance, power=POWER, confidence=1 - 2 * level).iloc[0]
        return float(need["seeds_needed"]) if need["limit"] != "problems" else -math.inf

    paired = "paired by seed" if shown["paired"] or len({arms[x][0] for x in coefs}) == 1 else "unpaired seeds"
    return Outcome(
        estimate=shown_est,
        lo=lo,
        hi=hi,
        bound=shown_bound,
        p_support=p_s,
        p_contra=p_c,
        distance=100 * distance,
        seeds=", ".join(f"{x} {len(arms[x][0])}" for x in coefs),
        arms=" · ".join(f"{x} {100 * np.mean([t.mean() for t in arms[x][1]]):.1f}" for x in coefs),
        test=f"seeds × problems t ({paired})" + ("; TOST" if claim.form == "equivalence" else ""),
        note=shown["note"],
        effect=_toward(claim.form) * 100 * (est - bound),
        se=100 * shown["se"],
        seeds_at=seeds_at,
    )


def _form_tests(claim: Claim, test_at, m: float, est: float):
    """(estimate of the combination, (p_support, p_contra), the bound, the test at the bound) of the claim's
    form; `test_at(shift)` is the two-sided test of D − shift = 0 (a dict with delta and p_value)."""
    form = claim.form
    if form == "equivalence":
        low, high = test_at(-m), test_at(m)
        p_support = max(_up(low), 1 - _up(high))
        p_contra = min(1.0, 2 * min(1 - _up(low), _up(high)))
        return est, (p_support, p_contra), m, low
    bound = {"superiority": m, "inferiority": -m, "non_inferiority": -m}.get(form, 0.0)
    res = test_at(bound)
    up = _up(res)
    upward = form in ("superiority", "non_inferiority", "retained_gain")
    return est, ((up, 1 - up) if upward else (1 - up, up)), bound, res


def _toward(form: str) -> float:
    """+1 where the claim is D > bound, −1 where D < bound, NaN for equivalence (two bounds)."""
    if form == "equivalence":
        return math.nan
    return 1.0 if form in ("superiority", "non_inferiority", "retained_gain") else -1.0


def _fieller(arms: dict, claim: Claim, alpha: float) -> tuple[float, float, float]:
    """(R̂, and Fieller's (1 − 2α) interval of R = (A − base)/(B − base)), by inverting the test of
    C(ρ) = (A − base) − ρ·(B − base) = 0; ±inf where B − base is not distinguishable from 0 at 2α."""
    a, b, base = claim.a, claim.b, claim.base
    num = combine(arms, {a: 1.0, base: -1.0})["delta"]
    den = combine(arms, {b: 1.0, base: -1.0})
    if den["delta"] == 0:
        return math.nan, -math.inf, math.inf
    ratio = num / den["delta"]
    if not den["p_value"] < 2 * alpha:
        return ratio, -math.inf, math.inf

    def accepted(rho: float) -> bool:
        return combine(arms, {a: 1.0, b: -rho, base: rho - 1.0})["p_value"] >= 2 * alpha

    return ratio, _edge(accepted, ratio, -1.0), _edge(accepted, ratio, 1.0)


def _edge(accepted, inside: float, side: float) -> float:
    """Where `accepted` (true at `inside`) turns false going towards `side`·∞: doubling, then bisection."""
    step = max(1.0, abs(inside))
    for _ in range(60):
        if not accepted(inside + side * step):
            break
        step *= 2
    else:
        return side * math.inf
    lo, hi = 0.0, step
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if accepted(inside + side * mid) else (lo, mid)
    return inside + side * (lo + hi) / 2


# -- training metrics and seed spreads: the seeds as the unit -----------------------------------------


def welch(values: dict[str, np.ndarray], coefs: dict[str, float], shift: float, alpha: float) -> dict:
    """Welch's t of Σ coef · mean − shift = 0: delta (unshifted), se, df, the (1 − 2α) interval, p_up."""
    terms = {x: coefs[x] ** 2 * np.var(values[x], ddof=1) / len(values[x]) for x in coefs}
    var = float(sum(terms.values()))
    est = float(sum(coefs[x] * np.mean(values[x]) for x in coefs))
    df = var**2 / sum(t**2 / (len(values[x]) - 1) for x, t in terms.items()) if var > 0 else math.inf
    se = math.sqrt(var)
    if se > 0:
        p_up = float(special.stdtr(df, -(est - shift) / se))
        half = float(special.stdtrit(df, 1 - alpha)) * se
    else:
        p_up, half = (0.0 if est > shift else 1.0 if est < shift else 0.5), 0.0
    return {"delta": est, "se": se, "df": df, "lo": est - half, "hi": est + half, "p_up": p_up}


def seed_outcome(claim: Claim, values: dict[str, np.ndarray], alpha: float = ALPHA, spread: bool = False) -> Outcome:
    """A training metric's (or, `spread`, the seed spread's: Brown-Forsythe) claim over seeds."""
    if spread:
        sds = {x: float(np.std(v, ddof=1)) for x, v in values.items()}
        values = {x: np.abs(v - np.median(v)) for x, v in values.items()}
    a, b, f = claim.a, claim.b, claim.fraction
    gain = claim.form in ("retained_gain", "gain_below")
    coefs = {a: 1.0, b: -f, claim.base: f - 1.0} if gain else {a: 1.0, b: -1.0}
    m = claim.margin / (100.0 if spread else 1.0)
    scale = 100.0 if spread else 1.0  # a spread in points, of scores in fractions

    def test_at(shift: float) -> dict:
        res = welch(values, coefs, shift, alpha)
        p_up = res["p_up"]
        return {"delta": res["delta"] - shift, "p_value": 2 * min(p_up, 1 - p_up)}

    shown = welch(values, coefs, 0.0, alpha)
    est, (p_s, p_c), bound, _ = _form_tests(claim, test_at, m, shown["delta"])
    lo, hi, shown_est, shown_bound = scale * shown["lo"], scale * shown["hi"], scale * est, scale * bound
    if gain:
        shown_est, lo, hi = _seed_fieller(values, claim, alpha)
        shown_bound = f
    distance = abs(abs(est) - m) if claim.form == "equivalence" else abs(est - bound)
    var_terms = [coefs[x] ** 2 * np.var(values[x], ddof=1) for x in coefs]
    seeds = min(len(values[x]) for x in coefs)
    arms = (
        " · ".join(f"{x} SD {100 * sds[x]:.2f}" for x in coefs)
        if spread
        else " · ".join(f"{x} {np.mean(values[x]):.4g}" for x in coefs)
    )
    return Outcome(
        estimate=shown_est,
        lo=lo,
        hi=hi,
        bound=shown_bound,
        p_support=p_s,
        p_contra=p_c,
        distance=scale * distance,
        seeds=", ".join(f"{x} {len(values[x])}" for x in coefs),
        arms=arms,
        test="Brown-Forsythe over seeds (Welch t on |score − median|)" if spread else "Welch t over seeds",
        note="" if seeds >= 3 else "2 seeds: Welch's df rests on 1 degree of freedom per arm",
        effect=_toward(claim.form) * scale * (est - bound),
        se=scale * shown["se"],
        seeds_at=lambda level: welch_seeds_needed(distance, var_terms, level, POWER),
    )


def _seed_fieller(values: dict[str, np.ndarray], claim: Claim, alpha: float) -> tuple[float, float, float]:
    a, b, base = claim.a, claim.b, claim.base
    num = welch(values, {a: 1.0, base: -1.0}, 0.0, alpha)["delta"]
    den = welch(values, {b: 1.0, base: -1.0}, 0.0, alpha)
    if den["delta"] == 0:
        return math.nan, -math.inf, math.inf
    ratio = num / den["delta"]
    if not min(den["p_up"], 1 - den["p_up"]) < alpha:
        return ratio, -math.inf, math.inf

    def accepted(rho: float) -> bool:
        p_up = welch(values, {a: 1.0, b: -rho, base: rho - 1.0}, 0.0, alpha)["p_up"]
        return min(p_up, 1 - p_up) >= alpha

    return ratio, _edge(accepted, ratio, -1.0), _edge(accepted, ratio, 1.0)


# -- the family: Holm and verdicts --------------------------------------------------------------------


def verdicts(claims: list[Claim], outcomes: list[Outcome | str], alpha: float = ALPHA) -> pd.DataFrame:
    """One row per claim (CLAIM_COLUMNS); an outcome given as text is a claim without data (its reason)."""
    rows = []
    for claim, out in zip(claims, outcomes, strict=True):
        row: dict[str, Any] = {
            "id": claim.id,
            "formula": claim.formula,
            "quantity": claim.quantity.name,
            "unit": claim.quantity.unit,
        }
        if isinstance(out, str):
            row.update(p_support=math.nan, p_contra=math.nan, note=out)
        else:
            row.update({k: getattr(out, k) for k in ("estimate", "lo", "hi", "bound", "p_support", "p_contra")})
            row.update(seeds=out.seeds, arms=out.arms, test=out.test, note=out.note)
        rows.append(row)
    frame = pd.DataFrame(rows).reindex(columns=CLAIM_COLUMNS)
    frame["p_support_holm"] = holm(frame["p_support"].to_numpy(float))
    frame["p_contra_holm"] = holm(frame["p_contra"].to_numpy(float))
    supported, contradicted = frame["p_support_holm"] < alpha, frame["p_contra_holm"] < alpha
    frame["verdict"] = np.where(supported, "supported", np.where(contradicted, "contradicted", "undecided"))
    frame.loc[frame["p_support"].isna(), "verdict"] = "no data"
    m, decided = int(frame["p_support"].notna().sum()), int((supported | contradicted).sum())
    level = alpha / max(m - decided, 1)
    for i, out in enumerate(outcomes):
        if frame.at[i, "verdict"] == "undecided" and not isinstance(out, str) and out.seeds_at is not None:
            frame.at[i, "seeds_needed"] = out.seeds_at(level)
    return frame
