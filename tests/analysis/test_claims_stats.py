"""The claims' statistics where the truth is known (stare_lab.analysis.hypotheses, verdicts.decide on
in-memory frames, as a sweep's records give them; tests/support/claims_fixtures.py simulates them).

A true claim is supported at the rate the power module predicts, a false one contradicted at that rate,
a no-effect superiority claim supported in at most α of 1,000 sweeps; the seed-unit tests (Welch on a
training metric, Brown-Forsythe on the spread) hold their level; Fieller's interval agrees with the
retained-gain test; pass@k against brute-force enumeration; Holm over a file's claims.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from claims_fixtures import simulate_problems, simulate_training

from stare_lab.analysis.compare import holm
from stare_lab.analysis.hypotheses import combine, pass_at_k, score_tables, seed_outcome, verdicts
from stare_lab.analysis.power import power_at, welch_power
from stare_lab.analysis.verdicts import decide
from stare_lab.plan.claims import parse_claims

ALPHA = 0.05


def fail(key, msg):
    raise ValueError(f"{key}: {msg}")


def claim(form="superiority", a="x", b="full", quantity=None, **extra):
    item = {"id": f"c_{form}", "source": "own", "form": form, "a": a, "b": b}
    item["quantity"] = quantity or {"score": "avg@32", "benchmarks": ["arithmetic"]}
    return parse_claims([{**item, **extra}], fail)[0]


def binomial_ok(hits: int, sims: int, rate: float, slack: float = 0.03) -> bool:
    """Within 3 binomial SEs of `rate` (plus `slack` for the power projection's own error)."""
    se = math.sqrt(max(rate * (1 - rate), 1e-4) / sims)
    return abs(hits / sims - rate) <= 3 * se + slack


def test_pass_at_k_equals_brute_force_enumeration():
    """Over every k-subset of n samples with c correct: the fraction of subsets holding a correct one."""
    for n, c, k in [(5, 2, 2), (6, 0, 3), (6, 6, 1), (7, 3, 4), (8, 5, 6), (4, 1, 4)]:
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(i < c for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(np.array([n]), np.array([c]), k)[0] == pytest.approx(brute, abs=1e-12)
    n, c = np.full(33, 32), np.arange(33)
    expected = [1 - math.comb(32 - ci, 4) / math.comb(32, 4) for ci in c]
    np.testing.assert_allclose(pass_at_k(n, c, 4), expected, atol=1e-12)


def _power_and_verdicts(effect: float, form: str, sims: int, seeds: int = 4, problems: int = 60):
    """Verdicts of one claim `x <form> full` over `sims` sweeps with x's true effect, and the power the
    power module predicts at the true effect and the design's variance components (each sweep's estimates
    pooled over the sweeps), one-sided at α."""
    rng = np.random.default_rng(7)
    c = claim(form)
    verdict, parts = [], []
    for _ in range(sims):
        frame = simulate_problems({"full": 10.0, "x": 10.0 + effect}, rng, seeds=seeds, problems=problems)
        verdict.append(decide([c], frame, None)["verdict"].iloc[0])
        comb = combine(score_tables(frame, c), {"x": 1.0, "full": -1.0})
        parts.append((comb["var_problem"], comb["var_seed_arm"] + comb["var_seed_base"], comb["df_problem"]))
    var_problem, var_seed, df_problem = np.mean(parts, axis=0)
    predicted = float(power_at(abs(effect), 1e4 * var_problem, 1e4 * var_seed, seeds, df_problem, 1 - 2 * ALPHA))
    return np.array(verdict), predicted


def test_a_true_claim_is_supported_at_the_rate_the_power_module_predicts():
    verdict, predicted = _power_and_verdicts(4.0, "superiority", sims=300)
    hits = int((verdict == "supported").sum())
    assert 0.3 < predicted < 0.95, predicted  # a design where the rate says something
    assert binomial_ok(hits, 300, predicted), (hits / 300, predicted)
    assert (verdict == "contradicted").sum() == 0


def test_a_false_claim_is_contradicted_at_the_rate_the_power_module_predicts():
    verdict, predicted = _power_and_verdicts(-4.0, "superiority", sims=300)
    hits = int((verdict == "contradicted").sum())
    assert binomial_ok(hits, 300, predicted), (hits / 300, predicted)
    assert (verdict == "supported").sum() <= 300 * ALPHA  # the claim's own test at its level, far from its bound


def test_a_no_effect_superiority_claim_is_supported_in_at_most_alpha_of_1000_sweeps():
    rng = np.random.default_rng(11)
    c = claim("superiority")
    supported = 0
    for _ in range(1000):
        frame = simulate_problems({"full": 10.0, "x": 10.0}, rng, seeds=3, problems=40)
        supported += decide([c], frame, None)["verdict"].iloc[0] == "supported"
    # α = 5% of 1,000 is 50; 3 binomial SEs (6.9 each) above it is the most chance allows
    assert supported <= 50 + 3 * math.sqrt(1000 * ALPHA * (1 - ALPHA)), supported


def test_welch_over_seeds_holds_its_level_and_reaches_its_projected_power():
    rng = np.random.default_rng(3)
    c = claim("superiority", quantity={"metric": "entropy", "at": "last"})
    null = sum(
        seed_outcome(c, _metric(rng, 0.0)).p_support < ALPHA for _ in range(1000)
    )  # one claim: Holm's level is α
    assert null <= 50 + 3 * math.sqrt(1000 * ALPHA * (1 - ALPHA)), null
    hits = sum(seed_outcome(c, _metric(rng, 0.1)).p_support < ALPHA for _ in range(400))
    predicted = float(welch_power(0.1, [0.1**2, 0.1**2], 5, ALPHA))
    assert binomial_ok(hits, 400, predicted, slack=0.01), (hits / 400, predicted)


def _metric(rng, effect: float, seeds: int = 5) -> dict[str, np.ndarray]:
    return {"x": rng.normal(1.0 + effect, 0.1, seeds), "full": rng.normal(1.0, 0.1, seeds)}


def test_brown_forsythe_holds_its_level_and_sees_a_spread_five_times_larger():
    rng = np.random.default_rng(5)
    c = claim("superiority", a="explorer", b="anchor", quantity={"spread": "avg@32"})

    def rejections(explorer_sd: float, sweeps: int) -> int:  # sweeps of 6 seeds whose spread test rejects
        return sum(
            seed_outcome(
                c, {"explorer": rng.normal(0.5, explorer_sd, 6), "anchor": rng.normal(0.5, 0.02, 6)}, spread=True
            ).p_support
            < ALPHA
            for _ in range(sweeps)
        )

    same = rejections(0.02, 1000)
    assert same <= 50 + 3 * math.sqrt(1000 * ALPHA * (1 - ALPHA)), same
    wide = rejections(0.10, 200)
    assert wide / 200 > 0.6, wide


def test_retained_gain_at_its_bound_holds_the_level_and_agrees_with_fieller():
    """True ratio exactly f = 0.5 (random gains 5 of full's 10 points): supported in ≤ α of the sweeps; and in
    every sweep the verdict is supported exactly where Fieller's lower bound is above f."""
    rng = np.random.default_rng(13)
    c = claim("retained_gain", a="random", base="base", fraction=0.5)
    supported, agree = 0, 0
    for _ in range(200):
        frame = simulate_problems({"base": 0.0, "full": 10.0, "random": 5.0}, rng, seeds=4, problems=60)
        row = decide([c], frame, None).iloc[0]
        supported += row["verdict"] == "supported"
        agree += (row["verdict"] == "supported") == (row["lo"] > 0.5)
    assert supported <= 200 * ALPHA + 3 * math.sqrt(200 * ALPHA * (1 - ALPHA)), supported
    assert agree == 200


def test_equivalence_is_tost_and_non_inferiority_one_sided():
    rng = np.random.default_rng(17)
    frame = simulate_problems({"full": 10.0, "x": 10.0}, rng, seeds=5, problems=200, seed_sd=0.005)
    eq = claim("equivalence", margin="5 points")
    ni = claim("non_inferiority", margin="5 points")
    out = decide([eq, ni], frame, None)
    assert list(out["verdict"]) == ["supported", "supported"]
    # TOST's p is the larger of the two one-sided p's: with a margin at the estimate it is ≥ 0.5
    tight = claim("equivalence", margin=f"{abs(out['estimate'].iloc[0]):.6f} points")
    assert decide([tight], frame, None)["p_support"].iloc[0] >= 0.49


def test_holm_over_the_files_claims_and_verdicts_read_from_the_adjusted_p():
    c1, c2 = claim("superiority"), claim("inferiority")
    from stare_lab.analysis.hypotheses import Outcome

    outs = [
        Outcome(1.0, 0.5, 1.5, 0.0, 0.03, 0.97, 1.0, "", "", ""),
        Outcome(-1.0, -1.5, -0.5, 0.0, 0.02, 0.98, 1.0, "", "", ""),
    ]
    frame = verdicts([c1, c2], outs)
    np.testing.assert_allclose(frame["p_support_holm"], holm([0.03, 0.02]))
    assert list(frame["p_support_holm"]) == [0.04, 0.04]
    assert list(frame["verdict"]) == ["supported", "supported"]
    outs[0] = Outcome(1.0, 0.5, 1.5, 0.0, 0.03, 0.97, 1.0, "", "", "")
    outs.append(Outcome(0.0, -1.0, 1.0, 0.0, 0.5, 0.5, 1.0, "", "", ""))
    frame = verdicts([c1, c2, claim("non_inferiority", margin="1 points")], outs)
    # three claims: 0.02·3 = 0.06 ≥ α, so Holm stops at the first step and none is supported
    assert list(frame["verdict"]) == ["undecided", "undecided", "undecided"]
    np.testing.assert_allclose(frame["p_support_holm"], [0.06, 0.06, 0.5])


def test_training_metric_values_at_the_last_step_and_over_windows():
    rng = np.random.default_rng(0)
    training = simulate_training({"x": (0.5, 0.0), "full": (0.3, 0.0)}, rng, seeds=3)
    from stare_lab.analysis.verdicts import metric_values

    last = metric_values(training, claim(quantity={"metric": "entropy", "at": "last"}).quantity, ("x", "full"))
    np.testing.assert_allclose(last["x"], [0.5] * 3)
    # steps 10..50, drift 0.5·(50 − step)/50: the window 40-50 adds (0.1 + 0)/2
    window = metric_values(training, claim(quantity={"metric": "entropy", "steps": [40, 50]}).quantity, ("x",))
    np.testing.assert_allclose(window["x"], [0.55] * 3)
    tail = metric_values(training, claim(quantity={"metric": "entropy", "last_steps": 25}).quantity, ("full",))
    np.testing.assert_allclose(tail["full"], [0.3 + 0.1] * 3)  # steps 30, 40, 50: drifts .2, .1, 0


def test_a_claim_without_data_is_no_data_and_out_of_the_family():
    rng = np.random.default_rng(1)
    frame = simulate_problems({"full": 10.0, "x": 30.0}, rng, seeds=3)
    out = decide([claim("superiority"), claim("superiority", a="missing")], frame, None)
    assert list(out["verdict"]) == ["supported", "no data"]
    assert out["p_support_holm"].iloc[0] == out["p_support"].iloc[0]  # a family of one
    assert "missing" in out["note"].iloc[1]


def test_pass_at_k_claims_read_per_problem_pass_at_k():
    frame = pd.DataFrame(
        {"arm": ["base"] * 4 + ["full"] * 4, "seed": [0, 0, 1, 1] * 2, "benchmark": "arithmetic",
         "problem": ["a", "b"] * 4, "correct": [1, 0, 1, 0, 4, 0, 4, 0], "n": 4}
    )  # fmt: skip
    c = claim("superiority", a="base", b="full", quantity={"score": "pass@2", "benchmarks": ["arithmetic"]})
    arms = score_tables(frame, c)
    np.testing.assert_allclose(arms["base"][1][0], [[0.5, 0.0], [0.5, 0.0]])  # 1 − C(3,2)/C(4,2)
    np.testing.assert_allclose(arms["full"][1][0], [[1.0, 0.0], [1.0, 0.0]])
