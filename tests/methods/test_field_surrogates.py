"""The rules that replace the clipped surrogate, DPPO (tv, kl) and CE-GPPO (stare_lab/methods/dppo.py, ce_gppo.py),
against the loop references in ref_field.py and the official functions ported in tests/support/official_field
(verl @1dda039, Kwai-Klear/CE-GPPO @10558fe): per-token values and gradients at float64."""

from __future__ import annotations

import math

import pytest
import ref_field as R
import torch
from official_field import ce_gppo as off_ce_gppo
from official_field import dppo as off_dppo

from stare_lab.methods import ce_gppo, dppo


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


class Config:
    """verl's ActorConfig as the DPPO functions read it: clip fields, .get, global_batch_info."""

    def __init__(self, delta_low, delta_high, clip_ratio_c=None):
        self.clip_ratio = delta_low
        self.clip_ratio_low, self.clip_ratio_high = delta_low, delta_high
        self.global_batch_info = {}
        self._extra = {} if clip_ratio_c is None else {"clip_ratio_c": clip_ratio_c}

    def get(self, key, default=None):
        return self._extra.get(key, default)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"variant": "js"}, "variant"),
        ({"delta": 0.0}, "delta"),
        ({"delta_low": -0.1}, "delta_low"),
        ({"is_cap": 0.0}, "is_cap"),
    ],
)
def test_dppo_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dppo.Params(**kwargs)


def test_dppo_defaults():
    assert (dppo.Params().delta, dppo.Params(variant="kl").delta, dppo.Params().is_cap) == (0.15, 0.05, 20.0)
    assert dppo.Params(delta=0.1, delta_high=0.3).delta_low == 0.1


def test_dppo_tv_by_hand():
    # p_old = 0.5, p = 0.7 (p − p_old = 0.2 > δ = 0.15), r = 1.4.
    # A = +1: outside the region (0.2 > δ_high): ℓ = 0, no gradient.
    # A = −1: the negative side asks p − p_old ≥ −δ: kept, ℓ = −A·min(r, 20)·log p = 1.4·log 0.7 = −0.49934,
    # dℓ/dlog p = −A·sg(r) = 1.4.
    logp = torch.tensor([[math.log(0.7), math.log(0.7)]], dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 2), math.log(0.5), dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    val, grad = R.value_and_grad(dppo.per_token_loss(logp, old, adv, mask, dppo.Params()), logp, mask)
    close(val, torch.tensor([[0.0, 1.4 * math.log(0.7)]], dtype=torch.float64))
    close(grad, torch.tensor([[0.0, 1.4]], dtype=torch.float64))
    assert dppo.metrics(logp, old, adv, mask, dppo.Params()) == {"rule/dropped_frac": 0.5, "rule/capped_frac": 0.0}


@pytest.mark.parametrize("variant", ["tv", "kl"])
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("cap", [20.0, 1.3])
def test_dppo_against_loop_and_official(variant, token_adv, cap, monkeypatch):
    seen, agg = R.capture_loss_mat(off_dppo)
    monkeypatch.setattr(off_dppo, "agg_loss", agg)
    official_fn = {"tv": off_dppo.compute_policy_loss_dppo_tv, "kl": off_dppo.compute_policy_loss_dppo_kl}[variant]
    p = dppo.Params(variant=variant, delta_low=0.1, delta_high=0.15, is_cap=cap)
    dropped = 0
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        ours = dppo.per_token_loss(lp, old, A, mask, p)
        val, grad = R.value_and_grad(ours, lp, mask)
        rv, rg = R.ref_dppo(
            R.lists(lp), R.lists(old), R.token_lists(A, lp), R.valid_lists(mask), variant, 0.1, 0.15, cap
        )
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
        A2 = A[:, None].expand_as(lp) if A.dim() == 1 else A
        config = Config(0.1, 0.15, clip_ratio_c=None if cap == 20.0 else cap)  # 20: the function's own fallback
        official, _ = official_fn(old, lp, A2, mask, config=config)
        oval, ograd = R.value_and_grad(seen[-1], lp, mask)
        close(val, oval)
        close(grad, ograd)
        ours_scalar = (ours * mask).sum() / mask.sum()  # verl's agg_loss token-mean, one process
        close(ours_scalar, official)
        close(torch.autograd.grad(ours_scalar, lp, retain_graph=True)[0], torch.autograd.grad(official, lp)[0])
        dropped += dppo.metrics(lp, old, A, mask, p)["rule/dropped_frac"] > 0
    assert dropped  # the batches do leave the trust region


def test_bernoulli_kl_is_a_kl():
    p = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    d = dppo.bernoulli_kl(p.log(), p.log())
    close(d, torch.zeros(3, dtype=torch.float64))
    q = torch.tensor([0.2, 0.3, 0.6], dtype=torch.float64)
    exact = q * (q / p).log() + (1 - q) * ((1 - q) / (1 - p)).log()  # KL(Bern(q) ‖ Bern(p))
    torch.testing.assert_close(dppo.bernoulli_kl(p.log(), q.log()), exact, rtol=1e-6, atol=1e-7)


# ---- CE-GPPO ----


@pytest.mark.parametrize(
    "kwargs, name", [({"beta_low": -0.1}, "beta_low"), ({"beta_high": -1.0}, "beta_high"), ({"dual_clip": 1.0}, "dual")]
)
def test_ce_gppo_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ce_gppo.Params(**kwargs)


def test_ce_gppo_by_hand():
    # ε = 0.2, β1 = 0.5, β2 = 1, c = 10.
    # r = 0.5, A = −1 (below 1 − ε): ℓ = −β1·(1 − ε)·A = 0.4 in value, dℓ/dlog π = 0.4 (r/sg r has gradient 1).
    # r = 1.5, A = +1 (above 1 + ε): ℓ = −β2·(1 + ε)·A = −1.2, gradient −1.2 (PPO would give 0).
    # r = 1.1, A = +1 (inside): ℓ = −r·A = −1.1, gradient −1.1.
    # r = 2.0, A = −20: neither side; −r·A = 40 < −A·c = 200, so the dual clip does not bite: 40, gradient 40.
    logp = torch.tensor([[math.log(0.25), math.log(0.75), math.log(0.55), math.log(0.8)]], dtype=torch.float64)
    logp.requires_grad_(True)
    old = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.5), math.log(0.4)]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0, 1.0, -20.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    val, grad = R.value_and_grad(ce_gppo.per_token_loss(logp, old, adv, mask, ce_gppo.Params(), 0.2, 0.2), logp, mask)
    close(val, torch.tensor([[0.4, -1.2, -1.1, 40.0]], dtype=torch.float64))
    close(grad, torch.tensor([[0.4, -1.2, -1.1, 40.0]], dtype=torch.float64))


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
@pytest.mark.parametrize("betas", [(0.5, 1.0), (0.75, 0.5)])
@pytest.mark.parametrize("dual", [10.0, 1.2])
def test_ce_gppo_against_loop_and_official(token_adv, eps, betas, dual, monkeypatch):
    seen, agg = R.capture_loss_mat(off_ce_gppo)
    monkeypatch.setattr(off_ce_gppo, "agg_loss", agg)
    p = ce_gppo.Params(beta_low=betas[0], beta_high=betas[1], dual_clip=dual)
    for b in R.batches(scale=3.0, token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        ours = ce_gppo.per_token_loss(lp, old, A, mask, p, *eps)
        val, grad = R.value_and_grad(ours, lp, mask)
        rv, rg = R.ref_ce_gppo(R.lists(lp), R.lists(old), R.token_lists(A, lp), R.valid_lists(mask), *betas, *eps, dual)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
        A2 = A[:, None].expand_as(lp).contiguous() if A.dim() == 1 else A
        official, _, _, _ = off_ce_gppo.compute_gppo_loss_general_beta(
            old, lp, A2, mask, cliprange_low=eps[0], cliprange_high=eps[1], clip_ratio_c=dual,
            gppo_loss_beta1=betas[0], gppo_loss_beta2=betas[1],
        )  # fmt: skip
        oval, ograd = R.value_and_grad(seen[-1], lp, mask)
        close(val, oval)
        close(grad, ograd)
        ours_scalar = (ours * mask).sum() / (mask.sum() + 1e-8)  # verl_F.masked_mean
        close(ours_scalar, official)
        close(torch.autograd.grad(ours_scalar, lp, retain_graph=True)[0], torch.autograd.grad(official, lp)[0])


def test_ce_gppo_without_dual_clip_is_the_three_cases():
    low = high = 0.0
    for b in R.batches(scale=3.0, token_adv=True):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        loss = ce_gppo.per_token_loss(lp, old, A, mask, ce_gppo.Params(dual_clip=None), 0.2, 0.2)
        val, _ = R.value_and_grad(loss, lp, mask)
        lists = R.lists(lp), R.lists(old), R.token_lists(A, lp), R.valid_lists(mask)
        rv, _ = R.ref_ce_gppo(*lists, 0.5, 1.0, 0.2, 0.2, None)
        close(val, torch.tensor(rv, dtype=torch.float64))
        m = ce_gppo.metrics(lp, old, A, mask, 0.2, 0.2)
        low, high = low + m["rule/clipped_low_frac"], high + m["rule/clipped_high_frac"]
    assert low > 0 and high > 0  # both gradient-preserved sides occur
