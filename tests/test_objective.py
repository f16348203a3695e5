"""The surrogate, the KL term and every loss aggregation against slow loop references, plus hand cases."""

from __future__ import annotations

import math

import pytest
import torch

from stare_lab.methods.select import quantile
from stare_lab.objective import Aggregation, aggregate, clipped_surrogate, kl_penalty


def ref_surrogate(logp, old, adv, eps_low, eps_high):
    B, T = len(logp), len(logp[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            r = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(r, 1 - eps_low), 1 + eps_high)
            out[i][t] = -min(r * adv[i], clipped * adv[i])
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


def test_kl_hand_case():
    # ref - logp = 1: e^1 - 1 - 1 = e - 2
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([1.0])).item() == pytest.approx(math.e - 2)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
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
