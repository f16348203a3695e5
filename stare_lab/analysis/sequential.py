"""Group-sequential decisions for a sweep's declared claims: looks, error spending, and the graph over claims.

A sequential design runs a sweep in looks (seeds per arm n_1 < … < n_K), decides the claims at each look and
adds seeds only to the arms an open claim reads, until every claim is decided, futile or the budget n_K is
spent (docs/statistics.md, "Sequential designs"). This module is the statistics of it: pure numpy/scipy.

**Statistics.** Each claim c at look k has a z-statistic Z_ck oriented towards the claim (Z > 0: the claim's
side of its bound; `ClaimLook`) and the standard error of its estimate. Under the canonical joint normal
(Jennison & Turnbull 2000, ch. 3 and 11) Z_k ~ N(θ√I_k, 1) with Cov(Z_i, Z_j) = √(I_i/I_j) for i ≤ j. The
information used here is the seed schedule, t_k = n_k/n_K, for both the spending and the correlation: a
claim's estimate at a look is the mean over its seeds with the problems fixed, Var(D_k) = v_problem +
v_seed/n_k, so Cov(D_i, D_j) = Var(D_j) (independent increments) and the true correlation √(I_i/I_j) is at
least √(n_i/n_j). By Slepian's inequality boundaries computed at the lower correlation are conservative,
and exact when the seed variance dominates. A t statistic (estimated variance) enters through its tail
probability, z = Φ⁻¹(F_t(ν; t)) (the significance-level approach; an approximation at few seeds, simulated
in the docs).

**Boundaries by error spending** (Lan & DeMets 1983, Biometrika 70(3):659-663): at level a the one-sided
boundary c_k solves P_0(Z_1 < c_1, …, Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = f(t_k; a) − f(t_{k−1}; a), computed by
recursive numerical integration on a grid with Simpson's rule (Armitage, McPherson & Rowe 1969, JRSS A
132:235-244; Jennison & Turnbull 2000, ch. 19):

    obf      f(t; a) = 2 − 2Φ(Φ⁻¹(1 − a/2)/√t)       (Lan-DeMets O'Brien-Fleming type)
    pocock   f(t; a) = a·ln(1 + (e − 1)t)           (Lan-DeMets Pocock type)
    hsd      f(t; a) = a(1 − e^{−γt})/(1 − e^{−γ})   (Hwang, Shih & DeCani 1990, Stat Med 9:1439-1445; a·t at γ = 0)

**Multiplicity over claims and looks.** Each claim gives two one-sided elementary hypotheses: H_c+ (the claim
is false: θ_c ≤ bound; rejected → "supported") and H_c− (θ_c ≥ bound; rejected → "contradicted"). A false
verdict, of either sign, is the rejection of a true elementary hypothesis, so the familywise error over the
2m hypotheses is the probability of any false verdict. They are tested with the graphical approach for
group-sequential designs (Maurer & Bretz 2013, Statistics in Biopharmaceutical Research 5(4):311-320; the
graph algorithm of Bretz, Maurer, Brannath & Posch 2009, Stat Med 28:586-604): hypothesis j holds the weight
w_j of the graph; at look k it is rejected if Z_jl ≥ c_l(α·w_j) at some look l ≤ k with data, the boundaries
recomputed at its current level for every look so far; a rejected hypothesis passes its weight along the
graph's edges, and the others are tested again at the same look. Default graph: Holm's (each hypothesis
starts with 1/(2m); a rejected one passes its weight equally to the hypotheses of the other claims, none to
its own claim's opposite, which can no longer be rejected once the claim is decided). With K = 1 and one
claim this is the two-sided test at α. Valid (FWER ≤ α in the strong sense) under any dependence between
claims: each intersection hypothesis H_J is tested by the weighted Bonferroni combination of level-α·w_j(J)
group-sequential tests, the graph's weights are monotone in J and the boundaries decrease with the level, so
the procedure is the consonant shortcut of that closed test.

**Futility** (non-binding): at an interim look a claim whose conditional power at the last look is below the
design's threshold for both verdicts is "futile": its arms get no more seeds for it. Conditional power at the
last look (Lan, Simon & Halperin 1982, Commun Stat C 1:207-219; Jennison & Turnbull 2000, ch. 10) of a
hypothesis at its current level: P(Z_K ≥ c_K | Z_k = z) = Φ((z + η(r − 1) − c_K√r)/√(r − 1)), r = n_K/n_k,
with the drift η = θ√I_k under the design's target effect (η = target/SE_k, default) or the current estimate
(η = z), at every interim look from the design's `futility_from` (default the first: an estimate from
few seeds is wide, and a later first futility look trades runs for power). A futile claim is never
rejected on data it did not collect, so futility stopping only removes rejections: the type I error is
not inflated whether or not the stop is obeyed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import optimize, special

from stare_lab.plan.design import schedule_looks

SPENDING = ("obf", "pocock", "hsd")
DIRECTIONS = ("both", "support")
FUTILITY_UNDER = ("target", "estimate")
STATES = ("open", "supported", "contradicted", "futile", "undecided")
OPEN, SUPPORTED, CONTRADICTED, FUTILE, UNDECIDED = range(len(STATES))
# A claim form's direction: +1 where the claim is D > bound, −1 where it is D < bound (docs/claims.md)
FORM_DIRECTIONS = {"superiority": 1, "non_inferiority": 1, "retained_gain": 1, "inferiority": -1, "gain_below": -1}
STEP = 0.05  # grid spacing in z (at most); a kernel's sd is covered by at least 6 steps
WIDTH = 8.0  # the grid spans the mean ± 8 sd (mass outside: 1e-15)


class DesignError(ValueError):
    """An impossible design or look (one line naming the problem)."""


# -- error spending -------------------------------------------------------------------------------------


def spending(t, alpha: float, name: str = "obf", gamma: float | None = None, sides: int = 1) -> np.ndarray:
    """Type I error spent by information fraction t ∈ (0, 1] (module docstring's f(t; a)); f(1) = alpha.

    sides = 2: alpha is two-sided and each of the two symmetric boundaries spends f(t; alpha/2), the
    convention of Lan-DeMets programs (Reboussin et al. 2000) and gsDesign."""
    if sides not in (1, 2):
        raise DesignError(f"sides {sides!r}: expected 1 (one-sided) or 2 (symmetric two-sided)")
    a = alpha / sides
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        if name == "obf":
            out = 2.0 * special.ndtr(special.ndtri(a / 2) / np.sqrt(t))
        elif name == "pocock":
            out = a * np.log1p((math.e - 1.0) * t)
        elif name == "hsd":
            g = _gamma(gamma)
            out = a * t if g == 0 else a * -np.expm1(-g * t) / -math.expm1(-g)
        else:
            raise DesignError(f"spending {name!r}: expected one of {', '.join(SPENDING)}")
    return np.where(t > 0, out, 0.0)


def _gamma(gamma: float | None) -> float:
    if gamma is None or not math.isfinite(gamma):
        raise DesignError(
            f"spending 'hsd' needs a finite gamma (e.g. -4 O'Brien-Fleming-like, 1 Pocock-like), got {gamma!r}"
        )
    return float(gamma)


# -- the canonical joint normal: exit probabilities by recursive integration -----------------------------


def _simpson(lo: float, hi: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid points on [lo, hi] and Simpson's weights (an even number of intervals, each ≤ step)."""
    n = max(2, math.ceil((hi - lo) / step))
    n += n % 2
    z = np.linspace(lo, hi, n + 1)
    w = np.full(n + 1, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return z, w * (hi - lo) / (3 * n)


def _exit_terms(u: np.ndarray, info_prev: float, info: float, drift: float) -> tuple[np.ndarray, float]:
    """(the mean of Z_k√I_k given Z_{k−1} = u, the sd of the increment): Z_k√I_k = u√I_{k−1} + N(θΔ, Δ)."""
    delta = info - info_prev
    return u * math.sqrt(info_prev) + drift * delta, math.sqrt(delta)


def _lse(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """log Σ exp(x) (scipy's logsumexp without its array-API overhead, which dominated the boundaries' time)."""
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return out.reshape(()) if axis is None else np.squeeze(out, axis=axis)


def _log_up(c: float, u: np.ndarray, logq: np.ndarray, info_prev: float, info: float, drift: float) -> float:
    """log P(continue so far, Z_k ≥ c) from the sub-density `logq` (log of density × weight) at u."""
    mean, sd = _exit_terms(u, info_prev, info, drift)
    return float(_lse(logq + special.log_ndtr((mean - c * math.sqrt(info)) / sd)))


def _log_down(c: float, u: np.ndarray, logq: np.ndarray, info_prev: float, info: float, drift: float) -> float:
    """log P(continue so far, Z_k ≤ c)."""
    mean, sd = _exit_terms(u, info_prev, info, drift)
    return float(_lse(logq + special.log_ndtr((c * math.sqrt(info) - mean) / sd)))


def _advance(u, logq, info_prev, info, info_next, drift, region, center):
    """The sub-density of Z_k on the continuation region (lower, upper) (log of density × Simpson weight),
    on a grid around `center` (the mean of Z_k) fine enough for the kernels into and out of look k; None
    where the region holds no mass."""
    lo, hi = max(region[0], center - WIDTH), min(region[1], center + WIDTH)
    if not hi > lo:
        return None
    widths = [math.sqrt((info - info_prev) / info)] + (
        [] if info_next is None else [math.sqrt((info_next - info) / info)]
    )
    z, w = _simpson(lo, hi, min(STEP, min(widths) / 6))
    mean, sd = _exit_terms(u, info_prev, info, drift)
    x = (z[:, None] * math.sqrt(info) - mean[None, :]) / sd
    logk = -0.5 * x * x - 0.5 * math.log(2 * math.pi) + math.log(math.sqrt(info) / sd)
    dens = _lse(logq[None, :] + logk, axis=1)
    return z, dens + np.log(w)


def exit_probabilities(upper, info, drift: float = 0.0, lower=None, start: tuple[float, float] | None = None):
    """(P(first exit at look k above upper_k), P(… below lower_k)) for k = 1..K, of the canonical process
    with information `info` (increasing; any scale) and drift θ (E Z_k = θ√I_k). `start` = (I_0, z_0): given
    Z = z_0 at information I_0 (conditional probabilities); default the origin (I_0 = 0)."""
    upper = np.asarray(upper, dtype=float)
    info = np.asarray(info, dtype=float)
    lower = np.full(len(upper), -np.inf) if lower is None else np.asarray(lower, dtype=float)
    info0, z0 = start if start is not None else (0.0, 0.0)
    u, logq, info_prev = np.array([z0]), np.array([0.0]), info0
    up, down = np.zeros(len(upper)), np.zeros(len(upper))
    for k in range(len(upper)):
        if np.isfinite(upper[k]):
            up[k] = math.exp(_log_up(upper[k], u, logq, info_prev, info[k], drift))
        if np.isfinite(lower[k]):
            down[k] = math.exp(_log_down(lower[k], u, logq, info_prev, info[k], drift))
        if k + 1 == len(upper):
            break
        center = (z0 * math.sqrt(info0) + drift * (info[k] - info0)) / math.sqrt(info[k])
        region = (lower[k], upper[k])
        state = _advance(u, logq, info_prev, info[k], info[k + 1], drift, region, center)
        if state is None:
            break
        (u, logq), info_prev = state, info[k]
    return up, down


def _solve(target: float, log_exit, bracket: tuple[float, float] = (-12.0, 40.0)) -> float:
    """The boundary c whose exit probability log_exit(c) (decreasing in c) equals target: inf where nothing
    is to be spent, −inf where more is to be spent than the continuation holds."""
    if not target > 1e-290:
        return math.inf
    goal = math.log(target)
    lo, hi = bracket
    if log_exit(lo) < goal:
        return -math.inf
    return float(optimize.brentq(lambda c: log_exit(c) - goal, lo, hi, xtol=1e-11, rtol=1e-15, maxiter=200))


def boundaries(fractions, alpha: float, spending_name: str = "obf", gamma: float | None = None, sides: int = 1):
    """The error-spending z-boundaries c_1..c_K at information fractions t_1 < … < t_K (= 1 for the full
    level) under H0: one-sided (continue while Z_k < c_k; P(exit at k) = f(t_k) − f(t_{k−1})), or with
    sides = 2 the symmetric two-sided ones (continue while |Z_k| < c_k, each side spending f(t; α/2))."""
    t = np.asarray(fractions, dtype=float)
    spent = spending(t, alpha, spending_name, gamma, sides)
    inc = np.diff(np.concatenate([[0.0], spent])) * sides
    c = np.full(len(t), math.inf)
    u, logq, info_prev = np.array([0.0]), np.array([0.0]), 0.0
    for k in range(len(t)):

        def log_exit(x: float, k=k, u=u, logq=logq, info_prev=info_prev) -> float:
            up = _log_up(x, u, logq, info_prev, t[k], 0.0)
            return up if sides == 1 else float(np.logaddexp(up, _log_down(-x, u, logq, info_prev, t[k], 0.0)))

        c[k] = _solve(inc[k], log_exit)
        if k + 1 < len(t):
            region = (-c[k] if sides == 2 else -math.inf, c[k])
            state = _advance(u, logq, info_prev, t[k], t[k + 1], 0.0, region, 0.0)
            if state is None:
                c[k + 1 :] = math.inf
                break
            (u, logq), info_prev = state, t[k]
    return c


@lru_cache(maxsize=65536)
def _level_bounds(fractions: tuple[float, ...], level: float, name: str, gamma: float | None) -> tuple[float, ...]:
    """One-sided boundaries at `level` (cached: the graph asks for the same few levels again and again)."""
    if not level > 0:
        return (math.inf,) * len(fractions)
    return tuple(boundaries(fractions, level, name, gamma))


def conditional_power(z, level_bound_last, ratio, drift) -> np.ndarray:
    """P(Z_K ≥ c_K | Z_k = z) with r = I_K/I_k = `ratio` > 1 and the drift η = θ√I_k (module docstring)."""
    r = np.asarray(ratio, dtype=float)
    x = (np.asarray(z) + np.asarray(drift) * (r - 1) - np.asarray(level_bound_last) * np.sqrt(r)) / np.sqrt(r - 1)
    return special.ndtr(x)


# -- the graph over the claims' hypotheses --------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    """Initial weights (sum ≤ 1) and transition weights (rows sum ≤ 1, zero diagonal) over the hypotheses,
    in the order (claim 1 +, claim 1 −, claim 2 +, …) with directions "both", (claim 1, claim 2, …) with
    "support" (Bretz et al. 2009)."""

    weights: tuple[float, ...]
    transitions: tuple[tuple[float, ...], ...]

    @staticmethod
    def holm(claims: int, per_claim: int = 2) -> Graph:
        """Holm's graph: equal weights; a rejected hypothesis passes its weight equally to the hypotheses of
        the other claims (none to its own claim's other direction)."""
        h = claims * per_claim
        owner = np.arange(h) // per_claim
        other = (owner[:, None] != owner[None, :]).astype(float)
        g = other / max(per_claim * (claims - 1), 1)
        return Graph(tuple([1.0 / h] * h), tuple(tuple(float(x) for x in row) for row in g))

    def check(self, hypotheses: int) -> None:
        w, g = np.asarray(self.weights, dtype=float), np.asarray(self.transitions, dtype=float)
        if w.shape != (hypotheses,) or g.shape != (hypotheses, hypotheses):
            raise DesignError(f"graph: expected {hypotheses} weights and a {hypotheses}×{hypotheses} transition matrix")
        if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() <= 1 + 1e-12):
            raise DesignError(f"graph: weights {tuple(w)} must be ≥ 0 and sum to at most 1")
        if not (np.all(np.isfinite(g)) and np.all(g >= 0) and np.all(g.sum(1) <= 1 + 1e-12)):
            raise DesignError("graph: transition weights must be ≥ 0 with each row summing to at most 1")
        if np.any(np.diag(g) != 0):
            raise DesignError("graph: a hypothesis cannot pass weight to itself (the diagonal must be 0)")


def _pass_weight(w: np.ndarray, g: np.ndarray, rows: np.ndarray, j: np.ndarray) -> None:
    """Reject hypothesis j[i] in sweep rows[i] (in place): Bretz et al. (2009), Algorithm 1,
    w_l += w_j g_jl;  g_lk = (g_lk + g_lj g_jk)/(1 − g_lj g_jl) (0 where g_lj g_jl = 1);  row and column j → 0."""
    wj = w[rows, j]
    g_row = g[rows, j, :]  # g_jk
    g_col = g[rows, :, j]  # g_lj
    w[rows] += wj[:, None] * g_row
    num = g[rows] + g_col[:, :, None] * g_row[:, None, :]
    den = 1.0 - g_col * g_row
    with np.errstate(divide="ignore", invalid="ignore"):
        new = np.where(den[:, :, None] > 1e-15, num / den[:, :, None], 0.0)
    h = g.shape[1]
    new[:, np.arange(h), np.arange(h)] = 0.0
    new[np.arange(len(rows)), j, :] = 0.0
    new[np.arange(len(rows)), :, j] = 0.0
    g[rows] = new
    w[rows, j] = 0.0


# -- the design ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequentialClaim:
    """A claim as the design sees it: its id, the effect beyond its bound (towards the claim, in the claim's
    unit) the design is powered for (None: not given; only futility under the target reads it), the arms it
    reads and, for simulation, their coefficients in the claim's combination (default A − B for two arms, A
    for one)."""

    id: str
    target: float | None = None
    arms: tuple[str, ...] = ()
    coefs: tuple[float, ...] = ()

    def combination(self) -> tuple[float, ...]:
        if self.coefs:
            return self.coefs
        return {1: (1.0,), 2: (1.0, -1.0)}.get(len(self.arms), ())


@dataclass(frozen=True)
class SequentialDesign:
    """Looks (seeds per arm at each look, increasing), the familywise α over all claims, looks and verdicts,
    the error spending, the futility threshold on conditional power (0: none), and the graph (None: Holm's).
    directions "both": each claim can be supported or contradicted; "support": only supported (one-sided)."""

    claims: tuple[SequentialClaim, ...]
    looks: tuple[int, ...]
    alpha: float = 0.05
    spending: str = "obf"
    gamma: float | None = None
    futility: float = 0.0
    futility_under: str = "target"
    futility_from: int = 1
    directions: str = "both"
    graph: Graph | None = None
    _graph: Graph = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_design(self)
        per = 2 if self.directions == "both" else 1
        graph = self.graph or Graph.holm(len(self.claims), per)
        graph.check(per * len(self.claims))
        object.__setattr__(self, "_graph", graph)

    @property
    def fractions(self) -> tuple[float, ...]:
        """Information fractions t_k = n_k / n_K (the spending and correlation time, module docstring)."""
        return tuple(n / self.looks[-1] for n in self.looks)

    @property
    def per_claim(self) -> int:
        return 2 if self.directions == "both" else 1

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm a claim reads, in the claims' order."""
        return tuple(dict.fromkeys(a for c in self.claims for a in c.arms))

    def hypotheses(self) -> tuple[str, ...]:
        """The elementary hypotheses' names in the graph's order: `id+` (supported), `id−` (contradicted)."""
        signs = ("+", "−")[: self.per_claim]
        return tuple(f"{c.id}{s}" for c in self.claims for s in signs)

    def bounds(self, level: float) -> np.ndarray:
        """One-sided boundaries of one hypothesis at local level `level`, at every look."""
        return np.array(_level_bounds(self.fractions, float(level), self.spending, self.gamma))


def looks_from_schedule(maximum: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Seeds per arm at each look from a maximum and a schedule of fractions (the last 1): (32, (1/8, 1/4,
    1/2, 1)) → (4, 8, 16, 32); refused where rounding makes two looks equal."""
    looks, problem = schedule_looks(maximum, [float(f) for f in fractions])
    if problem:
        raise DesignError(f"schedule: {problem}")
    return looks


def _check_design(d: SequentialDesign) -> None:
    """One-line refusals of an impossible design."""
    looks = tuple(d.looks)
    if not looks or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in looks):
        raise DesignError(f"looks {looks!r}: expected seeds per arm at each look, whole numbers, e.g. (4, 8, 16, 32)")
    if looks[0] < 2:
        raise DesignError(f"looks {looks}: the first look needs at least 2 seeds per arm (a variance over seeds)")
    if any(b <= a for a, b in zip(looks, looks[1:], strict=False)):
        raise DesignError(f"looks {looks}: seeds per arm must increase strictly from look to look")
    if not (isinstance(d.alpha, (int, float)) and 0 < d.alpha < 1):
        raise DesignError(f"alpha {d.alpha!r}: expected a value in (0, 1)")
    if d.spending not in SPENDING:
        raise DesignError(f"spending {d.spending!r}: expected one of {', '.join(SPENDING)}")
    if d.spending == "hsd":
        _gamma(d.gamma)
    elif d.gamma is not None:
        raise DesignError(f"gamma {d.gamma!r}: only spending 'hsd' takes a gamma")
    if not (isinstance(d.futility, (int, float)) and 0 <= d.futility < 1):
        raise DesignError(f"futility {d.futility!r}: expected a conditional-power threshold in [0, 1)")
    if d.futility_under not in FUTILITY_UNDER:
        raise DesignError(f"futility_under {d.futility_under!r}: expected one of {', '.join(FUTILITY_UNDER)}")
    if not (isinstance(d.futility_from, int) and 1 <= d.futility_from <= max(1, len(looks) - 1)):
        raise DesignError(
            f"futility_from {d.futility_from!r}: expected the first look (1-based) of a futility stop, 1 … K − 1"
        )
    if d.directions not in DIRECTIONS:
        raise DesignError(f"directions {d.directions!r}: expected one of {', '.join(DIRECTIONS)}")
    _check_claims(d.claims)
    if d.futility > 0 and d.futility_under == "target":
        untargeted = [c.id for c in d.claims if c.target is None]
        if untargeted:
            raise DesignError(f"claim {untargeted[0]}: futility under the target needs its target (the effect > 0)")


def _check_claims(claims: tuple[SequentialClaim, ...]) -> None:
    if not claims:
        raise DesignError("claims: a design needs at least one claim")
    ids = [c.id for c in claims]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise DesignError(f"claims: id {twice[0]!r} appears more than once")
    for c in claims:
        if c.target is not None and not (
            isinstance(c.target, (int, float)) and math.isfinite(c.target) and c.target > 0
        ):
            raise DesignError(
                f"claim {c.id}: target {c.target!r} must be an effect > 0 (beyond the bound, the claim's unit)"
            )
        if c.coefs and len(c.coefs) != len(c.arms):
            raise DesignError(f"claim {c.id}: {len(c.coefs)} coefficients for {len(c.arms)} arms")


# -- one look's statistic --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimLook:
    """One claim at one look: z oriented towards the claim (normal scale), the standard error of its
    estimate (the claim's unit; for the conditional power under the target) and the estimate's distance
    from the bound towards the claim (the claim's unit)."""

    z: float
    se: float
    effect: float = math.nan

    @staticmethod
    def from_estimate(
        estimate: float, se: float, bound: float = 0.0, direction: int = 1, df: float = math.inf
    ) -> ClaimLook:
        """From an estimate, its SE and the bound the claim is tested against (hypotheses.py's estimate and
        compare.contrast's `se` and `df`, or Welch's): t = direction·(estimate − bound)/se, then, with finite
        df, z = Φ⁻¹(F_t(df; t)) at the same tail probability."""
        if direction not in (1, -1):
            raise DesignError(f"direction {direction!r}: expected +1 (claim D > bound) or −1 (claim D < bound)")
        if not (math.isfinite(se) and se > 0):
            raise DesignError(f"se {se!r}: expected a standard error > 0")
        effect = direction * (estimate - bound)
        t = effect / se
        z = t if math.isinf(df) else float(-special.ndtri(special.stdtr(df, -t)))
        return ClaimLook(z=z, se=se, effect=effect)

    @staticmethod
    def from_p_value(p_support: float, se: float, effect: float = math.nan) -> ClaimLook:
        """From the claim's one-sided p-value (hypotheses.Outcome.p_support: the seeds × problems t at 2
        seeds with the seed part at t(1), Welch, Fieller's C): z = Φ⁻¹(1 − p)."""
        if not 0 <= p_support <= 1:
            raise DesignError(f"p_support {p_support!r}: expected a p-value in [0, 1]")
        p = min(max(p_support, 1e-300), 1.0)
        return ClaimLook(z=float(-special.ndtri(p)), se=se, effect=effect)


def direction_of(form: str) -> int:
    """+1 or −1 for a claim form of docs/claims.md; equivalence (TOST: two nulls whose union is tested) is
    refused: it has no single z-statistic."""
    if form not in FORM_DIRECTIONS:
        raise DesignError(f"form {form!r}: a sequential design takes {', '.join(FORM_DIRECTIONS)} (not equivalence)")
    return FORM_DIRECTIONS[form]


# -- the procedure, vectorised over sweeps ----------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """The procedure over S sweeps (arrays; decide() reads sweep 0): per claim its state (codes of STATES)
    and the look (0-based) it was decided or found futile (−1: none); per look whether it was open at the
    start of it (its arms ran that look); per hypothesis the final local weight and the last conditional
    power computed (NaN where none)."""

    state: np.ndarray  # [S, m] int
    look: np.ndarray  # [S, m] int
    open_at: np.ndarray  # [S, m, L] bool
    weights: np.ndarray  # [S, H]
    power: np.ndarray  # [S, H]


def run_looks(design: SequentialDesign, z: np.ndarray, se: np.ndarray) -> Run:
    """The procedure over the first L = z.shape[2] looks of S sweeps: z and se are [S, m, L] (NaN where a
    claim was not measured; an open claim always is)."""
    s, m, n_looks = z.shape
    per = design.per_claim
    owner = np.arange(m * per) // per
    sign = np.where(np.arange(m * per) % per == 0, 1.0, -1.0)
    zn = sign[None, :, None] * z[:, owner, :]
    graph = design._graph
    w = np.tile(np.asarray(graph.weights, dtype=float), (s, 1))
    g = np.tile(np.asarray(graph.transitions, dtype=float), (s, 1, 1))
    state = np.full((s, m), OPEN)
    look = np.full((s, m), -1)
    last = np.full((s, m), -1)
    open_at = np.zeros((s, m, n_looks), dtype=bool)
    power = np.full((s, m * per), np.nan)
    for k in range(n_looks):
        live = state == OPEN
        open_at[:, :, k] = live
        last[live] = k
        _graph_rounds(design, zn, w, g, state, look, last, k, owner, sign)
        if design.futility_from - 1 <= k < len(design.looks) - 1 and design.futility > 0:
            power = _futility(design, zn, se[:, owner, k], w, state, look, k, owner)
    if n_looks == len(design.looks):
        state[state == OPEN] = UNDECIDED
    return Run(state=state, look=look, open_at=open_at, weights=w, power=power)


def _bounds_at(design: SequentialDesign, levels: np.ndarray) -> np.ndarray:
    """Boundaries [..., K] at each local level (levels rounded to 1e-14, exact boundaries per distinct one)."""
    keys = np.round(levels.ravel(), 14)
    uniq, inverse = np.unique(keys, return_inverse=True)
    table = np.array([design.bounds(u) for u in uniq]).reshape(len(uniq), len(design.looks))
    return table[inverse].reshape(levels.shape + (len(design.looks),))


def _graph_rounds(design, zn, w, g, state, look, last, k, owner, sign) -> None:
    """At look k: reject, one hypothesis per sweep and round, every hypothesis whose statistic crosses its
    boundary at its current level at some look ≤ k with data, passing weights, until none does."""
    used = np.arange(k + 1)[None, None, :] <= last[:, owner][:, :, None]
    while True:
        decided = (state == SUPPORTED) | (state == CONTRADICTED)
        eligible = (w > 0) & ~decided[:, owner]
        bounds = _bounds_at(design, design.alpha * w)[:, :, : k + 1]
        with np.errstate(invalid="ignore"):
            crossed = np.any((zn[:, :, : k + 1] >= bounds) & used, axis=2) & eligible
        rows = np.flatnonzero(crossed.any(axis=1))
        if rows.size == 0:
            return
        j = crossed[rows].argmax(axis=1)
        state[rows, owner[j]] = np.where(sign[j] > 0, SUPPORTED, CONTRADICTED)
        look[rows, owner[j]] = k
        _pass_weight(w, g, rows, j)


def _futility(design, zn, se_k, w, state, look, k, owner) -> np.ndarray:
    """Conditional power at the last look of each open claim's hypotheses (module docstring); a claim whose
    hypotheses all fall below the threshold becomes futile. Returns the powers [S, H] (NaN: not open)."""
    ratio = design.looks[-1] / design.looks[k]
    c_last = _bounds_at(design, design.alpha * w)[:, :, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        if design.futility_under == "target":
            drift = np.array([float(c.target or math.nan) for c in design.claims])[owner][None, :] / se_k
        else:
            drift = zn[:, :, k]
        cp = np.where(w > 0, conditional_power(zn[:, :, k], c_last, ratio, drift), 0.0)
    live = state == OPEN
    cp = np.where(live[:, owner], cp, np.nan)
    best = cp.reshape(cp.shape[0], -1, design.per_claim).max(axis=2)
    with np.errstate(invalid="ignore"):
        futile = live & (best < design.futility)
    state[futile] = FUTILE
    look[futile] = k
    return cp


# -- the decision API ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimState:
    """One claim after the looks so far: its state (STATES), the look (1-based) that decided it or found it
    futile, its last z, the local levels α·w of its hypotheses (supported, contradicted) and their last
    conditional power (NaN where not computed)."""

    id: str
    state: str
    look: int | None
    z: float
    levels: tuple[float, ...]
    conditional_power: tuple[float, ...]


@dataclass(frozen=True)
class Decision:
    """Per claim its state; the claims still open, the arms the next look extends and the seeds per arm it
    brings them to (None: done, every claim decided, futile or undecided at the last look)."""

    looks_done: int
    claims: tuple[ClaimState, ...]
    open: tuple[str, ...]
    arms: tuple[str, ...]
    seeds_now: int
    next_seeds: int | None

    @property
    def done(self) -> bool:
        return self.next_seeds is None

    def states(self) -> dict[str, str]:
        return {c.id: c.state for c in self.claims}


def decide(design: SequentialDesign, looks: Sequence[Mapping[str, ClaimLook]]) -> Decision:
    """The claims' states after the looks so far (looks[k]: claim id → ClaimLook at design.looks[k] seeds
    per arm; a claim decided or futile before look k need not appear in it), recomputed from the start."""
    z, se = _look_arrays(design, looks)
    run = run_looks(design, z, se)
    missing = run.open_at[0] & np.isnan(z[0])
    if missing.any():
        c, k = (int(x[0]) for x in np.nonzero(missing))
        raise DesignError(f"look {k + 1}: claim {design.claims[c].id!r} is open and has no statistic")
    return _decision(design, run, z, len(looks))


def _look_arrays(design: SequentialDesign, looks: Sequence[Mapping[str, ClaimLook]]) -> tuple[np.ndarray, np.ndarray]:
    if not 1 <= len(looks) <= len(design.looks):
        raise DesignError(f"{len(looks)} looks given; the design has {len(design.looks)} (seeds {design.looks})")
    index = {c.id: i for i, c in enumerate(design.claims)}
    z = np.full((1, len(index), len(looks)), np.nan)
    se = np.full_like(z, np.nan)
    for k, at in enumerate(looks):
        for cid, stat in at.items():
            if cid not in index:
                raise DesignError(f"look {k + 1}: claim {cid!r} is not in the design ({', '.join(index)})")
            if math.isnan(stat.z):
                raise DesignError(f"look {k + 1}: claim {cid!r} has z {stat.z!r}")
            z[0, index[cid], k], se[0, index[cid], k] = stat.z, stat.se
    return z, se


def _decision(design: SequentialDesign, run: Run, z: np.ndarray, done: int) -> Decision:
    per = design.per_claim
    claims = []
    for i, c in enumerate(design.claims):
        hyp = slice(i * per, (i + 1) * per)
        last = z[0, i][~np.isnan(z[0, i])]
        claims.append(
            ClaimState(
                id=c.id,
                state=STATES[run.state[0, i]],
                look=int(run.look[0, i]) + 1 if run.look[0, i] >= 0 else None,
                z=float(last[-1]) if last.size else math.nan,
                levels=tuple(float(x) for x in design.alpha * run.weights[0, hyp]),
                conditional_power=tuple(float(x) for x in run.power[0, hyp]),
            )
        )
    still = tuple(c.id for c in claims if c.state == "open")
    arms = tuple(dict.fromkeys(a for c in design.claims if c.id in still for a in c.arms))
    nxt = design.looks[done] if still and done < len(design.looks) else None
    return Decision(done, tuple(claims), still, arms, design.looks[done - 1], nxt)


def repeated_p_value(design: SequentialDesign, zs: Sequence[float]) -> float:
    """The sequential p-value of one hypothesis after looks 1..k (its oriented z at each): the smallest level
    a at which its group-sequential test would have crossed by look k, inf{a: ∃ l ≤ k, z_l ≥ c_l(a)}
    (Jennison & Turnbull 2000, ch. 9; at K = 1, 1 − Φ(z)). Reporting only: decide() compares boundaries."""
    z = np.asarray(zs, dtype=float)
    if not 1 <= len(z) <= len(design.looks):
        raise DesignError(f"{len(z)} looks given; the design has {len(design.looks)}")

    def excess(log_a: float) -> float:
        return float(np.max(z - design.bounds(math.exp(log_a))[: len(z)]))

    lo, hi = math.log(1e-15), math.log(1 - 1e-9)
    if excess(hi) < 0:
        return 1.0
    if excess(lo) >= 0:
        return 1e-15
    return math.exp(optimize.brentq(excess, lo, hi, xtol=1e-12))


# -- simulation and expected cost ----------------------------------------------------------------------


@dataclass(frozen=True)
class Simulation:
    """Simulated sweeps: per claim its state (codes of STATES) and deciding look, per sweep its runs (seeds
    summed over arms), and the statistics the procedure saw."""

    state: np.ndarray  # [S, m]
    look: np.ndarray  # [S, m]
    runs: np.ndarray  # [S]
    z: np.ndarray  # [S, m, K]
    se: np.ndarray  # [S, m, K]

    def rate(self, claim: int, state: str) -> float:
        return float(np.mean(self.state[:, claim] == STATES.index(state)))


def simulate(
    design: SequentialDesign,
    means: Mapping[str, float],
    *,
    sweeps: int,
    seed: int = 0,
    sd: float | Mapping[str, float] = 1.0,
    problem_sd: float | Mapping[str, float] = 0.0,
    statistic: str = "z",
) -> Simulation:
    """Sweeps of the design on simulated runs: each arm's per-seed score is its mean + sd·N(0, 1), plus a
    per-sweep offset problem_sd·N(0, 1) shared by its seeds (the arm × problem part on fixed problems); a
    claim's estimate is Σ coef·(arm's mean over its seeds so far), tested against bound 0 (set `means` so
    that a claim's true effect is Σ coef·mean). statistic "z": its known SE; "t": Welch's t over seeds (each
    arm's variance estimated; no problem part), turned to z at equal tail probability. The same `seed`
    draws the same runs for every design with the same maximum seeds and arms."""
    arms = design.arms
    coefs = _coef_matrix(design, arms)
    n = np.asarray(design.looks)
    sds, psd = _per_arm(sd, arms, "sd"), _per_arm(problem_sd, arms, "problem_sd")
    if statistic not in ("z", "t"):
        raise DesignError(f"statistic {statistic!r}: expected 'z' or 't'")
    if statistic == "t" and np.any(psd > 0):
        raise DesignError("statistic 't' estimates the variance over seeds: it takes no problem_sd")
    rng = np.random.default_rng(seed)
    mu = np.array([float(means[a]) for a in arms])
    x = mu[None, :, None] + sds[None, :, None] * rng.standard_normal((sweeps, len(arms), n[-1]))
    x += psd[None, :, None] * rng.standard_normal((sweeps, len(arms), 1))
    z, se = _statistics(x, n, coefs, sds, psd, statistic)
    run = run_looks(design, z, se)
    used = np.einsum("ma,smk->sak", (coefs != 0).astype(float), run.open_at.astype(float)) > 0
    last = np.where(used.any(axis=2), len(n) - 1 - np.argmax(used[:, :, ::-1], axis=2), -1)
    runs = np.where(last >= 0, n[np.maximum(last, 0)], 0).sum(axis=1)
    return Simulation(state=run.state, look=run.look, runs=runs, z=z, se=se)


def _coef_matrix(design: SequentialDesign, arms: tuple[str, ...]) -> np.ndarray:
    out = np.zeros((len(design.claims), len(arms)))
    for i, c in enumerate(design.claims):
        comb = c.combination()
        if not comb:
            raise DesignError(f"claim {c.id}: give coefs for its {len(c.arms)} arms to simulate it")
        for arm, coef in zip(c.arms, comb, strict=True):
            out[i, arms.index(arm)] += coef
    return out


def _per_arm(value: float | Mapping[str, float], arms: tuple[str, ...], name: str) -> np.ndarray:
    if isinstance(value, Mapping):
        missing = [a for a in arms if a not in value]
        if missing:
            raise DesignError(f"{name}: no value for arm {missing[0]!r}")
        return np.array([float(value[a]) for a in arms])
    return np.full(len(arms), float(value))


def _statistics(x, n, coefs, sds, psd, statistic) -> tuple[np.ndarray, np.ndarray]:
    """z and se [S, m, K] of every claim at every look from the runs x [S, A, N]."""
    total = np.cumsum(x, axis=2)[:, :, n - 1]
    mean = total / n
    est = np.einsum("ma,sak->smk", coefs, mean)
    if statistic == "z":
        var = (coefs**2) @ (psd[:, None] ** 2 + sds[:, None] ** 2 / n[None, :])
        se = np.broadcast_to(np.sqrt(var)[None], est.shape)
        return est / se, np.array(se)
    square = np.cumsum(x * x, axis=2)[:, :, n - 1]
    var_arm = np.maximum(square - n * mean**2, 0.0) / (n - 1)
    terms = np.einsum("ma,sak->smak", coefs**2, var_arm / n)
    var = terms.sum(axis=2)
    df = var**2 / np.einsum("smak,k->smk", terms**2, 1.0 / (n - 1))
    se = np.sqrt(var)
    z = -special.ndtri(special.stdtr(df, -est / se))
    return z, se


@dataclass(frozen=True)
class ExpectedRuns:
    """Mean runs of the sequential design (and its Monte Carlo SE) against the fixed design's n_K per arm."""

    sequential: float
    se: float
    fixed: int

    @property
    def ratio(self) -> float:
        return self.sequential / self.fixed


def expected_runs(design: SequentialDesign, means: Mapping[str, float], *, sweeps: int = 10_000, **kw) -> ExpectedRuns:
    """The expected number of runs of the design (seeds summed over its arms) under the arms' true means, by
    simulation (simulate's keywords), against the fixed design with the same maximum seeds on every arm."""
    sim = simulate(design, means, sweeps=sweeps, **kw)
    return ExpectedRuns(
        sequential=float(sim.runs.mean()),
        se=float(sim.runs.std(ddof=1) / math.sqrt(sweeps)) if sweeps > 1 else math.nan,
        fixed=int(design.looks[-1] * len(design.arms)),
    )
