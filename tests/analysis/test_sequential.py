"""Group-sequential decisions of a sweep's claims (stare_lab.analysis.sequential; docs/statistics.md,
"Sequential designs").

Values against published tables (Lan-DeMets boundaries as gsDesign prints them, Armitage, McPherson &
Rowe's repeated significance tests, Jennison & Turnbull's constants, maximum information and expected
sample sizes), against Monte Carlo and scipy's multivariate normal with fixed seeds, hand-worked cases
(K = 1 is the fixed two-sided test; Holm's graph over two claims by hand, at one look and two; Bretz et
al.'s weight update by hand; conditional power), the vectorised procedure against a plain-Python
reference written from the paper's algorithm, its error rates by simulation, and the refusals.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import optimize, stats

from stare_lab.analysis import sequential as sq
from stare_lab.analysis.sequential import (
    ClaimLook,
    DesignError,
    Graph,
    SequentialClaim,
    SequentialDesign,
    boundaries,
    decide,
    exit_probabilities,
    spending,
)

Z = NormalDist()


def design(m=1, looks=(32,), **kw) -> SequentialDesign:
    """m claims x_i − full (a shared baseline), target 1 (the claim's unit)."""
    target = kw.pop("target", 1.0)
    claims = tuple(SequentialClaim(f"c{i}", target, (f"x{i}", "full")) for i in range(m))
    return SequentialDesign(claims, looks, **kw)


def look(**zs) -> dict[str, ClaimLook]:
    return {cid: ClaimLook(z=z, se=1.0) for cid, z in zs.items()}


# -- spending functions ---------------------------------------------------------------------------------


def test_spending_functions_are_their_formulas():
    """Lan & DeMets (1983) OBF and Pocock types, Hwang-Shih-DeCani (1990), written out with the stdlib."""
    t = np.array([0.1, 0.25, 0.5, 0.8, 1.0])
    a = 0.025
    z = Z.inv_cdf(1 - a / 2)
    obf = [math.erfc(z / math.sqrt(2 * x)) for x in t]  # 2 − 2Φ(z/√t) = erfc(z/√(2t)), no cancellation
    np.testing.assert_allclose(spending(t, a, "obf"), obf, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(spending(t, a, "pocock"), a * np.log(1 + (math.e - 1) * t), rtol=1e-12)
    hsd = a * (1 - np.exp(4 * t)) / (1 - math.exp(4))
    np.testing.assert_allclose(spending(t, a, "hsd", -4.0), hsd, rtol=1e-12)
    np.testing.assert_allclose(spending(t, a, "hsd", 0.0), a * t, rtol=1e-12)
    for name, gamma in (("obf", None), ("pocock", None), ("hsd", 1.0), ("hsd", -4.0)):
        assert spending(1.0, a, name, gamma) == pytest.approx(a, rel=1e-12)
        assert spending(0.0, a, name, gamma) == 0.0
        # two-sided α: each side spends the one-sided function at α/2
        assert spending(0.5, 2 * a, name, gamma, sides=2) == pytest.approx(float(spending(0.5, a, name, gamma)))
    assert spending(0.25, a, "obf") == pytest.approx(7.3e-6, rel=0.02)  # OBF spends almost nothing early


# -- boundaries against published values ------------------------------------------------------------------


def test_obrien_fleming_type_boundaries_equal_gsdesign():
    """gsDesign (sfLDOF, one-sided α = 0.025, timing 0.5, 0.75, 1), as printed in gsDesign2's reference page
    for gs_b(): 2.962588 2.359018 2.014084."""
    np.testing.assert_allclose(boundaries([0.5, 0.75, 1.0], 0.025, "obf"), [2.962588, 2.359018, 2.014084], atol=1e-6)


def test_obrien_fleming_type_four_equal_looks():
    """Lan-DeMets OBF type, K = 4 equal looks, two-sided 0.05 (issue 47's values 4.33, 2.96, 2.36, 2.01); the
    symmetric two-sided boundaries equal the one-sided ones at 0.025 to 1e-6 (crossing both is negligible)."""
    two = boundaries([0.25, 0.5, 0.75, 1.0], 0.05, "obf", sides=2)
    np.testing.assert_allclose(np.round(two, 2), [4.33, 2.96, 2.36, 2.01])
    np.testing.assert_allclose(two, boundaries([0.25, 0.5, 0.75, 1.0], 0.025, "obf"), atol=1e-6)


def test_repeated_significance_tests_at_1_96():
    """Armitage, McPherson & Rowe (1969), Jennison & Turnbull (2000) Table 1.1: P(|Z_k| ≥ 1.96 at some of K
    equal looks) = 0.083, 0.107, 0.126, 0.142, 0.193 for K = 2, 3, 4, 5, 10; the upper side alone 0.042,
    0.063, 0.097 for K = 2, 4, 10 (gsDesign's unit tests, from K. Anderson's 2008 Deming slides)."""
    rates = {}
    for k in (2, 3, 4, 5, 10):
        up, down = exit_probabilities([1.96] * k, np.arange(1, k + 1), lower=[-1.96] * k)
        rates[k] = (up.sum(), up.sum() + down.sum())
    assert [round(rates[k][1], 3) for k in (2, 3, 4, 5, 10)] == [0.083, 0.107, 0.126, 0.142, 0.193]
    assert [round(rates[k][0], 3) for k in (2, 4, 10)] == [0.042, 0.063, 0.097]


def _constant(shape, k: int, alpha: float = 0.05) -> float:
    """The constant C of boundaries C·shape (two-sided, K equal looks) with total level alpha."""
    b = np.asarray(shape, dtype=float)

    def total(c: float) -> float:
        up, down = exit_probabilities(c * b, np.arange(1, k + 1) / k, lower=-c * b)
        return float(up.sum() + down.sum()) - alpha

    return optimize.brentq(total, 1.0, 4.0, xtol=1e-9)


def test_pocock_and_obrien_fleming_constants():
    """Jennison & Turnbull (2000) Table 2.1 C_P(4, 0.05) = 2.361 and Table 2.3 C_B(4, 0.05) = 2.024,
    C_B(5, 0.05) = 2.040 (gsDesign's unit test: O'Brien-Fleming K = 4 bounds 4.05, 2.86, 2.34, 2.02)."""
    assert round(_constant([1.0] * 4, 4), 3) == 2.361
    for k, published in ((4, 2.024), (5, 2.040)):
        assert round(_constant(np.sqrt(k / np.arange(1, k + 1)), k), 3) == published
    obf4 = _constant(np.sqrt(4 / np.arange(1, 5)), 4) * np.sqrt(4 / np.arange(1, 5))
    np.testing.assert_allclose(np.round(obf4, 2), [4.05, 2.86, 2.34, 2.02])


def _max_info_and_asn(upper, t, beta: float = 0.2) -> tuple[float, list[float]]:
    """A symmetric two-sided design's maximum information relative to the fixed test's (R) at power 1 − β,
    and its expected sample size in % of the fixed one at θ = (0, 0.5, 1, 1.5)·δ (stopping at either bound)."""
    upper, t = np.asarray(upper), np.asarray(t)
    fixed = Z.inv_cdf(0.975) + Z.inv_cdf(1 - beta)
    drift = optimize.brentq(lambda d: exit_probabilities(upper, t, d, -upper)[0].sum() - (1 - beta), 0.5, 10)
    r = (drift / fixed) ** 2
    asn = []
    for f in (0.0, 0.5, 1.0, 1.5):
        up, down = exit_probabilities(upper, t, f * drift, -upper)
        stop = up + down
        stop[-1] = 1 - stop[:-1].sum()
        asn.append(100 * r * float((stop * t).sum()))
    return r, asn


def test_maximum_information_and_expected_sample_size_of_jennison_turnbull():
    """Jennison & Turnbull (2000) Table 2.7 (Pocock, K = 4, α = 0.05, β = 0.2: R = 1.202, E(N) 117.5, 108.8,
    80.5, 52.2) and Table 7.2 (error spending ρ = 1, i.e. f(t) = α·t, K = 3: R = 1.117, E(N) 109.9, 103.4,
    81.2, 56.5), as gsDesign's unit tests check them."""
    cp = _constant([1.0] * 4, 4)
    r, asn = _max_info_and_asn([cp] * 4, np.arange(1, 5) / 4)
    assert round(r, 3) == 1.202
    assert [round(x, 1) for x in asn] == [117.5, 108.8, 80.5, 52.2]
    t3 = np.arange(1, 4) / 3
    r, asn = _max_info_and_asn(boundaries(t3, 0.05, "hsd", 0.0, sides=2), t3)
    assert round(r, 3) == 1.117
    assert [round(x, 1) for x in asn] == [109.9, 103.4, 81.2, 56.5]


# -- boundaries against Monte Carlo and scipy's multivariate normal ----------------------------------------


def _paths(t, drift: float, n: int, seed: int) -> np.ndarray:
    """n paths of the canonical process: Z_k = S_k/√t_k, S Brownian motion with drift θ·t at times t."""
    t = np.asarray(t, dtype=float)
    inc = np.random.default_rng(seed).standard_normal((n, len(t))) * np.sqrt(np.diff(t, prepend=0.0))
    return (np.cumsum(inc, axis=1) + drift * t) / np.sqrt(t)


def _first_exits(z: np.ndarray, upper) -> np.ndarray:
    """Fraction of paths whose first crossing of `upper` is at each look."""
    crossed = z >= np.asarray(upper)
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    return np.array([(first == k).mean() for k in range(z.shape[1])])


@pytest.mark.parametrize(("name", "gamma"), [("obf", None), ("pocock", None), ("hsd", -2.0), ("hsd", 1.0)])
def test_boundaries_spend_what_monte_carlo_says(name, gamma):
    """At unequal looks, each look's first-crossing rate over 400,000 canonical paths is its spending
    increment within 4 binomial SEs (α = 0.1, so that the increments are large enough to see)."""
    t = [0.2, 0.45, 0.7, 1.0]
    c = boundaries(t, 0.1, name, gamma)
    inc = np.diff(np.concatenate([[0.0], spending(t, 0.1, name, gamma)]))
    seen = _first_exits(_paths(t, 0.0, 400_000, seed=3), c)
    se = np.sqrt(inc * (1 - inc) / 400_000)
    assert np.all(np.abs(seen - inc) <= 4 * se + 1e-5), (seen, inc)


def test_boundaries_against_multivariate_normal():
    """1 − P(Z_1 < c_1, …, Z_K < c_K) = α under corr(Z_i, Z_j) = √(t_i/t_j), by Genz's algorithm (scipy)."""
    for name, t in (("pocock", [0.2, 0.5, 1.0]), ("obf", [0.3, 0.6, 0.8, 1.0]), ("hsd", [0.25, 0.5, 1.0])):
        t = np.asarray(t)
        c = boundaries(t, 0.05, name, -4.0 if name == "hsd" else None)
        cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
        p = stats.multivariate_normal.cdf(c, np.zeros(len(t)), cov, abseps=1e-8, releps=1e-8, maxpts=2_000_000,
                                          rng=np.random.default_rng(0))  # fmt: skip
        assert 1 - p == pytest.approx(0.05, abs=2e-6)


def test_exit_probabilities_under_a_drift_and_conditional_power_against_monte_carlo():
    """Power of an OBF design at drift 3 (E Z_K = 3) over 400,000 paths; the conditional power at the last
    look, given Z_k = z at look k, against 400,000 draws of the remaining increment."""
    t = [0.25, 0.5, 0.75, 1.0]
    c = boundaries(t, 0.025, "obf")
    up, _ = exit_probabilities(c, t, drift=3.0)
    seen = _first_exits(_paths(t, 3.0, 400_000, seed=5), c)
    assert np.all(np.abs(seen - up) <= 4 * np.sqrt(up * (1 - up) / 400_000) + 1e-5), (seen, up)
    rng = np.random.default_rng(9)
    for z, eta in ((0.5, 1.2), (1.8, 0.0), (-0.3, 2.0)):
        r = 1 / 0.5  # from t = 0.5 to 1
        # Z_K = (z√I_k + θΔ + √Δ·N)/√I_K with I_k = 1, I_K = r, θ = η (η = θ√I_k)
        zk = (z + eta * (r - 1) + math.sqrt(r - 1) * rng.standard_normal(400_000)) / math.sqrt(r)
        cp = float(sq.conditional_power(z, c[-1], r, eta))
        assert (zk >= c[-1]).mean() == pytest.approx(cp, abs=4 * math.sqrt(cp * (1 - cp) / 400_000) + 1e-5)
    # the exact conditional probability by integration (start at Z_2 = z) bounds the last-look one from above
    up, _ = exit_probabilities(c[2:], np.array(t[2:]) * 4, drift=0.6, start=(2.0, 1.0))
    assert up.sum() >= float(sq.conditional_power(1.0, c[-1], 2.0, 0.6 * math.sqrt(2.0)))


def test_boundaries_decrease_with_the_level():
    """What makes the graph's shortcut the closed test: a higher local level never raises a boundary."""
    t = (0.125, 0.25, 0.5, 1.0)
    levels = np.geomspace(1e-6, 0.2, 25)
    for name, gamma in (("obf", None), ("pocock", None), ("hsd", -4.0), ("hsd", 2.0)):
        table = np.array([boundaries(t, a, name, gamma) for a in levels])
        assert np.all(np.diff(table, axis=0) < 0), name


# -- hand-worked decisions ------------------------------------------------------------------------------


def test_one_look_one_claim_is_the_fixed_two_sided_test():
    """K = 1: supported iff z ≥ z(1 − α/2), contradicted iff z ≤ −z(1 − α/2); boundaries at t = 1 are z(1 − a)."""
    crit = Z.inv_cdf(0.975)
    assert boundaries([1.0], 0.025)[0] == pytest.approx(crit, abs=1e-9)
    d = design()
    for z, state in ((crit + 1e-6, "supported"), (crit - 1e-6, "undecided"), (-crit - 1e-6, "contradicted")):
        got = decide(d, [look(c0=z)])
        assert got.states() == {"c0": state}
        assert got.done and got.next_seeds is None
    assert sq.repeated_p_value(d, [1.7]) == pytest.approx(1 - Z.cdf(1.7), rel=1e-7)


def test_holm_graph_two_claims_one_look_by_hand():
    """Two claims: four hypotheses at α/4 (one-sided z 2.2414); a supported claim passes its 1/4 equally to
    the other claim's two hypotheses, which rise to 3/8·α (z 2.0803), never to its own opposite."""
    d = design(m=2)
    first, second = Z.inv_cdf(1 - 0.05 / 4), Z.inv_cdf(1 - 0.05 * 3 / 8)
    assert (round(first, 4), round(second, 4)) == (2.2414, 2.0803)
    cases = [
        ((2.30, 2.10), ("supported", "supported")),  # c0 at α/4, then c1 at 3α/8
        ((2.20, 2.30), ("supported", "supported")),  # c1 first, then c0's threshold falls to 2.0803
        ((2.30, 2.05), ("supported", "undecided")),
        ((2.30, -2.10), ("supported", "contradicted")),
        ((2.20, 2.20), ("undecided", "undecided")),
        ((-2.25, 2.0), ("contradicted", "undecided")),
    ]
    for (z0, z1), want in cases:
        got = decide(d, [look(c0=z0, c1=z1)])
        assert tuple(c.state for c in got.claims) == want, (z0, z1)
    got = decide(d, [look(c0=2.3, c1=2.05)]).claims
    assert got[0].levels == pytest.approx((0.0, 0.0125))  # its opposite keeps its weight, unused
    assert got[1].levels == pytest.approx((0.01875, 0.01875))


def test_holm_graph_two_looks_recomputes_earlier_boundaries():
    """Maurer & Bretz (2013): when c0 is supported at look 2, c1's level rises and its look-1 statistic is
    compared with the look-1 boundary at the new level: c1 is supported at look 2 on its look-1 data."""
    d = design(m=2, looks=(8, 16))
    low, high = boundaries([0.5, 1.0], 0.0125), boundaries([0.5, 1.0], 0.01875)
    z1_first = (low[0] + high[0]) / 2  # crosses at 3α/8, not at α/4
    at1 = look(c0=1.0, c1=z1_first)
    after1 = decide(d, [at1])
    assert after1.states() == {"c0": "open", "c1": "open"} and after1.next_seeds == 16
    assert after1.arms == ("x0", "full", "x1")
    at2 = look(c0=low[1] + 0.01, c1=0.5)
    got = decide(d, [at1, at2])
    assert got.states() == {"c0": "supported", "c1": "supported"}
    assert [c.look for c in got.claims] == [2, 2]
    # without c0's rejection c1 stays open: look 2 below its boundary, look 1 below the α/4 one
    assert decide(d, [at1, look(c0=0.0, c1=0.5)]).states() == {"c0": "undecided", "c1": "undecided"}


def test_a_decided_claim_drops_out_of_later_looks():
    """A claim supported at look 1 needs no statistic later; the next look extends only the open claims' arms."""
    d = design(m=2, looks=(4, 8, 16))
    c = boundaries(d.fractions, 0.0125)
    first = look(c0=c[0] + 0.1, c1=0.2)
    after = decide(d, [first])
    assert after.states() == {"c0": "supported", "c1": "open"}
    assert (after.open, after.arms, after.seeds_now, after.next_seeds) == (("c1",), ("x1", "full"), 4, 8)
    later = decide(d, [first, look(c1=0.3)])
    assert later.states()["c0"] == "supported" and later.claims[0].look == 1


def test_weight_update_of_bretz_et_al_by_hand():
    """w = (½, ½, 0), G = [[0, ½, ½], [½, 0, ½], [0, 1, 0]]; reject H1: w = (0, ¾, ¼), g_23 = (½ + ½·½)/(1 − ½·½)
    = 1, g_32 = (1 + 0)/(1 − 0) = 1 (Bretz et al. 2009, Algorithm 1)."""
    w = np.array([[0.5, 0.5, 0.0]])
    g = np.array([[[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]])
    sq._pass_weight(w, g, np.array([0]), np.array([0]))
    np.testing.assert_allclose(w, [[0.0, 0.75, 0.25]])
    np.testing.assert_allclose(g, [[[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])
    holm = Graph.holm(3)
    assert holm.weights == pytest.approx((1 / 6,) * 6)
    assert holm.transitions[0] == pytest.approx((0, 0, 0.25, 0.25, 0.25, 0.25))


def test_futility_by_conditional_power_at_the_last_look():
    """Looks 16, 32; under the current estimate the conditional power of z = 0.3 is Φ(2·0.3 − c_2√2) < 0.2
    (futile: the arms get no more seeds), of z = 1.5 it is Φ(3 − c_2√2) > 0.2 (open); under the target (1,
    SE 0.25: η = 4) z = 0.3 keeps a high conditional power and stays open."""
    c2 = boundaries([0.5, 1.0], 0.025)[1]
    d = design(looks=(16, 32), futility=0.2, futility_under="estimate")
    cp_low = Z.cdf(0.3 + 0.3 - c2 * math.sqrt(2))
    got = decide(d, [{"c0": ClaimLook(0.3, 0.25)}]).claims[0]
    assert got.state == "futile" and got.look == 1
    assert got.conditional_power[0] == pytest.approx(cp_low, abs=1e-12) and cp_low < 0.2
    assert decide(d, [{"c0": ClaimLook(1.5, 0.25)}]).claims[0].state == "open"
    under_target = design(looks=(16, 32), futility=0.2)
    got = decide(under_target, [{"c0": ClaimLook(0.3, 0.25)}]).claims[0]
    assert got.state == "open"
    assert got.conditional_power[0] == pytest.approx(Z.cdf(0.3 + 4.0 - c2 * math.sqrt(2)), abs=1e-12)
    futile = decide(d, [{"c0": ClaimLook(0.3, 0.25)}])
    assert futile.done and futile.open == () and futile.arms == ()


def test_futility_waits_for_its_first_look():
    """futility_from 2, looks 4, 8, 16: z = 0.3 at look 1 (conditional power under the estimate far below
    0.2) leaves the claim open with no power computed; the same z at look 2 makes it futile there."""
    d = design(looks=(4, 8, 16), futility=0.2, futility_under="estimate", futility_from=2)
    at1 = decide(d, [{"c0": ClaimLook(0.3, 1.0)}]).claims[0]
    assert at1.state == "open" and at1.look is None and all(math.isnan(p) for p in at1.conditional_power)
    at2 = decide(d, [{"c0": ClaimLook(0.3, 1.0)}, {"c0": ClaimLook(0.3, 0.7)}]).claims[0]
    assert at2.state == "futile" and at2.look == 2
    c3 = boundaries([0.25, 0.5, 1.0], 0.025)[2]
    assert at2.conditional_power[0] == pytest.approx(Z.cdf((0.3 * 2 - c3 * math.sqrt(2)) / 1.0), abs=1e-12)
    eager = decide(design(looks=(4, 8, 16), futility=0.2, futility_under="estimate"), [{"c0": ClaimLook(0.3, 1.0)}])
    assert eager.claims[0].state == "futile" and eager.claims[0].look == 1


def test_a_futile_claim_is_supported_when_its_level_rises():
    """Non-binding: c1, found futile at look 1 (its target 0.001 is out of reach: conditional power about ½
    < 0.6), keeps its weight; when c0 (target 1, SE 0.25: conditional power about 1) is supported at look 2,
    the larger level's look-1 boundary is compared with c1's look-1 statistic again."""
    claims = (SequentialClaim("c0", 1.0, ("x0", "full")), SequentialClaim("c1", 0.001, ("x1", "full")))
    d = SequentialDesign(claims, (16, 32), futility=0.6)
    low, high = boundaries([0.5, 1.0], 0.0125), boundaries([0.5, 1.0], 0.01875)
    at1 = {"c0": ClaimLook(2.0, 0.25), "c1": ClaimLook((low[0] + high[0]) / 2, 1.0)}
    after1 = decide(d, [at1])
    assert after1.states() == {"c0": "open", "c1": "futile"} and after1.arms == ("x0", "full")
    assert 0.3 < after1.claims[1].conditional_power[0] < 0.6
    got = decide(d, [at1, {"c0": ClaimLook(low[1] + 0.01, 0.25)}])
    assert got.states() == {"c0": "supported", "c1": "supported"}
    assert [c.look for c in got.claims] == [2, 2]


# -- the vectorised procedure against a plain-Python one --------------------------------------------------


def _reference(d: SequentialDesign, z: np.ndarray, se: np.ndarray) -> list[tuple[str, int]]:
    """The procedure written out for one sweep, one hypothesis at a time (module docstring, Bretz et al.
    2009, Maurer & Bretz 2013): (state, 0-based look or −1) per claim."""
    m, per, n_k = len(d.claims), d.per_claim, len(d.looks)
    hyps = [(c, s) for c in range(m) for s in ((1, -1) if per == 2 else (1,))]
    w = list(d._graph.weights)
    g = [list(row) for row in d._graph.transitions]
    state, at, last = ["open"] * m, [-1] * m, [-1] * m
    for k in range(z.shape[1]):
        for c in range(m):
            if state[c] == "open":
                last[c] = k
        changed = True
        while changed:
            changed = False
            for j, (c, s) in enumerate(hyps):
                if state[c] in ("supported", "contradicted") or w[j] <= 0:
                    continue
                b = d.bounds(float(np.round(d.alpha * w[j], 14)))
                if any(s * z[c, i] >= b[i] for i in range(min(k, last[c]) + 1)):
                    state[c], at[c] = ("supported" if s > 0 else "contradicted"), k
                    wj, row, col = w[j], g[j][:], [g[i][j] for i in range(len(hyps))]
                    for i in range(len(hyps)):
                        w[i] += wj * row[i]
                        for h in range(len(hyps)):
                            den = 1 - col[i] * row[i]
                            g[i][h] = 0.0 if i == h or den <= 1e-15 else (g[i][h] + col[i] * row[h]) / den
                    w[j] = 0.0
                    for i in range(len(hyps)):
                        g[j][i] = g[i][j] = 0.0
                    changed = True
                    break
        if d.futility_from - 1 <= k < n_k - 1 and d.futility > 0:
            r = d.looks[-1] / d.looks[k]
            for c in range(m):
                if state[c] != "open":
                    continue
                cps = []
                for j, (cc, s) in enumerate(hyps):
                    if cc != c:
                        continue
                    eta = d.claims[c].target / se[c, k] if d.futility_under == "target" else s * z[c, k]
                    c_last = d.bounds(float(np.round(d.alpha * w[j], 14)))[-1]
                    x = (s * z[c, k] + eta * (r - 1) - c_last * math.sqrt(r)) / math.sqrt(r - 1)
                    cps.append(Z.cdf(x) if w[j] > 0 else 0.0)
                if max(cps) < d.futility:
                    state[c], at[c] = "futile", k
    if z.shape[1] == n_k:
        state = ["undecided" if s == "open" else s for s in state]
    return list(zip(state, at, strict=True))


@pytest.mark.parametrize(
    ("under", "directions", "futility", "effect", "since"),
    [("estimate", "both", 0.3, 1.5, 1), ("target", "both", 0.3, 1.5, 1), ("estimate", "support", 0.1, 2.5, 1),
     ("target", "both", 0.02, 2.5, 1), ("estimate", "both", 0.3, 1.5, 2)],
)  # fmt: skip
def test_vectorised_procedure_equals_the_plain_python_one(under, directions, futility, effect, since):
    """300 simulated sweeps of 3 claims with a shared arm, t statistics at 4, 8, 16 seeds: the same verdicts
    at the same looks; decide() on a sweep's looks agrees."""
    claims = tuple(SequentialClaim(f"c{i}", 1.5, (f"x{i}", "full")) for i in range(3))
    d = SequentialDesign(
        claims, (4, 8, 16), futility=futility, futility_under=under, directions=directions, futility_from=since
    )
    # one claim null, one at +effect, one at −effect (+effect where only support is tested)
    means = {"full": 0.0, "x0": 0.0, "x1": effect, "x2": effect if directions == "support" else -effect}
    sim = sq.simulate(d, means, sweeps=300, seed=11, sd=2.0, statistic="t")
    decided = np.isin(sim.state, (sq.SUPPORTED, sq.CONTRADICTED))
    assert decided.sum() >= 100 and (decided.sum(axis=1) >= 2).sum() >= 10  # weights are passed
    for i in range(300):
        want = _reference(d, sim.z[i], sim.se[i])
        assert [(sq.STATES[s], int(k)) for s, k in zip(sim.state[i], sim.look[i], strict=True)] == want
    for i in range(20):
        looks = [{c.id: ClaimLook(sim.z[i, j, k], sim.se[i, j, k]) for j, c in enumerate(claims)} for k in range(3)]
        got = decide(d, looks)
        assert [(c.state, (c.look or 0) - 1) for c in got.claims] == _reference(d, sim.z[i], sim.se[i])


# -- error rates and cost by simulation ---------------------------------------------------------------------


@pytest.mark.parametrize("statistic", ["z", "t"])
def test_no_effect_any_false_verdict_at_most_alpha(statistic):
    """4 claims against a shared baseline, no effect, OBF at 4, 8, 16, 32 seeds: the rate of any verdict over
    4,000 sweeps is at most α + 3 SE (the docs' benchmark runs 10,000 per row)."""
    claims = tuple(SequentialClaim(f"c{i}", 2.5, (f"x{i}", "full")) for i in range(4))
    d = SequentialDesign(claims, (4, 8, 16, 32), futility=0.1)
    sim = sq.simulate(d, dict.fromkeys(["full", "x0", "x1", "x2", "x3"], 0.0), sweeps=4000, seed=2, sd=3.0,
                      statistic=statistic)  # fmt: skip
    fwer = float(np.isin(sim.state, (sq.SUPPORTED, sq.CONTRADICTED)).any(axis=1).mean())
    assert fwer <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)
    assert fwer > 0.02  # not vacuous: the procedure does spend its α


def test_power_and_expected_runs_of_one_claim_equal_integration():
    """One claim, no futility, looks 8, 16, 32: P(supported) is the upper first-exit probability with the
    one-sided boundaries at α/2 on both sides, and the expected runs 2·(8·P(stop at 1) + 16·P(stop at 2) +
    32·P(no stop before 3)), both within 3 Monte Carlo SEs of 20,000 simulated sweeps."""
    d = design(looks=(8, 16, 32), target=1.0)
    c = boundaries(d.fractions, 0.025)
    drift = 0.8 / math.sqrt(2 / 32)  # effect 0.8, sd 1 per arm: SE at 32 seeds √(2/32)
    up, down = exit_probabilities(c, d.fractions, drift, lower=-c)
    sim = sq.simulate(d, {"x0": 0.8, "full": 0.0}, sweeps=20_000, seed=4)
    p = float(up.sum())
    assert sim.rate(0, "supported") == pytest.approx(p, abs=3 * math.sqrt(p * (1 - p) / 20_000))
    stop = up + down
    want = 2 * (8 * stop[0] + 16 * stop[1] + 32 * (1 - stop[0] - stop[1]))
    got = sq.expected_runs(d, {"x0": 0.8, "full": 0.0}, sweeps=20_000, seed=4)
    assert got.fixed == 64
    assert got.sequential == pytest.approx(want, abs=3 * got.se)
    assert got.ratio == pytest.approx(got.sequential / 64)


def test_runs_count_only_the_arms_an_open_claim_reads():
    """A huge effect decides every claim at the first look: runs = 4 seeds × 3 arms; the baseline keeps
    running for a claim left open."""
    claims = (SequentialClaim("a", 1.0, ("x", "full")), SequentialClaim("b", 1.0, ("y", "full")))
    d = SequentialDesign(claims, (4, 8, 16))
    sim = sq.simulate(d, {"full": 0.0, "x": 50.0, "y": 50.0}, sweeps=50, seed=0, sd=1.0)
    assert np.all(sim.runs == 12) and np.all(sim.look == 0)
    sim = sq.simulate(d, {"full": 0.0, "x": 50.0, "y": 0.0}, sweeps=200, seed=0, sd=1.0)
    open_b = sim.state[:, 1] == sq.UNDECIDED
    assert open_b.any() and np.all(sim.runs[open_b] == 4 + 16 + 16)


# -- a look's statistic ------------------------------------------------------------------------------------


def test_claim_look_orientation_and_t_to_z():
    """An inferiority claim D < −2 (direction −1, bound −2) with D̂ = −3, SE 0.5 points towards the claim:
    z = +2; at 5 df the t of 2 becomes the normal quantile of its tail probability."""
    inferiority = ClaimLook.from_estimate(-3.0, 0.5, bound=-2.0, direction=sq.direction_of("inferiority"))
    assert (inferiority.z, inferiority.effect) == (pytest.approx(2.0), pytest.approx(1.0))
    t5 = ClaimLook.from_estimate(1.0, 0.5, df=5)
    assert t5.z == pytest.approx(stats.norm.ppf(stats.t.cdf(2.0, 5)), rel=1e-10)
    assert t5.z < 2.0
    assert ClaimLook.from_p_value(0.025, 1.0).z == pytest.approx(Z.inv_cdf(0.975), rel=1e-12)
    assert sq.direction_of("gain_below") == -1 and sq.direction_of("retained_gain") == 1
    with pytest.raises(DesignError, match="not equivalence"):
        sq.direction_of("equivalence")


def test_repeated_p_value_is_where_the_test_starts_to_cross():
    """p ≤ a exactly when some look's z reaches its boundary at level a."""
    d = design(looks=(4, 8, 16, 32), spending="pocock")
    zs = [1.9, 2.6, 2.1]
    p = sq.repeated_p_value(d, zs)
    for a in (p * 0.999, p * 1.001):
        crossed = any(z >= b for z, b in zip(zs, boundaries(d.fractions, a, "pocock")[:3], strict=False))
        assert crossed == (a >= p)
    assert sq.repeated_p_value(d, [-3.0]) == 1.0


def test_looks_from_a_schedule():
    assert sq.looks_from_schedule(32, (1 / 8, 1 / 4, 1 / 2, 1)) == (4, 8, 16, 32)
    with pytest.raises(DesignError, match="must increase"):
        sq.looks_from_schedule(4, (0.4, 0.5, 1.0))
    with pytest.raises(DesignError, match="must end at 1"):
        sq.looks_from_schedule(32, (0.5, 0.9))


# -- refusals ----------------------------------------------------------------------------------------------

CLAIM = (SequentialClaim("c", 1.0, ("x", "full")),)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"looks": (4, 4, 8)}, r"looks \(4, 4, 8\): seeds per arm must increase strictly"),
        ({"looks": (8, 4)}, "must increase strictly"),
        ({"looks": ()}, "expected seeds per arm at each look"),
        ({"looks": (4.0, 8.0)}, "whole numbers"),
        ({"looks": (1, 4)}, "at least 2 seeds"),
        ({"alpha": 1.5}, r"alpha 1.5: expected a value in \(0, 1\)"),
        ({"alpha": 0}, "alpha 0: expected"),
        ({"spending": "lan-demets"}, "spending 'lan-demets': expected one of obf, pocock, hsd"),
        ({"spending": "hsd"}, "needs a finite gamma"),
        ({"gamma": -4.0}, "only spending 'hsd' takes a gamma"),
        ({"futility": 1.0}, r"futility 1.0: expected a conditional-power threshold in \[0, 1\)"),
        ({"futility_under": "trend"}, "futility_under 'trend'"),
        ({"futility_from": 2}, r"futility_from 2: expected the first look \(1-based\) of a futility stop, 1 … K − 1"),
        ({"futility_from": 0}, "futility_from 0: expected"),
        ({"directions": "contradict"}, "directions 'contradict'"),
        ({"claims": ()}, "at least one claim"),
        ({"claims": CLAIM * 2}, "id 'c' appears more than once"),
        ({"claims": (SequentialClaim("c", 0.0),)}, "target 0.0 must be an effect > 0"),
        ({"claims": (SequentialClaim("c", 1.0, ("x",), (1.0, -1.0)),)}, "2 coefficients for 1 arms"),
        ({"graph": Graph((0.5,), ((0.0,),))}, "expected 2 weights"),
        ({"graph": Graph((0.7, 0.7), ((0.0, 1.0), (1.0, 0.0)))}, "sum to at most 1"),
        ({"graph": Graph((0.5, 0.5), ((0.5, 0.5), (1.0, 0.0)))}, "diagonal must be 0"),
    ],
)
def test_impossible_designs_are_refused_in_one_line(kwargs, message):
    args = {"claims": CLAIM, "looks": (4, 8), **kwargs}
    with pytest.raises(DesignError, match=message) as err:
        SequentialDesign(**args)
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError)


def test_looks_that_do_not_fit_the_design_are_refused():
    d = design(m=2, looks=(4, 8))
    with pytest.raises(DesignError, match="look 1: claim 'c1' is open and has no statistic"):
        decide(d, [look(c0=0.1)])
    with pytest.raises(DesignError, match="claim 'zz' is not in the design"):
        decide(d, [look(c0=0.1, c1=0.2, zz=1.0)])
    with pytest.raises(DesignError, match="3 looks given; the design has 2"):
        decide(d, [look(c0=0.1, c1=0.2)] * 3)
    with pytest.raises(DesignError, match="se -1.0"):
        ClaimLook.from_estimate(1.0, -1.0)
    with pytest.raises(DesignError, match="sides 3: expected 1"):
        boundaries([0.5, 1.0], 0.05, sides=3)
    with pytest.raises(DesignError, match="statistic 't' estimates the variance"):
        sq.simulate(d, dict.fromkeys(["x0", "x1", "full"], 0.0), sweeps=2, problem_sd=1.0, statistic="t")
