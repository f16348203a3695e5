"""Clip-Cov and KL-Cov (stare_lab/methods/clip_cov.py, kl_cov.py) against the loop references in ref_field.py
and against the official functions ported in tests/support/official_field (values and gradients, float64)."""

from __future__ import annotations

import math
import types

import pytest
import ref_field as R
import torch
from official_field import clip_cov as off_clip_cov
from official_field import kl_cov as off_kl_cov
from official_field import kl_cov_verl as off_kl_cov_verl

from stare_lab.methods import clip_cov, kl_cov

EPS = [(0.2, 0.2), (1.0, 1.0)]  # TRL/verl's default, and the official Clip-Cov scripts' clip_ratio = 1


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---- parameters ----


@pytest.mark.parametrize(
    "kwargs, name",
    [({"ratio": 0.0}, "ratio"), ({"ratio": 1.5}, "ratio"), ({"lb": 5.0, "ub": 5.0}, "lb"), ({"scope": "x"}, "scope")],
)
def test_clip_cov_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        clip_cov.Params(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name", [({"ratio": 0.0}, "ratio"), ({"ratio": 2.0}, "ratio"), ({"kl_coef": -1.0}, "kl_coef")]
)
def test_kl_cov_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        kl_cov.Params(**kwargs)


def test_defaults_follow_the_official_scripts():
    assert (clip_cov.Params().ratio, clip_cov.Params().lb, clip_cov.Params().ub) == (2e-4, 1.0, 5.0)
    assert kl_cov.Params().ratio == 0.2 / 100  # official 7b_kl_cov.sh: k_percent = 0.2 (a percentage)
    assert kl_cov.Params().kl_coef == 1.0


# ---- Clip-Cov ----


def test_clip_cov_by_hand():
    # One row, A = [2, −2], log π = [0, −2] = log π_old (r = 1, PPO's clip inactive).
    # mean A = 0, mean log π = −1: Cov = [2·1, (−2)·(−1)] = [2, 2], both in (1, 5).
    # N = 2, ρ = 0.5: k = 1, so exactly one token is detached and the other keeps −A·r:
    # Σℓ = −2 (token 0 kept) or +2 (token 1 kept); with ρ = 1 both are detached and ℓ = 0.
    logp = torch.tensor([[0.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    cov = clip_cov.covariance(logp, adv, mask)
    # (up to the official Σ/(N + 1e-8) means: Cov = 2 − 1e-8 here)
    torch.testing.assert_close(cov, torch.tensor([[2.0, 2.0]], dtype=torch.float64), rtol=0, atol=1e-7)
    for seed in range(4):
        p = clip_cov.Params(ratio=0.5)
        loss = clip_cov.per_token_loss(
            logp, logp.detach(), adv, mask, p, 0.2, 0.2, generator=torch.Generator().manual_seed(seed)
        )
        assert float(loss.detach().sum()) in (-2.0, 2.0) and int((loss == 0).sum()) == 1
    loss = clip_cov.per_token_loss(logp, logp.detach(), adv, mask, clip_cov.Params(ratio=1.0), 0.2, 0.2)
    assert float(loss.detach().abs().sum()) == 0.0


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("ratio", [2e-4, 0.3])
def test_clip_cov_against_loop(eps, token_adv, ratio):
    p = clip_cov.Params(ratio=ratio)
    seen_nonempty = False
    for b in R.batches(scale=3.0, token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        lp_, old_, adv_, valid_ = R.lists(lp), R.lists(old), R.token_lists(A, lp), R.valid_lists(mask)
        gen = torch.Generator().manual_seed(b["seed"])
        detached = clip_cov.detached_tokens(lp, old, A, mask, p, *eps, generator=gen)
        candidates = R.ref_clip_cov_candidates(lp_, old_, adv_, valid_, p.lb, p.ub, *eps)
        chosen = {tuple(x) for x in torch.nonzero(detached).tolist()}
        n = int(mask.sum())
        assert chosen <= candidates
        assert len(chosen) == (min(max(1, int(ratio * n)), len(candidates)) if candidates else 0)
        seen_nonempty |= bool(chosen)
        val, grad = R.value_and_grad(clip_cov.per_token_loss(lp, old, A, mask, p, *eps, detached=detached), lp, mask)
        rv, rg = R.ref_clip_cov(lp_, old_, adv_, valid_, chosen, *eps)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
    assert seen_nonempty  # the batches do reach the Cov band


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("ratio", [2e-4, 0.3, 1.0])
def test_clip_cov_against_official(eps, ratio, monkeypatch):
    seen, agg = R.capture_loss_mat(off_clip_cov)
    monkeypatch.setattr(off_clip_cov, "agg_loss", agg)
    p = clip_cov.Params(ratio=ratio)
    for b in R.batches(scale=3.0, token_adv=True):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        torch.manual_seed(b["seed"])  # the official draw uses the global generator
        official, _, _ = off_clip_cov.compute_policy_loss_clip_cov(
            old, lp, A, mask, cliprange_low=eps[0], cliprange_high=eps[1], clip_ratio=ratio
        )
        ours = clip_cov.per_token_loss(lp, old, A, mask, p, *eps, generator=torch.Generator().manual_seed(b["seed"]))
        val, grad = R.value_and_grad(ours, lp, mask)
        oval, ograd = R.value_and_grad(seen[-1], lp, mask)
        close(val, oval)
        close(grad, ograd)
        ours_scalar = (ours * mask).sum() / (mask.sum() + 1e-8)  # token-mean, verl_F.masked_mean
        close(ours_scalar, official)
        close(torch.autograd.grad(ours_scalar, lp, retain_graph=True)[0], torch.autograd.grad(official, lp)[0])


def test_clip_cov_metrics():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    detached = torch.tensor([[True, False, False], [False, False, True]])
    assert clip_cov.metrics(detached, mask) == {"rule/detached_frac": 2 / 5}
    assert clip_cov.metrics(detached & False, mask * 0) == {"rule/detached_frac": 0.0}


# ---- KL-Cov ----


def test_kl_cov_by_hand():
    # One row, A = [2, 0, −2], log π = [0, −1, −4]: mean A = 0, mean log π = −5/3,
    # Cov = [2·5/3, 0, (−2)·(−7/3)] = [3.33, 0, 4.67]; k = max(1, ⌊0.002·3⌋) = 1 selects token 2.
    # log π_old = [0, −1, −4.5]: x = log r = [0, 0, 0.5]; ℓ = −A·e^x + β|x| on token 2 only:
    # ℓ = [−2, 0, 2·e^0.5 + 0.5] = [−2, 0, 3.7974]; dℓ/dlog π = [−2, 0, 2·e^0.5 + 1].
    logp = torch.tensor([[0.0, -1.0, -4.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, -1.0, -4.5]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 0.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    sel = kl_cov.selected_tokens(logp, adv, mask, 2e-3)
    assert sel.tolist() == [[False, False, True]]
    val, grad = R.value_and_grad(kl_cov.per_token_loss(logp, old, adv, mask, kl_cov.Params()), logp, mask)
    e = math.exp(0.5)
    close(val, torch.tensor([[-2.0, 0.0, 2 * e + 0.5]], dtype=torch.float64))
    close(grad, torch.tensor([[-2.0, 0.0, 2 * e + 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("ratio", [2e-3, 0.25, 1.0])
def test_kl_cov_against_loop(token_adv, ratio):
    p = kl_cov.Params(ratio=ratio)
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        lp_, old_, adv_, valid_ = R.lists(lp), R.lists(old), R.token_lists(A, lp), R.valid_lists(mask)
        sel = kl_cov.selected_tokens(lp, A, mask, ratio)
        ref_sel = R.ref_kl_cov_selected(lp_, adv_, valid_, ratio)
        if not token_adv:
            # [B] advantages tie Cov inside a row; only the count and the top value are defined
            assert int(sel.sum()) == len(ref_sel)
            ref_sel = {tuple(x) for x in torch.nonzero(sel).tolist()}
        else:
            assert {tuple(x) for x in torch.nonzero(sel).tolist()} == ref_sel
        val, grad = R.value_and_grad(kl_cov.per_token_loss(lp, old, A, mask, p, selected=sel), lp, mask)
        rv, rg = R.ref_kl_cov(lp_, old_, adv_, valid_, ref_sel, p.kl_coef)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("ratio", [2e-3, 0.25, 1.0])
def test_kl_cov_against_official(token_adv, ratio, monkeypatch):
    seen, agg = R.capture_loss_mat(off_kl_cov)
    monkeypatch.setattr(off_kl_cov, "agg_loss", agg)
    seen_verl, agg_verl = R.capture_loss_mat(off_kl_cov_verl)
    monkeypatch.setattr(off_kl_cov_verl, "agg_loss", agg_verl)
    config = types.SimpleNamespace(
        policy_loss=types.SimpleNamespace(kl_cov_ratio=ratio, ppo_kl_coef=1.0), global_batch_info={}
    )
    for b in R.batches(token_adv=token_adv):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        A2 = A[:, None].expand_as(lp).contiguous() if A.dim() == 1 else A
        official, _, _ = off_kl_cov.compute_policy_loss_kl_cov(old, lp, A2, mask, k_percent=ratio * 100, ppo_kl_coef=1)
        official_verl, _ = off_kl_cov_verl.compute_policy_loss_kl_cov(old, lp, A2, mask, config=config)
        ours = kl_cov.per_token_loss(lp, old, A, mask, kl_cov.Params(ratio=ratio))
        val, grad = R.value_and_grad(ours, lp, mask)
        pairs = [(seen_verl[-1], official_verl)]
        if ratio * 100 <= mask.sum():  # else PRIME's k = min(k_percent, N) takes N as the percentage (kl_cov.py note 7)
            pairs.append((seen[-1], official))
        for mat, scalar in pairs:
            oval, ograd = R.value_and_grad(mat, lp, mask)
            close(val, oval)
            close(grad, ograd)
            denom = mask.sum() + 1e-8 if scalar is official else mask.sum()  # PRIME's masked_mean; verl's agg_loss
            ours_scalar = (ours * mask).sum() / denom
            close(ours_scalar, scalar)
            close(torch.autograd.grad(ours_scalar, lp, retain_graph=True)[0], torch.autograd.grad(scalar, lp)[0])


def test_kl_cov_global_quota_matches_verl_test():
    # verl tests/trainer/ppo/test_kl_cov_mask_on_cpu.py @568072e: one token for 8192 at ρ = 2e-4
    # over the whole batch, eight when the same batch is split into 8 micro-batches.
    adv = torch.linspace(-2, 3, 8192).reshape(64, 128)
    log_prob = adv.square() * 0.1 - 4
    valid = torch.ones_like(adv)
    assert int(kl_cov.selected_tokens(log_prob, adv, valid, 0.0002).sum()) == 1
    parts = zip(adv.chunk(8), log_prob.chunk(8), valid.chunk(8), strict=True)
    assert sum(int(kl_cov.selected_tokens(p, a, m, 0.0002).sum()) for a, p, m in parts) == 8


@pytest.mark.parametrize("ratio", [0.0002, 0.5, 1.0])
def test_kl_cov_mask_excludes_padding_as_verl_test(ratio):
    adv = torch.tensor([[0.0, 2.0, 1e6], [-1.0, 3.0, -1e6]])
    log_prob = torch.tensor([[0.3, 1.2, 1e6], [-0.8, 2.6, -1e6]])
    valid = torch.tensor([[True, True, False], [True, True, False]])
    actual = kl_cov.selected_tokens(log_prob, adv, valid.float(), ratio)
    score = (adv[valid] - adv[valid].mean()) * (log_prob[valid] - log_prob[valid].mean())
    expected = torch.zeros_like(score, dtype=torch.bool)
    expected[score.argsort(descending=True)[: max(1, int(valid.sum() * ratio))]] = True
    assert actual[valid].tolist() == expected.tolist() and not actual[~valid].any()
    assert not kl_cov.selected_tokens(log_prob, adv, torch.zeros(2, 3), ratio).any()


@pytest.mark.parametrize("seed", range(3))
def test_kl_cov_accepts_any_strides_as_verl_test_runs_on_transposes(seed):
    """verl's KL-Cov mask test runs every case on `.T` as well (issue 27.3: ours raised `view size is not
    compatible` there). The transposed batch (T rows of B tokens, token advantages) selects the transpose
    of the selection (distinct Cov values, so no tie reorders it), and the same batch laid out column-major
    (`.T.contiguous().T`) selects exactly the same tokens, in the selection and in the loss."""
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(6, 9, generator=g, dtype=torch.float64)
    log_prob = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    valid = (torch.rand(6, 9, generator=g) > 0.2).double()
    for ratio in (0.0002, 0.1, 0.5):
        want = kl_cov.selected_tokens(log_prob, adv, valid, ratio)
        assert torch.equal(kl_cov.selected_tokens(log_prob.T, adv.T, valid.T, ratio), want.T)
        strided = [x.T.contiguous().T for x in (log_prob, adv, valid)]
        assert not strided[0].is_contiguous()
        assert torch.equal(kl_cov.selected_tokens(*strided, ratio), want)
        old = log_prob - 0.2
        p = kl_cov.Params(ratio=ratio)
        close(
            kl_cov.per_token_loss(strided[0], old.T.contiguous().T, strided[1], strided[2], p),
            kl_cov.per_token_loss(log_prob, old, adv, valid, p),
        )


def test_kl_cov_on_policy_is_grpo():
    # π_old = π_θ: |log r| = 0 with zero gradient, r = 1, so ℓ = −A and dℓ/dlog π = −A on every token
    for b in R.batches(token_adv=True):
        lp, A, mask = b["logp"], b["adv"], b["mask"]
        val, grad = R.value_and_grad(
            kl_cov.per_token_loss(lp, lp.detach(), A, mask, kl_cov.Params(ratio=1.0)), lp, mask
        )
        close(val, -A * mask)
        close(grad, -A * mask)


def test_kl_cov_metrics():
    sel = torch.tensor([[True, False], [False, False]])
    assert kl_cov.metrics(sel, torch.ones(2, 2)) == {"rule/penalised_frac": 0.25}
