"""Rules that score tokens by predictive or attention entropy (top_entropy, low_entropy, anchor, explorer,
attn_soft, rsi_band) and their random control, against the loop references in ref_rules_entropy.py.
The invariants every rule shares are in test_rule_invariants.py."""

from __future__ import annotations

import itertools
import math

import pytest
import rule_batches
import torch
from ref_rules_entropy import (
    exact_k,
    ref_attn_soft,
    ref_position_counts,
    ref_rsi_band,
    ref_select,
    ref_unit_counts,
    units,
)

from stare_lab.methods import RuleState, get_method
from stare_lab.stats import TokenStats

SHAPES = [(B, T, seed) for B, T, seed in itertools.product((4, 8), (1, 5, 9), (0, 1, 2))]
SCOPES = ("batch", "group", "sequence")
# what each reference comparison needs to know: (rule, score field, keeps the largest?)
BY_SCORE = pytest.mark.parametrize(
    "rule, field, largest",
    [
        ("top_entropy", "entropy", True),
        ("low_entropy", "entropy", False),
        ("anchor", "attn_entropy", False),
        ("explorer", "attn_entropy", True),
    ],
)
RHOS = (0.2, 0.3, 0.5, 1.0)


def make_stats(B: int, T: int, seed: int, tied: bool = False) -> TokenStats:
    """The shared factory's batch (tests/support/rule_batches.py: groups of G contiguous rows, row 1 fully
    masked, an all-equal-reward group), with the three scores these rules read quantised to three
    values per score when `tied` (many ties at thresholds), huge values on padding (a rule that
    reads them fails), and H = 0 at (0, 0) (the RSI guard)."""
    stats = rule_batches.make_stats(seed, B, T)
    valid = stats.valid
    for name, pad in (("entropy", 1e3), ("attn_entropy", 1e3), ("logp", -1e3)):
        x = getattr(stats, name)
        if tied:
            lo, hi = x[valid].min(), x[valid].max()
            x = lo + torch.floor((x - lo) / (hi - lo + 1e-6) * 3).clamp(0, 2) * (hi - lo) / 3
        setattr(stats, name, torch.where(valid, x, torch.full_like(x, pad)))
    stats.entropy[0, 0] = 0.0
    return stats


def lists(stats: TokenStats, name: str):
    return getattr(stats, name).tolist()


def check_weights(out, stats):
    w = out.weights
    assert w.shape == stats.shape and w.dtype == torch.float32
    assert torch.isfinite(w).all()
    assert (w[~stats.valid] == 0).all()


def run(name, stats, step=0, total_steps=10, **params):
    return get_method(name, **params)(stats, RuleState(step=step, total_steps=total_steps, seed=7))


# ---------------------------------------------------------------- hand-worked cases


def one_row(**fields) -> TokenStats:
    n = len(fields["logp"])
    return TokenStats(
        mask=torch.ones(1, n),
        advantages=torch.ones(1),
        group=torch.zeros(1, dtype=torch.long),
        **{k: torch.tensor([v]) for k, v in fields.items()},
    )


def test_hand_worked_entropy_selection():
    # H = [0.1, 0.9, 0.5, 0.7, 0.3], ρ = 0.4: ⌈0.4·5⌉ = 2 tokens.
    # top_entropy keeps 0.9 and 0.7 (tokens 1, 3); low_entropy keeps 0.1 and 0.3 (tokens 0, 4).
    # ties="quantile": the 0.6 quantile of H sits at rank 0.6·4 = 2.4 → 0.5 + 0.4·(0.7-0.5) = 0.58,
    # so H ≥ 0.58 keeps the same two tokens.
    stats = one_row(logp=[-1.0] * 5, entropy=[0.1, 0.9, 0.5, 0.7, 0.3])
    for ties in ("topk", "quantile"):
        assert run("top_entropy", stats, rho=0.4, ties=ties).weights.tolist() == [[0, 1, 0, 1, 0]]
        assert run("low_entropy", stats, rho=0.4, ties=ties).weights.tolist() == [[1, 0, 0, 0, 1]]


def test_hand_worked_rsi():
    # s = [0.1, 0.25, 1.0, 3.0], H = [1.0, 0.5, 0.5, 1.0] → RSI = [0.1, 0.5, 2.0, 3.0]; band [0.5, 2.0]:
    # token 0 is dropped low, tokens 1 and 2 kept (both bounds inclusive), token 3 dropped high.
    stats = one_row(logp=[-0.1, -0.25, -1.0, -3.0], entropy=[1.0, 0.5, 0.5, 1.0])
    out = run("rsi_band", stats)
    assert out.weights.tolist() == [[0, 1, 1, 0]]
    assert out.metrics == pytest.approx({"rule/kept_frac": 0.5, "rule/low_frac": 0.25, "rule/high_frac": 0.25})
    # H = 0 → RSI = 0: dropped by the default band, kept by a band that starts at 0.
    zero_H = one_row(logp=[-0.5], entropy=[0.0])
    assert run("rsi_band", zero_H).weights.tolist() == [[0]]
    assert run("rsi_band", zero_H, low=0.0, high="inf").weights.tolist() == [[1]]


def test_hand_worked_attn_soft():
    # AE = [0.2, 0.5, 0.9] → u = [0, 0.5, 1]; λ = 0: w = 1 - 0.5(2u-1) = [1.5, 1, 0.5]; λ = 1: reversed.
    stats = one_row(logp=[-1.0] * 3, attn_entropy=[0.2, 0.5, 0.9])
    assert run("attn_soft", stats, step=0, total_steps=5).weights.tolist() == [[1.5, 1.0, 0.5]]
    assert run("attn_soft", stats, step=4, total_steps=5).weights.tolist() == [[0.5, 1.0, 1.5]]
    assert run("attn_soft", stats, step=2, total_steps=5).weights.tolist() == [[1.0, 1.0, 1.0]]


# ---------------------------------------------------------------- selection rules vs the loop reference


@BY_SCORE
@pytest.mark.parametrize("ties", ("topk", "quantile"))
def test_selection_matches_reference(rule, field, largest, ties):
    for (B, T, seed), scope in itertools.product(SHAPES, SCOPES):
        stats = make_stats(B, T, seed)
        rho = RHOS[seed % len(RHOS)]
        out = run(rule, stats, rho=rho, scope=scope, ties=ties)
        check_weights(out, stats)
        expect = ref_select(
            lists(stats, field), lists(stats, "valid"), lists(stats, "group"), rho, scope, ties, largest
        )
        assert out.weights.bool().tolist() == expect, (B, T, seed, scope)
        assert torch.equal(out.selected, out.weights.bool()) and out.normalize == "selected"


@BY_SCORE
def test_selection_with_ties(rule, field, largest):
    """Tied scores: quantile equals the reference; topk keeps exactly ⌈ρ·n⌉ and never keeps a worse token."""
    for (B, T, seed), scope in itertools.product(SHAPES, SCOPES):
        stats = make_stats(B, T, seed, tied=True)
        score, valid, group = lists(stats, field), lists(stats, "valid"), lists(stats, "group")
        rho = RHOS[seed % len(RHOS)]
        q = run(rule, stats, rho=rho, scope=scope, ties="quantile")
        assert q.weights.bool().tolist() == ref_select(score, valid, group, rho, scope, "quantile", largest)
        out = run(rule, stats, rho=rho, scope=scope, ties="topk")
        check_weights(out, stats)
        sel = out.weights.bool().tolist()
        for members in units(valid, group, scope).values():
            sign = 1 if largest else -1
            kept = [sign * score[b][t] for b, t in members if sel[b][t]]
            dropped = [sign * score[b][t] for b, t in members if not sel[b][t]]
            assert len(kept) == exact_k(rho, len(members))
            assert not dropped or min(kept) >= max(dropped)
        # a seeded tie-break: same state, same subset
        assert torch.equal(out.weights, run(rule, stats, rho=rho, scope=scope, ties="topk").weights)


def test_random_matched_to_a_reference_keeps_the_invariants():
    # default parameters are covered by test_rule_invariants.py; this one reads the reference's statistics
    from rule_invariants import check_all

    check_all(get_method("random", match="position", reference="anchor", reference_params={"layers": 1}))
    check_all(get_method("random", match="position", reference="rsi_band"))


# ---------------------------------------------------------------- random


@pytest.mark.parametrize("scope", SCOPES)
def test_random_counts_and_reproducibility(scope):
    for B, T, seed in SHAPES:
        stats = make_stats(B, T, seed)
        rho = RHOS[seed % len(RHOS)]
        valid, group = lists(stats, "valid"), lists(stats, "group")
        out = run("random", stats, rho=rho, scope=scope)
        check_weights(out, stats)
        counts = ref_unit_counts(out.weights.bool().tolist(), valid, group, scope)
        assert counts == {u: exact_k(rho, len(m)) for u, m in units(valid, group, scope).items()}
        assert torch.equal(out.weights, run("random", stats, rho=rho, scope=scope).weights)


def test_random_is_uniform_and_changes_with_step():
    stats = make_stats(4, 5, 3)
    valid = stats.valid
    draws = torch.stack([run("random", stats, step=s, total_steps=400).weights for s in range(400)])
    freq = draws.mean(0)[valid]
    expect = exact_k(0.2, int(valid.sum())) / int(valid.sum())
    assert (freq - expect).abs().max() < 0.1  # binomial sd ≈ 0.02 at 400 draws
    assert not torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(
    "reference, ref_params",
    [
        ("anchor", {}),
        ("explorer", {"scope": "sequence"}),
        ("top_entropy", {"rho": 0.5, "scope": "group"}),
        ("low_entropy", {"ties": "quantile"}),
        ("rsi_band", {"low": 0.3, "high": 1.5}),
        ("attn_soft", {}),
    ],
)
def test_random_matches_reference_positions(scope, reference, ref_params):
    for B, T, seed in SHAPES:
        stats = make_stats(B, T, seed, tied=seed == 2)
        valid, group = lists(stats, "valid"), lists(stats, "group")
        out = run("random", stats, scope=scope, match="position", reference=reference, reference_params=ref_params)
        check_weights(out, stats)
        ref = run(reference, stats, **ref_params)
        ref_sel = (ref.selected if ref.selected is not None else stats.valid).tolist()
        got = ref_position_counts(out.weights.bool().tolist(), valid, group, scope)
        assert got == ref_position_counts(ref_sel, valid, group, scope), (B, T, seed)


def test_random_position_is_uniform_within_a_position():
    """Each valid token at position t is drawn with probability c(t) / n(t), whatever its row."""
    stats = make_stats(8, 5, 4)
    valid = stats.valid
    need = run("anchor", stats).weights.sum(0)  # [T] reference count per position
    n = valid.float().sum(0)  # [T] valid tokens per position
    draws = torch.stack([run("random", stats, step=s, total_steps=300, match="position").weights for s in range(300)])
    expect = (need / n.clamp(min=1))[None, :].expand_as(valid)
    assert (draws.mean(0) - expect)[valid].abs().max() < 0.12  # binomial sd ≤ 0.03 at 300 draws


def test_random_position_is_not_the_reference_itself():
    stats = make_stats(8, 9, 0)
    outs = [run("random", stats, step=s, match="position", reference="anchor", scope="batch") for s in range(5)]
    anchor = run("anchor", stats)
    assert any(not torch.equal(o.weights, anchor.weights) for o in outs)


# ---------------------------------------------------------------- attn_soft and rsi_band


@pytest.mark.parametrize("scope", SCOPES)
def test_attn_soft_matches_reference(scope):
    for (B, T, seed), step in itertools.product(SHAPES, (0, 3, 9)):
        stats = make_stats(B, T, seed, tied=seed == 2)
        out = run("attn_soft", stats, step=step, total_steps=10, scope=scope)
        check_weights(out, stats)
        expect = ref_attn_soft(
            lists(stats, "attn_entropy"), lists(stats, "valid"), lists(stats, "group"), scope, 0.5, step / 9
        )
        assert torch.allclose(out.weights.double(), torch.tensor(expect, dtype=torch.float64), atol=1e-5, rtol=0)
        assert float(out.weights[stats.valid].mean()) == pytest.approx(1.0, abs=1e-5)
        assert out.normalize == "valid"


def test_attn_soft_anchors_first_then_explorers():
    stats = make_stats(8, 9, 1)
    ae, valid = stats.attn_entropy, stats.valid
    anchors = valid & (ae <= ae[valid].median())
    explorers = valid & ~anchors
    start, end = (run("attn_soft", stats, step=s, total_steps=10).weights for s in (0, 9))
    assert start[anchors].mean() > 1 > start[explorers].mean()
    assert end[anchors].mean() < 1 < end[explorers].mean()
    lowest = ae.masked_fill(~valid, 9.0) == ae[valid].min()
    assert float(start[lowest].max()) == pytest.approx(1.5) and float(end[lowest].max()) == pytest.approx(0.5)


def test_rsi_band_matches_reference():
    for (B, T, seed), (low, high) in itertools.product(SHAPES, [(0.5, 2.0), (0.0, 0.5), (1.0, math.inf), (0.7, 0.7)]):
        stats = make_stats(B, T, seed)
        out = run("rsi_band", stats, low=low, high=high)
        check_weights(out, stats)
        keep, kf, lf, hf = ref_rsi_band(lists(stats, "logp"), lists(stats, "entropy"), lists(stats, "valid"), low, high)
        assert out.weights.bool().tolist() == keep
        assert [out.metrics[k] for k in ("rule/kept_frac", "rule/low_frac", "rule/high_frac")] == pytest.approx(
            [kf, lf, hf]
        )


# ---------------------------------------------------------------- params, needs, configs


@pytest.mark.parametrize(
    "name, params, words",
    [
        ("top_entropy", {"rho": 1.5}, ["rho", "≤ 1"]),
        ("low_entropy", {"rho": 0.0}, ["rho"]),
        ("anchor", {"rho": -0.1}, ["rho"]),
        ("explorer", {"rho": 1.5}, ["rho"]),
        ("random", {"rho": 1.5}, ["rho"]),
        ("top_entropy", {"tau": 1}, ["tau"]),
        ("random", {"foo": 1}, ["foo"]),
        ("rsi_band", {"low": 3.0, "high": 1.0}, ["low", "high"]),
        ("rsi_band", {"high": "lots"}, ["high"]),
        ("anchor", {"scope": "diagonal"}, ["scope"]),
        ("explorer", {"ties": "coin"}, ["ties"]),
        ("top_entropy", {"normalize": "sum"}, ["normalize"]),
        ("anchor", {"layers": [1.5]}, ["layers"]),
        ("attn_soft", {"layers": []}, ["layers"]),
        ("attn_soft", {"kappa": 2.0}, ["kappa"]),
        ("random", {"match": "length"}, ["match"]),
        ("random", {"match": "position", "reference": "nope"}, ["nope"]),
        ("random", {"match": "position", "reference": "anchor", "reference_params": {"rho": 2.0}}, ["rho"]),
    ],
)
def test_bad_params_name_the_parameter(name, params, words):
    with pytest.raises(ValueError) as e:
        get_method(name, **params)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_defaults_needs_and_layers():
    assert get_method("rsi_band", high="inf").params.high == math.inf
    assert get_method("top_entropy").needs == {"entropy"} == get_method("low_entropy").needs
    assert get_method("rsi_band").needs == {"logp", "entropy"}
    for name in ("anchor", "explorer", "attn_soft"):
        assert get_method(name).needs == {"attn_entropy"} and get_method(name).attn_layers is None
    assert get_method("anchor", layers=[2, -1]).attn_layers == (2, -1)
    assert get_method("attn_soft", layers=1).attn_layers == (1,)
    assert get_method("random").needs == frozenset() and get_method("random").attn_layers is None
    matched = get_method("random", match="position", reference="anchor", reference_params={"layers": 3})
    assert matched.needs == {"attn_entropy"} and matched.attn_layers == (3,)
    for name in ("top_entropy", "low_entropy", "anchor", "explorer", "random"):
        p = get_method(name).params
        assert (p.rho, p.normalize) == (0.2, "selected")
    assert (get_method("attn_soft").params.kappa, get_method("attn_soft").params.normalize) == (0.5, "valid")


def test_missing_statistic_is_a_clear_error():
    stats = make_stats(4, 5, 0)
    stats.attn_entropy = None
    with pytest.raises(ValueError, match="attn_entropy"):
        run("anchor", stats)
