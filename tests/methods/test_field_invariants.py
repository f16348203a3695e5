"""Invariants of the eight field rules' per-token losses: finite everywhere (padding, empty and one-token
rows included), no gradient through padding, and, for the rules whose scope allows it, the same per-token
loss when the batch is split into other micro-batches (Clip-Cov, KL-Cov and Archer select per micro-batch,
as their official codes: for them a split changes the selection, which the last test shows)."""

from __future__ import annotations

import pytest
import ref_field as R
import torch

from stare_lab.methods import adv_reweight, archer, ce_gppo, clip_cov, dppo, entropy_adv, kl_cov, lopti


def losses(b):
    """{name: per-token loss} of every rule with its defaults on batch b."""
    lp, old, ref, A, mask, H = b["logp"], b["old"], b["ref"], b["adv"], b["mask"], b["entropy"]
    gen = torch.Generator().manual_seed(0)
    return {
        "clip_cov": clip_cov.per_token_loss(lp, old, A, mask, clip_cov.Params(), 0.2, 0.2, generator=gen),
        "kl_cov": kl_cov.per_token_loss(lp, old, A, mask, kl_cov.Params()),
        "dppo_tv": dppo.per_token_loss(lp, old, A, mask, dppo.Params()),
        "dppo_kl": dppo.per_token_loss(lp, old, A, mask, dppo.Params(variant="kl")),
        "adv_reweight": adv_reweight.per_token_loss(lp, old, A, mask, adv_reweight.Params(), 0.2, 0.2),
        "lopti_0": lopti.per_token_loss(lp, old, A, mask, lopti.Params(), 0, 0.2, 0.2),
        "lopti_1": lopti.per_token_loss(lp, old, A, mask, lopti.Params(), 1, 0.2, 0.2),
        "archer": archer.per_token_loss(lp, old, ref, A, mask, H, archer.Params(kl_coef=0.001)),
        "entropy_adv": entropy_adv.per_token_loss(lp, old, A, mask, H, entropy_adv.Params(), 0.2, 0.2),
        "ce_gppo": ce_gppo.per_token_loss(lp, old, A, mask, ce_gppo.Params(), 0.2, 0.2),
    }


SPLIT_FREE = ("dppo_tv", "dppo_kl", "adv_reweight", "lopti_0", "lopti_1", "entropy_adv", "ce_gppo")


@pytest.mark.parametrize("token_adv", [False, True])
def test_finite_and_no_gradient_through_padding(token_adv):
    for b in R.batches(token_adv=token_adv):
        for name, loss in losses(b).items():
            assert torch.isfinite(loss).all(), name
            total = (loss * b["mask"]).sum()
            (grad,) = torch.autograd.grad(total, b["logp"], retain_graph=True, allow_unused=True)
            if grad is not None:
                assert torch.isfinite(grad).all() and not grad[b["mask"] == 0].any(), name


def test_split_into_micro_batches_changes_nothing_where_the_scope_allows():
    for b in R.batches(token_adv=True):
        whole = losses(b)
        B = b["logp"].shape[0]
        parts = []
        for rows in (slice(0, B // 2), slice(B // 2, B)):
            part = {k: (v[rows] if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in b.items()}
            parts.append(losses(part))
        for name in SPLIT_FREE:
            torch.testing.assert_close(torch.cat([p[name] for p in parts]), whole[name], rtol=0, atol=0)


def test_kl_cov_selection_is_per_micro_batch():
    # max(1, ⌊ρN⌋) per loss call: two micro-batches penalise two tokens where the whole batch penalises one
    b = next(R.batches(token_adv=True))
    lp, A, mask = b["logp"], b["adv"], b["mask"]
    whole = int(kl_cov.selected_tokens(lp, A, mask, 2e-3).sum())
    halves = sum(int(kl_cov.selected_tokens(lp[r], A[r], mask[r], 2e-3).sum()) for r in (slice(0, 2), slice(2, 4)))
    assert (whole, halves) == (1, 2)


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf")])
def test_padding_values_do_not_reach_valid_tokens(fill):
    for b in R.batches(token_adv=True):
        pad = b["mask"] == 0
        dirty = dict(b)
        for key in ("old", "ref", "entropy"):
            dirty[key] = b[key].masked_fill(pad, fill)
        dirty["logp"] = b["logp"].detach().masked_fill(pad, fill).requires_grad_(True)
        clean, noisy = losses(b), losses(dirty)
        for name in clean:
            torch.testing.assert_close(noisy[name][~pad], clean[name][~pad], rtol=0, atol=0, msg=name)


def test_trl_delta_is_verl_dual_clip():
    # TRL 1.16 GRPOTrainer._compute_loss (grpo, bnpo, dr_grpo, dapo, luspo) with args.delta = c:
    #   coef_2 = clamp(r, 1 − ε_low, 1 + ε_high); coef_1 = clamp(r, max=δ); ℓ = −min(coef_1·A, coef_2·A)
    # equals verl's dual clip min(max(−A·r, −A·clip(r)), −A·c) for A < 0 (δ > 1 + ε), in value and gradient,
    # so the integration can give the rules that ask for a dual clip c TRL's `delta = c`.
    from stare_lab.methods.ppo import clipped_surrogate

    for b in R.batches(scale=2.0, token_adv=True):
        lp, old, A, mask = b["logp"], b["old"], b["adv"], b["mask"]
        r = torch.exp(lp - old)
        trl = -torch.min(torch.clamp(r, max=1.5) * A, torch.clamp(r, 1 - 0.2, 1 + 0.28) * A)
        ours = clipped_surrogate(lp, old, A, 0.2, 0.28, dual_clip=1.5)
        a, o = R.value_and_grad(trl, lp, mask), R.value_and_grad(ours, lp, mask)
        torch.testing.assert_close(a[0], o[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a[1], o[1], rtol=1e-12, atol=1e-12)
