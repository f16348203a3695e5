"""Rules that read the advantage with the sampled token's probability, a gradient or a group signal
(gmts, opefo, stapo, ict; stare has test_rules_stare.py) against the loop references in
ref_rules_advantage.py, plus hand-worked cases. The invariants every rule shares are in
test_rule_invariants.py."""

from __future__ import annotations

import math

import pytest
import ref_rules_advantage as ref
import torch
from rule_batches import (
    SEEDS,
    SHAPES,
    TRAINER,
    assert_basic,
    assert_close,
    assert_matches,
    assert_topk_counts,
    make_stats,
)
from rule_invariants import check_all

from stare_lab.methods import RuleState, TrainerValues, get_method
from stare_lab.stats import TokenStats

# ------------------------------------------------------------------------------------------- ICT


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("ties,scope", [("topk", "batch"), ("quantile", "batch"), ("topk", "group")])
def test_ict_matches_reference(B, T, ties, scope):
    for seed in SEEDS:
        stats = make_stats(seed, B, T)
        rule = get_method("ict", ties=ties, scope=scope, warmup_steps=2)
        for step in (0, 1, 2, 5):
            out = rule(stats, RuleState(step=step))
            assert_basic(out, stats)
            assert out.metrics["rule/warmup"] == float(step < 2)
            assert assert_matches(out.weights, ref.ict_ref(stats, rule.params, step)) == []
            if step < 2:
                assert torch.equal(out.weights, stats.mask)  # dense warm-up
            elif ties == "topk":
                assert_topk_counts(out.weights > 0, stats, stats.valid, 0.1, scope)


def test_ict_hand_case():
    # 10 valid tokens, ρ = 0.1: after warm-up only the largest JS (0.6 at (1,2)) is kept.
    js = torch.tensor([[0.1, 0.5, 0.2, 0.3, 0.0], [0.05, 0.4, 0.6, 0.25, 0.15]])
    stats = TokenStats(
        logp=torch.zeros(2, 5),
        mask=torch.ones(2, 5),
        advantages=torch.tensor([1.0, -1.0]),
        group=torch.tensor([0, 0]),
        js=js,
    )
    rule = get_method("ict")
    assert (rule(stats, RuleState(step=9)).weights == 1).all()
    out = rule(stats, RuleState(step=10))
    assert out.weights.nonzero().tolist() == [[1, 2]] and out.normalize == "selected"


# ------------------------------------------------------------------------------------------ GMTS


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(ties="quantile"),
        dict(beta=0.05, mode="zero_advantage"),
        dict(scope="batch", eps_low=0.2, eps_high=0.28),
        dict(count="floor"),
        dict(score="sequence_mean", scope="batch"),
        dict(count="floor", score="sequence_mean", rho=0.3),
    ],
)
def test_gmts_matches_reference(B, T, kw):
    for seed in SEEDS:
        stats = make_stats(seed, B, T)
        trainer = TrainerValues(**{**vars(TRAINER), "beta": kw.get("beta", 0.0)})  # a KL rule needs a KL trainer
        rule = get_method("gmts", **kw)
        out = rule(stats, RuleState(step=seed, trainer=trainer))
        p = rule.effective_params(trainer)
        expected, counts = ref.gmts_ref(stats, p)
        assert_basic(out, stats)
        assert out.normalize == ("valid" if kw.get("mode") == "zero_advantage" else "selected")
        undecided = assert_matches(out.weights, expected)
        # ties only among δ = 0 tokens (A = 0 or clipped, no KL term) at a top-k boundary
        d = ref.lists(stats)
        assert all(ref.gmts_delta(d, p, b, t) == 0 for b, t in undecided)
        assert not undecided or (p.ties == "topk" and p.beta == 0)
        if p.ties == "topk":
            assert_topk_counts(out.weights > 0, stats, stats.valid, p.rho, p.scope, p.count)


def test_gmts_on_policy_is_entropy_times_advantage():
    # Without old_logp (r = 1) and no KL, δ = |H·A|. Row 0 A=+2, row 1 A=-1 (one group, 10 tokens):
    # δ row 0 = 2·H = [0.2, 1.0, 0.4, 0.6, 0.8]; row 1 = H = [3.0, 0.1, 0.1, 0.1, 0.1].
    # ρ = 0.2 keeps ⌈2⌉ = 2 tokens: (1,0) with 3.0 and (0,1) with 1.0 — not the largest-H tokens alone.
    H = torch.tensor([[0.1, 0.5, 0.2, 0.3, 0.4], [3.0, 0.1, 0.1, 0.1, 0.1]])
    stats = TokenStats(
        logp=torch.zeros(2, 5),
        mask=torch.ones(2, 5),
        advantages=torch.tensor([2.0, -1.0]),
        group=torch.tensor([0, 0]),
        entropy=H,
    )
    out = get_method("gmts")(stats, RuleState(trainer=TRAINER))
    assert out.weights.nonzero().tolist() == [[0, 1], [1, 0]]


def test_gmts_official_grpo_zero_count_and_score():
    """GRPO-Zero keeps ⌊ρn⌋ per group and, under loss type grpo, scores ω/(G·|o_i|).

    One group, G = 2: row 0 has 2 valid tokens with δ = |H·A| = [1.0, 0.9], row 1 has 8 with δ = 1.5
    at token 0 and 0.1 elsewhere. n = 10, ρ = 0.25: ⌈2.5⌉ = 3 vs ⌊2.5⌋ = 2 tokens.
    score "token": the largest δ are 1.5 (1,0), 1.0 (0,0), 0.9 (0,1).
    score "sequence_mean": δ/(2·2) = [0.25, 0.225] in row 0, 1.5/(2·8) = 0.094 in row 1: row 0 first.
    """
    H = torch.tensor([[1.0, 0.9, 0, 0, 0, 0, 0, 0], [1.5] + [0.1] * 7])
    mask = torch.tensor([[1.0, 1.0] + [0.0] * 6, [1.0] * 8])
    stats = TokenStats(
        logp=torch.zeros(2, 8), mask=mask, advantages=torch.tensor([1.0, -1.0]), group=torch.tensor([0, 0]), entropy=H
    )

    def kept(**kw):
        return get_method("gmts", rho=0.25, **kw)(stats, RuleState(trainer=TRAINER)).weights.nonzero().tolist()

    assert kept() == [[0, 0], [0, 1], [1, 0]]
    assert kept(count="floor") == [[0, 0], [1, 0]]
    assert kept(score="sequence_mean") == [[0, 0], [0, 1], [1, 0]]
    assert kept(count="floor", score="sequence_mean") == [[0, 0], [0, 1]]
    with pytest.raises(ValueError, match="count"):
        get_method("gmts", count="floor", ties="quantile")


def test_gmts_clip_indicator():
    # A > 0 with r = e^0.5 > 1.2: clipped, δ = 0, never selected although its H is the largest.
    stats = TokenStats(
        logp=torch.tensor([[0.0, 0.0]]) - 1,
        old_logp=torch.tensor([[-1.5, -1.0]]),
        mask=torch.ones(1, 2),
        advantages=torch.tensor([1.0]),
        group=torch.tensor([0]),
        entropy=torch.tensor([[5.0, 0.1]]),
    )
    out = get_method("gmts", rho=0.5)(stats, RuleState(trainer=TRAINER))  # ε_high = 0.28 from the trainer
    assert out.weights.tolist() == [[0.0, 1.0]] and out.metrics["rule/clipped_frac"] == 0.5


# ----------------------------------------------------------------------------------------- OPEFO


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize(
    "flow,scope", [("simple", "batch"), ("full", "batch"), ("simple", "group"), ("full", "sequence")]
)
def test_opefo_matches_reference(B, T, flow, scope):
    for seed in SEEDS:
        stats = make_stats(seed, B, T)
        rule = get_method("opefo", flow=flow, scope=scope)
        out = rule(stats, RuleState())
        expected, info = ref.opefo_ref(stats, rule.params)
        assert_basic(out, stats)
        assert assert_matches(out.weights, expected, atol=1e-5) == []
        assert out.metrics["rule/flow_pos"] == pytest.approx(info["flow_pos"], rel=1e-5, abs=1e-9)
        assert out.metrics["rule/flow_neg"] == pytest.approx(info["flow_neg"], rel=1e-5, abs=1e-9)
        # Invariant: the weighted first-order entropy flow is zero in every scope unit.
        assert info["net"] == pytest.approx(0.0, abs=1e-9)
        assert out.metrics["rule/net_flow_after"] == pytest.approx(0.0, abs=1e-6)
        if scope == "batch" and info["lambda"]:
            assert out.metrics["rule/lambda"] == pytest.approx(info["lambda"][0], abs=1e-6)


def test_opefo_hand_case():
    # Simple flow ΔH = -A·π·(log π + H). Row 0 (A=+1): a: log π=-1, H=1.5 → ΔH = -0.5/e  = -0.18394
    #                                                  b: log π=-2, H=1.0 → ΔH = +1/e²   = +0.13534
    #                                     Row 1 (A=-1): c: log π=-1, H=0.5 → ΔH = -0.5/e  = -0.18394
    #                                                  d: log π=-2, H=3.0 → ΔH = +1/e²   = +0.13534
    # F+ = 2/e² = 0.27067, F- = 1/e = 0.36788, λ = (F- - F+)/(F- + F+) = 0.15223:
    # b, d get 1.15223; a, c get 0.84777; 1.15223·0.27067 = 0.84777·0.36788 = 0.31188.
    stats = TokenStats(
        logp=torch.tensor([[-1.0, -2.0], [-1.0, -2.0]]),
        mask=torch.ones(2, 2),
        advantages=torch.tensor([1.0, -1.0]),
        group=torch.tensor([0, 0]),
        entropy=torch.tensor([[1.5, 1.0], [0.5, 3.0]]),
    )
    out = get_method("opefo")(stats, RuleState())
    lam = (math.exp(-1) - 2 * math.exp(-2)) / (math.exp(-1) + 2 * math.exp(-2))
    assert lam == pytest.approx(0.15223, abs=1e-5)
    assert out.metrics["rule/lambda"] == pytest.approx(lam, abs=1e-6)
    assert_close(out.weights, [[1 - lam, 1 + lam], [1 - lam, 1 + lam]])


def test_opefo_one_sided_flow_zeroes_that_side_and_all_zero_advantage_is_full():
    # Only ΔH > 0 tokens: λ = -1, they get weight 0 (net flow 0). A = 0 everywhere: ΔH = 0, λ = 0, weights 1.
    stats = TokenStats(
        logp=torch.tensor([[-2.0, -3.0]]),
        mask=torch.ones(1, 2),
        advantages=torch.tensor([1.0]),
        group=torch.tensor([0]),
        entropy=torch.tensor([[1.0, 1.0]]),
    )
    out = get_method("opefo")(stats, RuleState())
    assert out.weights.tolist() == [[0.0, 0.0]] and out.metrics["rule/lambda"] == -1.0
    zero = TokenStats(
        logp=torch.tensor([[-2.0, -3.0]]),
        mask=torch.ones(1, 2),
        advantages=torch.tensor([0.0]),
        group=torch.tensor([0]),
        entropy=torch.tensor([[1.0, 1.0]]),
    )
    assert get_method("opefo")(zero, RuleState()).weights.tolist() == [[1.0, 1.0]]


def test_opefo_full_flow_needs_p2():
    assert get_method("opefo", flow="full").needs == {"logp", "entropy", "p2", "p2logp"}
    assert get_method("opefo").needs == {"logp", "entropy"}
    stats = make_stats(0, 4, 5)
    bare = TokenStats(
        logp=stats.logp, mask=stats.mask, advantages=stats.advantages, group=stats.group, entropy=stats.entropy
    )
    with pytest.raises(ValueError, match="p2"):
        get_method("opefo", flow="full")(bare, RuleState())


# ----------------------------------------------------------------------------------------- STAPO


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("kw", [dict(), dict(tau_p=0.3), dict(tau_p=0.5, tau_h_quantile=0.8)])
def test_stapo_matches_reference(B, T, kw):
    for seed in SEEDS:
        stats = make_stats(seed, B, T)
        rule = get_method("stapo", **kw)
        out = rule(stats, RuleState())
        expected, dropped = ref.stapo_ref(stats, rule.params)
        assert_basic(out, stats)
        assert assert_matches(out.weights, expected) == []
        n = int(stats.valid.sum())
        assert out.metrics["rule/masked_frac"] == pytest.approx(dropped / n if n else 0.0)


def test_stapo_hand_case():
    # H = [0.1, 0.2, 0.3, 0.4, 0.5] → q_0.2 = 0.18. π = [0.001, 0.001, 0.001, 0.5, 0.001], A = +1:
    # token 0 (π < 0.002, H = 0.1 < 0.18) is dropped; token 1 has H = 0.2 ≥ q; token 3 is probable.
    stats = TokenStats(
        logp=torch.log(torch.tensor([[0.001, 0.001, 0.001, 0.5, 0.001]])),
        mask=torch.ones(1, 5),
        advantages=torch.tensor([1.0]),
        group=torch.tensor([0]),
        entropy=torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]]),
    )
    out = get_method("stapo")(stats, RuleState())
    assert out.weights.tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0]]
    assert out.metrics["rule/entropy_quantile"] == pytest.approx(0.18)
    neg = TokenStats(
        logp=stats.logp, mask=stats.mask, advantages=torch.tensor([-1.0]), group=stats.group, entropy=stats.entropy
    )
    assert (get_method("stapo")(neg, RuleState()).weights == 1).all()


# ------------------------------------------------------------------------------------ all five


@pytest.mark.parametrize(
    "name,kw",
    [
        ("stare", dict(variant="C2")),
        ("stare", dict(adaptive=True, H_tgt=5.0)),
        ("ict", dict(warmup_steps=0)),
        ("gmts", dict(mode="zero_advantage")),
        ("gmts", dict(count="floor", score="sequence_mean")),
        ("opefo", dict(flow="full")),
        ("stapo", dict(tau_p=0.3)),
    ],
)
def test_invariants_of_non_default_parameters(name, kw):
    """Defaults are covered by test_rule_invariants.py; these variants read other statistics or paths."""
    check_all(get_method(name, **kw))


@pytest.mark.parametrize(
    "name,kw,param",
    [
        ("stare", dict(P=1.5), "P"),
        ("stare", dict(P=0.0), "P"),
        ("stare", dict(variant="O3"), "variant"),
        ("stare", dict(W=0.9), "W"),
        ("stare", dict(M=1.2), "M"),
        ("stare", dict(scope="rank"), "scope"),
        ("stare", dict(adaptive=True, W=2.0), "W_max"),
        ("stare", dict(bogus=1), "bogus"),
        ("ict", dict(rho=1.5), "rho"),
        ("ict", dict(warmup_steps=-1), "warmup_steps"),
        ("ict", dict(ties="x"), "ties"),
        ("gmts", dict(rho=0.0), "rho"),
        ("gmts", dict(mode="zero"), "mode"),
        ("gmts", dict(eps_low=1.0), "eps_low"),
        ("gmts", dict(mode="renorm", normalize="valid"), "normalize"),
        ("gmts", dict(beta=-1.0), "beta"),
        ("opefo", dict(flow="exact"), "flow"),
        ("opefo", dict(normalize="sum"), "normalize"),
        ("stapo", dict(tau_p=0.0), "tau_p"),
        ("stapo", dict(tau_h_quantile=1.5), "tau_h_quantile"),
    ],
)
def test_bad_params_name_the_parameter(name, kw, param):
    with pytest.raises(ValueError, match=param):
        get_method(name, **kw)


def test_declared_needs():
    assert get_method("stare").needs == {"logp", "entropy"}
    assert get_method("ict").needs == {"js"}
    assert get_method("gmts").needs == {"logp", "entropy", "old_logp"}
    assert get_method("gmts", beta=0.1).needs == {"logp", "entropy", "old_logp", "ref_logp"}
    assert get_method("stapo").needs == {"logp", "entropy"}
    assert get_method("gmts", mode="zero_advantage").params.normalize == "valid"
