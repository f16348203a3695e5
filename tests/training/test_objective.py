"""The surrogate, the KL term and every loss aggregation against slow loop references, plus hand cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from stare_lab.methods.select import quantile
from stare_lab.training.objective import Aggregation, aggregate, clipped_surrogate, kl_penalty, token_loss


def ref_surrogate(logp, old, adv, eps_low, eps_high, delta=None, mask=None):
    """TRL 1.16's `_compute_loss` branch for grpo/bnpo/dr_grpo/dapo/luspo, one token at a time: r capped at
    δ in the unclipped branch only; with `mask`, GSPO's one ratio per row (exp of the mean log-ratio over
    the row's valid tokens), the same for every position of the row."""
    B, T = len(logp), len(logp[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        if mask is not None:
            n = sum(mask[i])
            seq = sum(logp[i][t] - old[i][t] for t in range(T) if mask[i][t]) / max(n, 1.0)
        for t in range(T):
            r = math.exp(seq if mask is not None else logp[i][t] - old[i][t])
            clipped = min(max(r, 1 - eps_low), 1 + eps_high)
            capped = r if delta is None else min(r, delta)
            out[i][t] = -min(capped * adv[i], clipped * adv[i])
    return out


def ref_aggregate(loss, w, mask, loss_type, normalize, num_items, weight_total, ga, spg, L, kl=None, beta=0.0):
    B, T = len(loss), len(loss[0])
    tok = [[(loss[i][t] * w[i][t] + (beta * kl[i][t] if kl else 0.0)) * mask[i][t] for t in range(T)] for i in range(B)]
    sel = normalize == "selected"
    if loss_type == "grpo":
        rows = []
        for i in range(B):
            d = sum(w[i][t] * mask[i][t] for t in range(T)) if sel else sum(mask[i])
            rows.append(sum(tok[i]) / (d if d > 0 else 1.0))
        return sum(rows) / B / ga
    total = sum(sum(r) for r in tok)
    if loss_type == "bnpo":
        d = sum(w[i][t] * mask[i][t] for i in range(B) for t in range(T)) if sel else sum(map(sum, mask))
        return total / (d if d > 0 else 1.0) / ga
    if loss_type == "dr_grpo":
        return total / (B * L) / ga
    if loss_type == "luspo":
        return sum(sum(r) for r in tok) / B / ga
    d = weight_total if sel else num_items
    return total / ((d if d > 0 else 1.0) * ga / spg)


@pytest.mark.parametrize("seed", range(4))
def test_surrogate_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    got, ratio = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    ref = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28)
    assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(ratio, torch.exp(logp - old))


def test_surrogate_hand_case():
    # r = e^{0.5} ≈ 1.6487 > 1 + 0.28 with A = 1: the clipped branch wins, loss = -1.28.
    # r = e^{-0.5} ≈ 0.6065 < 1 - 0.2 with A = -1: min(-0.6065, -0.8) = -0.8 → loss 0.8.
    logp = torch.tensor([[0.0], [0.0]], dtype=torch.float64)
    old = torch.tensor([[-0.5], [0.5]], dtype=torch.float64)
    loss, _ = clipped_surrogate(logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64), 0.2, 0.28)
    assert loss[:, 0].tolist() == pytest.approx([-1.28, 0.8])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("delta", [None, 1.5, 10.0])
def test_surrogate_with_delta_and_per_sequence_ratio_matches_loop(seed, delta):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp - 2.5 * torch.rand(B, T, generator=g, dtype=torch.float64)  # r up to e^2.5 ≈ 12 > δ
    old[:, ::2] = logp[:, ::2] + 0.3 * torch.randn(B, 4, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0], old[0, 1] = -1.0, logp[0, 1] - 3.0  # r = e³ > δ with A < 0: the cap binds
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[1] = 0
    got, ratio = clipped_surrogate(logp, old, adv, 0.2, 0.28, delta)
    ref = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28, delta)
    assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if delta is not None:
        assert got[0, 1].item() == pytest.approx(delta)
    seq, seq_ratio = clipped_surrogate(logp, old, adv, 0.2, 0.28, delta, level="sequence", mask=mask)
    assert seq.shape == (B, 1) and seq_ratio.shape == (B, 1)
    ref = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28, delta, mask=mask.tolist())
    assert torch.allclose(seq.expand(B, T), torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert seq_ratio[1].item() == 1.0  # a row without valid tokens: mean log-ratio 0


def test_surrogate_delta_hand_cases():
    """δ = 10, ε 0.2/0.28. Worked by hand, with d/d(log π) of the loss:
    r = e³ ≈ 20.09, A = −1: TRL's min(min(r, δ)·A, clip(r)·A) = min(−10, −1.28) = −10 → loss 10, gradient 0
        (without δ: loss and gradient r ≈ 20.09).
    r = e³, A = +1: min(10, 1.28) = 1.28 → loss −1.28, gradient 0 (δ ≥ 1 + ε_high changes nothing for A > 0).
    r = e^{ln 5} = 5, A = −1: r < δ: min(−5, −1.28) = −5 → loss 5, gradient 5.
    r = e^{0.1} ≈ 1.105, A = −2: inside the clip: loss 2·1.105 = 2.2103, gradient 2.2103."""
    logp = torch.zeros(4, 1, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-3.0], [-3.0], [-math.log(5.0)], [-0.1]], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0, -2.0], dtype=torch.float64)
    loss, ratio = clipped_surrogate(logp, old, adv, 0.2, 0.28, 10.0)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert loss[:, 0].tolist() == pytest.approx([10.0, -1.28, 5.0, 2 * math.exp(0.1)], rel=1e-12)
    assert grad[:, 0].tolist() == pytest.approx([0.0, 0.0, 5.0, 2 * math.exp(0.1)], rel=1e-12)
    assert ratio[0, 0].item() == pytest.approx(math.exp(3.0))
    free, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    (grad_free,) = torch.autograd.grad(free.sum(), logp)
    assert free[0, 0].item() == pytest.approx(math.exp(3.0)) and grad_free[0, 0].item() == pytest.approx(math.exp(3.0))


def test_surrogate_per_sequence_hand_case():
    """GSPO: row log-ratios [0.2, 0.4 | pad] → mean 0.3, r = e^0.3 ≈ 1.3499 > 1.28 with A = 1: clipped,
    loss −1.28 on the row; row 2 with log-ratios [−0.1, −0.3] → r = e^−0.2 ≈ 0.8187, A = −1: inside the
    clip, loss 0.8187."""
    logp = torch.tensor([[0.2, 0.4, 7.0], [-0.1, -0.3, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, ratio = clipped_surrogate(
        logp, torch.zeros_like(logp), torch.tensor([1.0, -1.0]), 0.2, 0.28, level="sequence", mask=mask
    )
    assert ratio[:, 0].tolist() == pytest.approx([math.exp(0.3), math.exp(-0.2)])
    assert loss[:, 0].tolist() == pytest.approx([-1.28, math.exp(-0.2)])
    with pytest.raises(ValueError, match="importance_sampling_level='batch' is not one of token, sequence"):
        clipped_surrogate(logp, logp, torch.ones(2), 0.2, 0.2, level="batch")


def test_token_loss_hand_case_with_delta():
    """`full` on one row of three valid tokens, dapo, β 0, δ 10, ε 0.2/0.28, A = −1 (a [B] advantage):
    log-ratios [3, 0, −0.5] → per-token losses [10 (capped), 1, 0.8 (clip(e^−0.5) = 0.8 > 0.6065)],
    token mean 11.8/3 = 3.9333; gradient w.r.t. log π [0, 1, 0]/3. Without δ: (e³ + 1 + 0.8)/3 = 7.2952."""
    from stare_lab.methods import RuleState, TrainerValues, get_method
    from stare_lab.stats import TokenStats

    logp = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    stats = TokenStats(
        logp=logp.detach(),
        mask=torch.ones(1, 3),
        advantages=torch.tensor([-1.0], dtype=torch.float64),
        group=torch.zeros(1, dtype=torch.long),
        old_logp=torch.tensor([[-3.0, 0.0, 0.5]], dtype=torch.float64),
    )
    values = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=1)
    state = RuleState(trainer=dataclasses.replace(values, delta=10.0))
    loss = token_loss(get_method("full"), stats, state, logp)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(11.8 / 3, rel=1e-12)
    assert grad[0].tolist() == pytest.approx([0.0, 1 / 3, 0.0], abs=1e-15)
    free = token_loss(get_method("full"), stats, RuleState(trainer=values), logp)
    assert free.item() == pytest.approx((math.exp(3.0) + 1.8) / 3, rel=1e-12)


def test_kl_hand_case():
    # ref - logp = 1: e^1 - 1 - 1 = e - 2
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([1.0])).item() == pytest.approx(math.e - 2)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize("normalize", ["valid", "selected", "loss_type"])
@pytest.mark.parametrize("seed", range(3))
def test_aggregate_matches_loop(loss_type, normalize, seed):
    g = torch.Generator().manual_seed(seed)
    B, T, L = 6, 5, 8
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[2] = 0  # a fully masked row
    w = torch.where(torch.rand(B, T, generator=g) > 0.5, torch.rand(B, T, generator=g, dtype=torch.float64) * 2, 0.0)
    w = w * mask
    w[4] = 0  # a row with nothing selected
    kl = torch.rand(B, T, generator=g, dtype=torch.float64)
    num_items, weight_total = torch.tensor(mask.sum().item() * 3), torch.tensor(w.sum().item() * 3)
    agg = Aggregation(loss_type=loss_type, grad_accum=3, steps_per_generation=3, max_completion_length=L)
    for beta in (0.0, 0.1):
        got = aggregate(
            loss, w, mask, agg, normalize=normalize, num_items=num_items, weight_total=weight_total, kl=kl, beta=beta
        )
        ref = ref_aggregate(
            loss.tolist(),
            w.tolist(),
            mask.tolist(),
            loss_type,
            normalize,
            num_items.item(),
            weight_total.item(),
            3,
            3,
            L,
            kl=kl.tolist() if beta else None,
            beta=beta,
        )
        assert got.item() == pytest.approx(ref, rel=1e-12, abs=1e-14)


def test_aggregate_hand_case_dapo_selected():
    # per-token losses [1, 2 | 3, pad], weights [1, 0 | 1, 0]: selected → (1 + 3) / 2 = 2;
    # valid → (1 + 3) / 3 valid tokens = 4/3 (one accumulation window = the whole generation batch).
    loss = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    agg = Aggregation(loss_type="dapo")
    sel = aggregate(
        loss, w, mask, agg, normalize="selected", num_items=torch.tensor(3.0), weight_total=torch.tensor(2.0)
    )
    val = aggregate(loss, w, mask, agg, normalize="valid", num_items=torch.tensor(3.0), weight_total=torch.tensor(2.0))
    assert sel.item() == pytest.approx(2.0) and val.item() == pytest.approx(4 / 3)


def test_unsupported_loss_type_is_one_clear_error():
    with pytest.raises(ValueError, match="loss_type='cispo' is not supported"):
        Aggregation(loss_type="cispo")


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_sort_quantile_equals_torch_quantile(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    for q in (0.0, 0.2, 0.5, 0.8, 1.0):
        assert torch.allclose(quantile(x, q), torch.quantile(x, q))
