"""Rules that read the advantage with the sampled token's probability, a gradient or a group signal
(stare, gmts, opefo, stapo, ict) against the loop references in ref_rules_advantage.py, plus
hand-worked cases. The invariants every rule shares are in test_rule_invariants.py."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from stare_lab.methods import RuleState, TrainerValues, get_method
from stare_lab.methods.select import scope_ids
from stare_lab.stats import TokenStats
import ref_rules_advantage as ref
from rule_invariants import check_all

G = 4
TRAINER = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=G)
SHAPES = [(B, T) for B in (4, 8) for T in (1, 5, 9)]
SEEDS = (0, 1, 2)


def make_stats(seed: int, B: int, T: int, *, entropy_scale: float | None = None, V: int = 6,
               pad_value: float | None = None) -> TokenStats:
    """Random batch drawn from real categorical distributions: groups of G contiguous rows, row 1
    fully masked, group 1 (B = 8) with all-equal rewards (A = 0), random lengths, finite garbage
    (or pad_value) on padding."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.exp(torch.randn(B, T, 1, generator=g))
    probs = torch.softmax(torch.randn(B, T, V, generator=g) * 2 * temp, -1).double()
    a = torch.multinomial(probs.reshape(-1, V), 1, generator=g).reshape(B, T, 1)
    logp = torch.log(probs.gather(-1, a).squeeze(-1))
    entropy = -(probs * probs.log()).sum(-1)
    if entropy_scale is not None:
        entropy = entropy * entropy_scale
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    group = torch.arange(B) // G
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[0], rewards[2] = 1.0, 0.0        # group 0 mixed (row 1 of it fully masked)
    rewards[G:2 * G] = 1.0                    # group 1 (when B = 8) all equal: A = 0
    mean = torch.stack([rewards[group == k].mean() for k in group])
    std = torch.stack([rewards[group == k].std() for k in group])
    adv = (rewards - mean) / (std + 1e-4)
    fields = dict(logp=logp, entropy=entropy, js=torch.rand(B, T, generator=g).double() * math.log(2),
                  old_logp=logp + 0.3 * torch.randn(B, T, generator=g), ref_logp=logp + 0.3 * torch.randn(B, T, generator=g),
                  p2=(probs ** 2).sum(-1), p2logp=(probs ** 2 * probs.log()).sum(-1))
    fields = {k: v.float() for k, v in fields.items()}
    if pad_value is not None:
        fields = {k: torch.where(mask > 0, v, torch.full_like(v, pad_value)) for k, v in fields.items()}
    return TokenStats(mask=mask, advantages=adv.float(), group=group, **fields)


def assert_matches(weights: torch.Tensor, expected: list[list], atol: float = 1e-6) -> list[tuple[int, int]]:
    """Compare where the reference is decided; return the undecided (None) tokens."""
    undecided = []
    for b, row in enumerate(expected):
        for t, e in enumerate(row):
            if e is None:
                undecided.append((b, t))
                continue
            assert weights[b, t].item() == pytest.approx(e, abs=atol), (b, t, weights[b, t].item(), e)
    return undecided


def assert_close(weights: torch.Tensor, expected: list[list]) -> None:
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


def assert_basic(out, stats: TokenStats) -> None:
    assert out.weights.shape == stats.shape and out.weights.dtype == torch.float32
    assert torch.isfinite(out.weights).all()
    assert (out.weights[~stats.valid] == 0).all()


def assert_topk_counts(selected: torch.Tensor, stats: TokenStats, candidates: torch.Tensor, rho: float, scope: str):
    ids = scope_ids(stats.valid, stats.group, scope)
    for u in ids[candidates].unique().tolist():
        unit = candidates & (ids == u)
        n = int(unit.sum())
        assert int((selected & unit).sum()) == min(n, math.ceil(Fraction(str(rho)) * n))


# ----------------------------------------------------------------------------------------- STARE

@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("variant,ties,scope", [("O1", "topk", "batch"), ("C2", "topk", "group"),
                                                 ("C2", "quantile", "batch"), ("O1", "quantile", "sequence")])
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
    stats = TokenStats(logp=-torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.2, 1.0]]), mask=torch.ones(2, 3),
                       advantages=torch.tensor([1.0, -1.0]), group=torch.tensor([0, 0]),
                       entropy=torch.full((2, 3), 0.1))
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
    stats = TokenStats(logp=-torch.rand(2, 3), mask=torch.ones(2, 3), advantages=torch.tensor([1.0, -1.0]),
                       group=torch.tensor([0, 0]), entropy=torch.full((2, 3), 0.25))
    assert get_method("stare", H_tgt=0.25)(stats, RuleState()).metrics["rule/gate"] == 0.0
    assert get_method("stare", H_tgt=0.2501)(stats, RuleState()).metrics["rule/gate"] == 1.0


def test_stare_adaptive_memory_and_round_trip():
    params = dict(variant="C2", adaptive=True, P=0.5)
    low = [make_stats(s, 8, 5, entropy_scale=0.1) for s in range(3)]   # H̄ < H_tgt: W up, M down
    high = make_stats(7, 8, 5, entropy_scale=3.0)                        # H̄ > H_tgt: W down, M up
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
    broken.entropy[0, 0] = float("nan")                       # a valid token: H̄ is NaN
    out = rule(broken, state)
    assert math.isnan(out.metrics["rule/entropy_mean"])
    assert out.metrics["rule/gate"] == gate                     # kept, not closed
    assert (state.memory["W"], state.memory["M"]) == (W, M)     # no adaptive step either
    expected, info = ref.stare_ref(broken, rule.params, {"W": W, "M": M, "gate": bool(gate)})
    assert info["gate"] == gate and assert_matches(out.weights, expected) == []
    assert torch.isfinite(out.weights).all()
    empty = make_stats(2, 8, 5)
    empty.mask = torch.zeros_like(empty.mask)
    assert rule(empty, state).metrics["rule/gate"] == gate    # no valid token: H̄ undefined, gate kept


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
                assert torch.equal(out.weights, stats.mask)   # dense warm-up
            elif ties == "topk":
                assert_topk_counts(out.weights > 0, stats, stats.valid, 0.1, scope)


def test_ict_hand_case():
    # 10 valid tokens, ρ = 0.1: after warm-up only the largest JS (0.6 at (1,2)) is kept.
    js = torch.tensor([[0.1, 0.5, 0.2, 0.3, 0.0], [0.05, 0.4, 0.6, 0.25, 0.15]])
    stats = TokenStats(logp=torch.zeros(2, 5), mask=torch.ones(2, 5), advantages=torch.tensor([1.0, -1.0]),
                       group=torch.tensor([0, 0]), js=js)
    rule = get_method("ict")
    assert (rule(stats, RuleState(step=9)).weights == 1).all()
    out = rule(stats, RuleState(step=10))
    assert out.weights.nonzero().tolist() == [[1, 2]] and out.normalize == "selected"


# ------------------------------------------------------------------------------------------ GMTS

@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("kw", [dict(), dict(ties="quantile"), dict(beta=0.05, mode="zero_advantage"),
                                dict(scope="batch", eps_low=0.1, eps_high=0.28)])
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
            assert_topk_counts(out.weights > 0, stats, stats.valid, p.rho, p.scope)


def test_gmts_on_policy_is_entropy_times_advantage():
    # Without old_logp (r = 1) and no KL, δ = |H·A|. Row 0 A=+2, row 1 A=-1 (one group, 10 tokens):
    # δ row 0 = 2·H = [0.2, 1.0, 0.4, 0.6, 0.8]; row 1 = H = [3.0, 0.1, 0.1, 0.1, 0.1].
    # ρ = 0.2 keeps ⌈2⌉ = 2 tokens: (1,0) with 3.0 and (0,1) with 1.0 — not the largest-H tokens alone.
    H = torch.tensor([[0.1, 0.5, 0.2, 0.3, 0.4], [3.0, 0.1, 0.1, 0.1, 0.1]])
    stats = TokenStats(logp=torch.zeros(2, 5), mask=torch.ones(2, 5), advantages=torch.tensor([2.0, -1.0]),
                       group=torch.tensor([0, 0]), entropy=H)
    out = get_method("gmts")(stats, RuleState(trainer=TRAINER))
    assert out.weights.nonzero().tolist() == [[0, 1], [1, 0]]


def test_gmts_clip_indicator():
    # A > 0 with r = e^0.5 > 1.2: clipped, δ = 0, never selected although its H is the largest.
    stats = TokenStats(logp=torch.tensor([[0.0, 0.0]]) - 1, old_logp=torch.tensor([[-1.5, -1.0]]),
                       mask=torch.ones(1, 2), advantages=torch.tensor([1.0]), group=torch.tensor([0]),
                       entropy=torch.tensor([[5.0, 0.1]]))
    out = get_method("gmts", rho=0.5)(stats, RuleState(trainer=TRAINER))  # ε_high = 0.28 from the trainer
    assert out.weights.tolist() == [[0.0, 1.0]] and out.metrics["rule/clipped_frac"] == 0.5


# ----------------------------------------------------------------------------------------- OPEFO

@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("flow,scope", [("simple", "batch"), ("full", "batch"), ("simple", "group"),
                                        ("full", "sequence")])
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
    stats = TokenStats(logp=torch.tensor([[-1.0, -2.0], [-1.0, -2.0]]), mask=torch.ones(2, 2),
                       advantages=torch.tensor([1.0, -1.0]), group=torch.tensor([0, 0]),
                       entropy=torch.tensor([[1.5, 1.0], [0.5, 3.0]]))
    out = get_method("opefo")(stats, RuleState())
    lam = (math.exp(-1) - 2 * math.exp(-2)) / (math.exp(-1) + 2 * math.exp(-2))
    assert lam == pytest.approx(0.15223, abs=1e-5)
    assert out.metrics["rule/lambda"] == pytest.approx(lam, abs=1e-6)
    assert_close(out.weights, [[1 - lam, 1 + lam], [1 - lam, 1 + lam]])


def test_opefo_one_sided_flow_zeroes_that_side_and_all_zero_advantage_is_full():
    # Only ΔH > 0 tokens: λ = -1, they get weight 0 (net flow 0). A = 0 everywhere: ΔH = 0, λ = 0, weights 1.
    stats = TokenStats(logp=torch.tensor([[-2.0, -3.0]]), mask=torch.ones(1, 2), advantages=torch.tensor([1.0]),
                       group=torch.tensor([0]), entropy=torch.tensor([[1.0, 1.0]]))
    out = get_method("opefo")(stats, RuleState())
    assert out.weights.tolist() == [[0.0, 0.0]] and out.metrics["rule/lambda"] == -1.0
    zero = TokenStats(logp=torch.tensor([[-2.0, -3.0]]), mask=torch.ones(1, 2), advantages=torch.tensor([0.0]),
                      group=torch.tensor([0]), entropy=torch.tensor([[1.0, 1.0]]))
    assert get_method("opefo")(zero, RuleState()).weights.tolist() == [[1.0, 1.0]]


def test_opefo_full_flow_needs_p2():
    assert get_method("opefo", flow="full").needs == {"logp", "entropy", "p2", "p2logp"}
    assert get_method("opefo").needs == {"logp", "entropy"}
    stats = make_stats(0, 4, 5)
    bare = TokenStats(logp=stats.logp, mask=stats.mask, advantages=stats.advantages, group=stats.group,
                      entropy=stats.entropy)
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
    stats = TokenStats(logp=torch.log(torch.tensor([[0.001, 0.001, 0.001, 0.5, 0.001]])), mask=torch.ones(1, 5),
                       advantages=torch.tensor([1.0]), group=torch.tensor([0]),
                       entropy=torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]]))
    out = get_method("stapo")(stats, RuleState())
    assert out.weights.tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0]]
    assert out.metrics["rule/entropy_quantile"] == pytest.approx(0.18)
    neg = TokenStats(logp=stats.logp, mask=stats.mask, advantages=torch.tensor([-1.0]), group=stats.group,
                     entropy=stats.entropy)
    assert (get_method("stapo")(neg, RuleState()).weights == 1).all()


# ------------------------------------------------------------------------------------ all five

@pytest.mark.parametrize("name,kw", [("stare", dict(variant="C2")), ("stare", dict(adaptive=True, H_tgt=5.0)),
                                     ("ict", dict(warmup_steps=0)), ("gmts", dict(mode="zero_advantage")),
                                     ("opefo", dict(flow="full")), ("stapo", dict(tau_p=0.3))])
def test_invariants_of_non_default_parameters(name, kw):
    """Defaults are covered by test_rule_invariants.py; these variants read other statistics or paths."""
    check_all(get_method(name, **kw))


@pytest.mark.parametrize("name,kw,param", [
    ("stare", dict(P=1.5), "P"), ("stare", dict(P=0.0), "P"), ("stare", dict(variant="O3"), "variant"),
    ("stare", dict(W=0.9), "W"), ("stare", dict(M=1.2), "M"), ("stare", dict(scope="rank"), "scope"),
    ("stare", dict(adaptive=True, W=2.0), "W_max"), ("stare", dict(bogus=1), "bogus"),
    ("ict", dict(rho=1.5), "rho"), ("ict", dict(warmup_steps=-1), "warmup_steps"), ("ict", dict(ties="x"), "ties"),
    ("gmts", dict(rho=0.0), "rho"), ("gmts", dict(mode="zero"), "mode"), ("gmts", dict(eps_low=1.0), "eps_low"),
    ("gmts", dict(mode="renorm", normalize="valid"), "normalize"), ("gmts", dict(beta=-1.0), "beta"),
    ("opefo", dict(flow="exact"), "flow"), ("opefo", dict(normalize="sum"), "normalize"),
    ("stapo", dict(tau_p=0.0), "tau_p"), ("stapo", dict(tau_h_quantile=1.5), "tau_h_quantile"),
])
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
