"""STARE (arXiv 2606.19236) against the loop reference in ref_rules_advantage.py: selection, gate,
adaptive W/M, the closed gate's selected set and the official controller's non-finite-H̄ behaviour."""

from __future__ import annotations

import math

import pytest
import ref_rules_advantage as ref
import torch
from rule_batches import SEEDS, SHAPES, assert_basic, assert_close, assert_matches, assert_topk_counts, make_stats

from stare_lab.methods import RuleState, get_method
from stare_lab.stats import TokenStats

# ----------------------------------------------------------------------------------------- STARE


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize(
    "variant,ties,scope",
    [("O1", "topk", "batch"), ("C2", "topk", "group"), ("C2", "quantile", "batch"), ("O1", "quantile", "sequence")],
)
def test_stare_matches_reference(B, T, variant, ties, scope):
    for seed in SEEDS:
        stats = make_stats(seed, B, T, entropy_scale=0.15)  # H̄ < 0.3: gate open
        rule = get_method("stare", variant=variant, ties=ties, scope=scope, P=0.3)
        out = rule(stats, RuleState(step=seed))
        expected, info = ref.stare_ref(stats, rule.params, {})
        assert_basic(out, stats)
        assert info["gate"] == out.metrics["rule/gate"] == 1.0
        assert assert_matches(out.weights, expected) == []  # continuous surprisal: no ties
        if ties == "topk":
            A = stats.token_advantages
            assert_topk_counts(out.weights == 1.1, stats, stats.valid & (A > 0), 0.3, scope)
            if variant == "C2":
                assert_topk_counts(out.weights == 0.9, stats, stats.valid & (A < 0), 0.3, scope)


def test_stare_hand_case():
    # Row 0 (A=+1) surprisals 0.1, 2.0, 0.5; row 1 (A=-1) surprisals 3.0, 0.2, 1.0; H = 0.1 < 0.3.
    # |T+| = 3, ⌈0.1·3⌉ = 1: L+ = {(0,1)} (s = 2.0) gets W = 1.1; C2 also L- = {(1,0)} (s = 3.0) gets 0.9.
    stats = TokenStats(
        logp=-torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.2, 1.0]]),
        mask=torch.ones(2, 3),
        advantages=torch.tensor([1.0, -1.0]),
        group=torch.tensor([0, 0]),
        entropy=torch.full((2, 3), 0.1),
    )
    o1 = get_method("stare")(stats, RuleState())
    assert_close(o1.weights, [[1, 1.1, 1], [1, 1, 1]])
    c2 = get_method("stare", variant="C2")(stats, RuleState())
    assert_close(c2.weights, [[1, 1.1, 1], [0.9, 1, 1]])
    assert o1.metrics["rule/boosted_frac"] == pytest.approx(1 / 6)


@pytest.mark.parametrize("B,T", SHAPES)
def test_stare_gate_closed_equals_full(B, T):
    for seed in SEEDS:
        stats = make_stats(seed, B, T, entropy_scale=3.0)
        if not bool(stats.valid.any()):
            continue
        assert float(stats.entropy[stats.valid].mean()) >= 0.3
        for variant in ("O1", "C2"):
            out = get_method("stare", variant=variant, P=1.0)(stats, RuleState())
            full = get_method("full")(stats, RuleState())
            assert out.metrics["rule/gate"] == 0.0
            assert torch.equal(out.weights, full.weights)


def test_stare_gate_threshold_is_strict():
    stats = TokenStats(
        logp=-torch.rand(2, 3),
        mask=torch.ones(2, 3),
        advantages=torch.tensor([1.0, -1.0]),
        group=torch.tensor([0, 0]),
        entropy=torch.full((2, 3), 0.25),
    )
    assert get_method("stare", H_tgt=0.25)(stats, RuleState()).metrics["rule/gate"] == 0.0
    assert get_method("stare", H_tgt=0.2501)(stats, RuleState()).metrics["rule/gate"] == 1.0


def test_stare_adaptive_memory_and_round_trip():
    params = dict(variant="C2", adaptive=True, P=0.5)
    low = [make_stats(s, 8, 5, entropy_scale=0.1) for s in range(3)]  # H̄ < H_tgt: W up, M down
    high = make_stats(7, 8, 5, entropy_scale=3.0)  # H̄ > H_tgt: W down, M up
    rule = get_method("stare", **params)
    state, mem = RuleState(seed=3), {}
    for k, stats in enumerate(low):
        state.step = k
        out = rule(stats, state)
        _, info = ref.stare_ref(stats, rule.params, mem)
        # the update happens before this batch's weights are computed (official ordering)
        assert out.metrics["rule/W"] == pytest.approx(1.1 + 0.01 * (k + 1)) == pytest.approx(info["W"])
        assert out.metrics["rule/M"] == pytest.approx(0.9 - 0.01 * (k + 1))
        assert out.weights.max().item() == pytest.approx(1.1 + 0.01 * (k + 1))
    assert state.memory == pytest.approx({"W": 1.13, "M": 0.87, "gate": True})
    restored = RuleState.from_dict(state.to_dict())
    a, b = rule(high, state), rule(high, restored)
    assert torch.equal(a.weights, b.weights) and a.metrics == b.metrics
    assert state.memory == restored.memory == pytest.approx({"W": 1.12, "M": 0.88, "gate": False})
    assert a.metrics["rule/gate"] == 0.0 and (a.weights[high.valid] == 1).all()


def test_stare_adaptive_clips_at_bounds():
    rule = get_method("stare", adaptive=True, alpha=0.3, W_max=1.5, M_min=0.5, variant="C2")
    state = RuleState()
    for _ in range(4):
        rule(make_stats(0, 4, 5, entropy_scale=0.1), state)
    assert state.memory == pytest.approx({"W": 1.5, "M": 0.5, "gate": True})
    for _ in range(4):
        rule(make_stats(0, 4, 5, entropy_scale=3.0), state)
    assert state.memory == pytest.approx({"W": 1.0, "M": 1.0, "gate": False})
    static = RuleState()
    get_method("stare")(make_stats(0, 4, 5, entropy_scale=0.1), static)
    assert static.memory == {"gate": True}  # a static rule remembers only its gate (note 7)


def test_stare_closed_gate_selects_every_valid_token():
    """Closed gate: all weights 1 and `selected` = every valid token, not the unused L+ subset."""
    stats = make_stats(0, 8, 9, entropy_scale=3.0)
    out = get_method("stare", variant="C2")(stats, RuleState())
    assert out.metrics["rule/gate"] == 0.0 and torch.equal(out.weights, stats.mask)
    selected = out.selected if out.selected is not None else stats.valid
    assert torch.equal(selected & stats.valid, stats.valid)
    opened = get_method("stare", variant="C2", H_tgt=10.0)(stats, RuleState())
    assert opened.metrics["rule/gate"] == 1.0 and opened.selected.sum() < stats.valid.sum()


@pytest.mark.parametrize("first_scale, gate", [(0.1, 1.0), (3.0, 0.0)])
def test_stare_non_finite_entropy_keeps_the_previous_gate(first_scale, gate):
    """As STAREController.update: a NaN (or empty-batch) H̄ skips the update and keeps the gate."""
    rule = get_method("stare", adaptive=True)
    state = RuleState()
    first = rule(make_stats(0, 8, 5, entropy_scale=first_scale), state)
    assert first.metrics["rule/gate"] == gate
    W, M = state.memory["W"], state.memory["M"]
    broken = make_stats(1, 8, 5, entropy_scale=0.1)
    broken.entropy[0, 0] = float("nan")  # a valid token: H̄ is NaN
    out = rule(broken, state)
    assert math.isnan(out.metrics["rule/entropy_mean"])
    assert out.metrics["rule/gate"] == gate  # kept, not closed
    assert (state.memory["W"], state.memory["M"]) == (W, M)  # no adaptive step either
    expected, info = ref.stare_ref(broken, rule.params, {"W": W, "M": M, "gate": bool(gate)})
    assert info["gate"] == gate and assert_matches(out.weights, expected) == []
    assert torch.isfinite(out.weights).all()
    empty = make_stats(2, 8, 5)
    empty.mask = torch.zeros_like(empty.mask)
    assert rule(empty, state).metrics["rule/gate"] == gate  # no valid token: H̄ undefined, gate kept
