"""The rules that reweight or shape the advantage: adv_reweight, lopti (two phases) and entropy_adv
(stare_lab/methods/adv_reweight.py, lopti.py, entropy_adv.py), against the loop references in ref_field.py
and, for the first two, the official code ported in tests/support/official_field/lopti.py (zhyang2226/AR-Lopti
@cbeb333): per-token values and gradients at float64. Entropy advantage shaping has no official code."""

from __future__ import annotations

import types

import pytest
import ref_field as R
import torch
from official_field import lopti as off

from stare_lab.methods import adv_reweight, entropy_adv, get_method, lopti
from stare_lab.methods.ppo import clipped_surrogate

EPS = (0.2, 0.24)  # AR-Lopti scripts: CLIP_LOW=0.20, CLIP_HIGH=0.24
DUAL = 10.0  # AR-Lopti scripts: clip_ratio_c=10.0


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def inputs(b):
    return R.lists(b["logp"]), R.lists(b["old"]), R.token_lists(b["adv"], b["logp"]), R.valid_lists(b["mask"])


def official_ppo(old, lp, adv, mask, monkeypatch):
    """The AR-Lopti compute_policy_loss per-token matrix and scalar (dual clip c = 10)."""
    seen, agg = R.capture_loss_mat(off)
    monkeypatch.setattr(off, "agg_loss", agg)
    scalar, _, _, _ = off.compute_policy_loss(
        old, lp, adv, mask, cliprange_low=EPS[0], cliprange_high=EPS[1], clip_ratio_c=DUAL
    )
    return seen[-1], scalar


# ---- parameters ----


@pytest.mark.parametrize(
    "module, kwargs, name",
    [
        (adv_reweight, {"alpha": -0.1}, "alpha"),
        (adv_reweight, {"alpha": 1.5}, "alpha"),
        (adv_reweight, {"alpha": 0.5, "tau": -0.1}, "tau"),
        (adv_reweight, {"neg_weight": -1.0}, "neg_weight"),
        (lopti, {"eta": 0.0}, "eta"),
        (lopti, {"eta": 1.0}, "eta"),
        (lopti, {"order": "random"}, "order"),
        (entropy_adv, {"alpha": 1.5}, "alpha"),
        (entropy_adv, {"kappa": 0.0}, "kappa"),
        (entropy_adv, {"kappa": -2.0}, "kappa"),
        (entropy_adv, {"scope": "group"}, "scope"),
    ],
)
def test_bad_params(module, kwargs, name):
    with pytest.raises(ValueError, match=name):
        module.Params(**kwargs)


def test_defaults():
    assert (adv_reweight.Params().alpha, adv_reweight.Params().tau, adv_reweight.Params().neg_weight) == (0.2, 0.8, 1.0)
    assert lopti.Params().eta == 0.5 and get_method("lopti").iterations == 2
    assert (entropy_adv.Params().alpha, entropy_adv.Params().kappa) == (0.4, 2.0)


# ---- advantage reweighting ----


def test_adv_reweight_by_hand():
    # α = 0.2: w = 0.2·π_old + 0.8; π_old = 0.5 → w = 0.9, π_old = 0.1 → w = 0.82; padding → 0.
    old = torch.tensor([[0.5, 0.1, 0.3]], dtype=torch.float64).log()
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    w = adv_reweight.advantage_weights(old, torch.tensor([1.0], dtype=torch.float64), mask, adv_reweight.Params())
    close(w, torch.tensor([[0.9, 0.82, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("params", [{}, {"alpha": 0.3}, {"alpha": 0.5, "tau": 0.7, "neg_weight": 0.8}])
def test_adv_reweight_against_loop_and_official(token_adv, params, monkeypatch):
    p = adv_reweight.Params(**params)
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        ours = adv_reweight.per_token_loss(lp, old, A, mask, p, *EPS, DUAL)
        val, grad = R.value_and_grad(ours, lp, mask)
        rv, rg = R.ref_adv_reweight(*inputs(b), p.alpha, p.tau, p.neg_weight, *EPS, DUAL)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
        A2 = A[:, None].expand_as(lp).contiguous() if A.dim() == 1 else A
        shaped = off.compute_reweight_advantage(A2, old, "both_linear_normal", p.alpha, p.tau, p.neg_weight)
        mat, scalar = official_ppo(old, lp, shaped, mask, monkeypatch)
        oval, ograd = R.value_and_grad(mat, lp, mask)
        close(val, oval)
        close(grad, ograd)
        close((ours * mask).sum() / mask.sum(), scalar)  # AR-Lopti's masked_mean: Σ/N


def test_adv_reweight_is_a_weight_on_the_surrogate():
    # w > 0, so surrogate(w·A) = w·surrogate(A) in value and gradient (dual clip included)
    p = adv_reweight.Params(alpha=0.3)
    for b in R.batches(token_adv=True):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        w = adv_reweight.advantage_weights(old, A, mask, p)
        a = R.value_and_grad(adv_reweight.per_token_loss(lp, old, A, mask, p, *EPS, DUAL), lp, mask)
        c = R.value_and_grad(w * clipped_surrogate(lp, old, A, *EPS, DUAL), lp, mask)
        close(a[0], c[0])
        close(a[1], c[1])


# ---- Lopti ----


class Recorder:
    """The actor worker group: records what each update_actor call trains on."""

    def __init__(self):
        self.calls = []

    def update_actor(self, batch):
        self.calls.append((batch.batch["advantages"].clone(), batch.batch["kl_entropy_mask"].clone()))
        return types.SimpleNamespace(meta_info={"metrics": {}})


def official_phases(adv, old, mask, seperate_prob):
    """Run the official RayPPOTrainer.fit actor block; (advantages, kl_entropy_mask[:, -T:]) per update."""
    B, T = old.shape
    prompt = torch.ones(B, 2, dtype=torch.long)
    recorder = Recorder()
    trainer = types.SimpleNamespace(
        config=types.SimpleNamespace(
            algorithm=types.SimpleNamespace(seperate_updating=True, seperate_prob=seperate_prob, seperate_portion=0.5)
        ),
        actor_rollout_wg=recorder,
    )
    batch = types.SimpleNamespace(
        batch={
            "advantages": adv.clone(),
            "old_log_probs": old,
            "attention_mask": torch.cat([prompt, mask.long()], dim=1),
            "responses": torch.zeros(B, T, dtype=torch.long),
        }
    )
    record = off.update_actor_separately(trainer, batch)
    assert torch.equal(batch.batch["advantages"], adv)  # the official block restores the advantages
    return [(a, m[:, -T:]) for a, m in recorder.calls], record


def test_lopti_by_hand():
    # η = 0.5: π_old = [0.3, 0.5, 0.9] → phase 1 trains token 0 (0.3 < 0.5), phase 2 tokens 1 and 2
    # (0.5 ≥ 0.5 goes to the second phase); the padding token is in neither.
    old = torch.tensor([[0.3, 0.5, 0.9, 0.2]], dtype=torch.float64).log()
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    p = lopti.Params()
    assert lopti.phase_weights(old, mask, p, 0).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert lopti.phase_weights(old, mask, p, 1).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert lopti.metrics(old, mask, p) == {"rule/phase1_frac": 1 / 3, "rule/phase2_frac": 2 / 3}
    with pytest.raises(ValueError, match="phase"):
        lopti.phase_weights(old, mask, p, 2)


@pytest.mark.parametrize("order", ["low_first", "high_first"])
@pytest.mark.parametrize("eta", [0.5, 0.4])
@pytest.mark.parametrize("token_adv", [False, True])
def test_lopti_against_loop_and_official(order, eta, token_adv, monkeypatch):
    p = lopti.Params(eta=eta, order=order)
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        A2 = A[:, None].expand_as(lp).contiguous() if A.dim() == 1 else A
        phases, record = official_phases(A2, old, mask, eta if order == "low_first" else -eta)
        assert record["actor/sep_prob"] == eta
        for phase, (phase_adv, kl_entropy_mask) in enumerate(phases):
            ours = lopti.per_token_loss(lp, old, A, mask, p, phase, *EPS, DUAL)
            val, grad = R.value_and_grad(ours, lp, mask)
            if order == "low_first":
                rv, rg = R.ref_lopti(*inputs(b), eta, phase, *EPS, DUAL)
                close(val, torch.tensor(rv, dtype=torch.float64))
                close(grad, torch.tensor(rg, dtype=torch.float64))
            # the official phase: advantages zeroed outside it, KL/entropy masked, denominator unchanged
            weights = lopti.phase_weights(old, mask, p, phase)
            close(weights, kl_entropy_mask.double() * mask)
            mat, scalar = official_ppo(old, lp, phase_adv, mask, monkeypatch)
            oval, ograd = R.value_and_grad(mat, lp, mask)
            close(val, oval)
            close(grad, ograd)
            close((ours * mask).sum() / mask.sum(), scalar)
        # the official metric counts padding positions in its numerator (lopti.py note 5)
        first_anywhere = float(lopti.first_phase_tokens(old, p).sum())
        assert record["actor/sep_portion"] == pytest.approx(first_anywhere / float(mask.sum()))


def test_lopti_composes_with_adv_reweight(monkeypatch):
    # AR + Lopti (the official scripts/train_kklogic_AR-Lopti_4x80GB.sh): reweight first, then the phases
    ar, lo = adv_reweight.Params(alpha=0.3), lopti.Params()
    for b in R.batches(token_adv=True):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        shaped = off.compute_reweight_advantage(A, old, "both_linear_normal", 0.3, 0.7, 1.0)
        phases, _ = official_phases(shaped, old, mask, 0.5)
        for phase, (phase_adv, _) in enumerate(phases):
            w = lopti.phase_weights(old, mask, lo, phase) * adv_reweight.advantage_weights(old, A, mask, ar)
            ours = w * clipped_surrogate(lp, old, A, *EPS, DUAL)
            mat, _ = official_ppo(old, lp, phase_adv, mask, monkeypatch)
            a, o = R.value_and_grad(ours, lp, mask), R.value_and_grad(mat, lp, mask)
            close(a[0], o[0])
            close(a[1], o[1])


# ---- entropy advantage shaping ----


def test_entropy_adv_by_hand():
    # α = 0.4, κ = 2: A = 1, H = 2: ψ = min(0.8, 0.5) = 0.5 → A′ = 1.5 (w = 1.5);
    # A = −1, H = 0.5: ψ = min(0.2, 0.5) = 0.2 → A′ = −0.8 (w = 0.8); A = 0: ψ = 0 → A′ = 0 (w = 1).
    H = torch.tensor([[2.0, 0.5, 1.0]], dtype=torch.float64)
    A = torch.tensor([[1.0, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    p = entropy_adv.Params()
    close(entropy_adv.shaped_advantages(H, A, mask, p), torch.tensor([[1.5, -0.8, 0.0]], dtype=torch.float64))
    close(entropy_adv.advantage_weights(H, A, mask, p), torch.tensor([[1.5, 0.8, 1.0]], dtype=torch.float64))
    assert entropy_adv.metrics(H, A, mask, p)["rule/bonus_capped_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("alpha, kappa", [(0.4, 2.0), (0.1, 3.0), (1.0, 1.5)])
def test_entropy_adv_against_loop(token_adv, alpha, kappa):
    p = entropy_adv.Params(alpha=alpha, kappa=kappa)
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask, H = b["logp"], b["old"], b["adv"], b["mask"], b["entropy"]
        ours = entropy_adv.per_token_loss(lp, old, A, mask, H, p, 0.2, 0.2)
        val, grad = R.value_and_grad(ours, lp, mask)
        rv, rg = R.ref_entropy_adv(*inputs(b), R.lists(H), alpha, kappa, 0.2, 0.2)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
        # κ > 1: a positive weight on the surrogate gives the same loss and gradient
        w = entropy_adv.advantage_weights(H, A, mask, p)
        assert bool((w[mask > 0] > 0).all())
        c = R.value_and_grad(w * clipped_surrogate(lp, old, A, 0.2, 0.2), lp, mask)
        close(val, c[0])
        close(grad, c[1])


def test_entropy_adv_sign_flip_refuses_the_weight_form():
    H = torch.tensor([[3.0]], dtype=torch.float64)
    A = torch.tensor([[-1.0]], dtype=torch.float64)
    p = entropy_adv.Params(alpha=1.0, kappa=0.5)  # ψ = min(3, 2) = 2: A′ = +1
    close(entropy_adv.shaped_advantages(H, A, torch.ones(1, 1), p), torch.tensor([[1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="kappa"):
        entropy_adv.advantage_weights(H, A, torch.ones(1, 1), p)
