"""Archer's dual-token constraints (stare_lab/methods/archer.py) against the loop reference in ref_field.py and
against the official micro-batch loss of wizard-III/ArcherCodeR @8a1785b (its actor's loop body and its
compute_policy_loss, kl_penalty and agg_loss, ported in tests/support/official_field/archer.py): values and
gradients at float64."""

from __future__ import annotations

import math

import pytest
import ref_field as R
import torch
from official_field import archer as off

from stare_lab.methods import archer
from stare_lab.methods.ppo import clipped_surrogate

SCRIPT_BETA = 0.001  # the script's kl_loss_coef; the registered rule takes the trainer's β (archer.py note 7)


def close(a, b, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


class Actor:
    """The official DataParallelPPOActor as its loop body reads it: config (attributes and .get) and the forward."""

    def __init__(self, p: archer.Params, entropy, logp):
        values = {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": p.dual_clip,
            "entropy_coeff": 0,
            "loss_agg_mode": "token-mean",
            "use_kl_loss": True,
            "kl_loss_type": "low_var_kl",
            "kl_loss_coef": p.kl_coef,
            "use_token_entropy_separate": True,
            "token_entropy_quantile": p.q,
            "high_entropy_kl_loss_scale_coef": p.high_kl_coef,
            "low_entropy_clip_ratio_low": p.eps_low_tight,
            "low_entropy_clip_ratio_high": p.eps_high_tight,
            "high_entropy_clip_ratio_low": p.eps_low_wide,
            "high_entropy_clip_ratio_high": p.eps_high_wide,
        }
        self.config = type("Config", (), {**values, "get": lambda self, k, d=None: values.get(k, d)})()
        self._outputs = (entropy, logp)

    def _forward_micro_batch(self, micro_batch, temperature, calculate_entropy):
        return self._outputs


def official(p, lp, old, ref, adv, mask, entropy, monkeypatch):
    """(policy_loss, [pg matrix, k3 matrix]) of the official loop body on one micro-batch."""
    seen, agg = R.capture_loss_mat(off)
    monkeypatch.setattr(off, "agg_loss", agg)
    B, T = lp.shape
    data = {
        "responses": torch.zeros(B, T, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(B, 2, dtype=torch.long), mask.long()], dim=1),
        "old_log_probs": old,
        "advantages": adv,
        "ref_log_prob": ref,
    }
    policy_loss, _, _ = off.micro_batch_policy_loss(Actor(p, entropy, lp), data, temperature=1.0)
    return policy_loss, seen


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"q": 0.0}, "q"),
        ({"q": 1.0}, "q"),
        ({"eps_low_wide": 1.5}, "eps_low_wide"),
        ({"eps_high_tight": -0.1}, "eps_high_tight"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"dual_clip": 1.0}, "dual_clip"),
    ],
)
def test_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        archer.Params(**kwargs)


def test_by_hand():
    # One response, H = [0.1, 0.2, 0.3, 0.4, 0.5]: q = 0.8 quantile at position 0.8·4 = 3.2 → 0.4 + 0.2·0.1 = 0.42;
    # token 4 (H = 0.5) is widened (ε = 0.5, no KL), tokens 0-3 are tight (ε = 0.2) and pay the KL.
    # Token 0: r = 1.4, A = 1, tight: clipped at 1.2 → ℓ = −1.2, gradient 0 (+ KL 0: ref = log π).
    # Token 4: r = 1.4, A = 1, wide: inside 1.5 → ℓ = −1.4, gradient −1.4.
    # Token 1: r = 1, A = 1, π = 0.5, π_ref = 0.25: x = log(π_ref/π) = −log 2, k3 = 1/2 + log 2 − 1 = 0.19315,
    #   dk3/dlog π = −(e^x − 1) = 0.5; κ = β·N/|tight| = 0.001·5/4 = 0.00125:
    #   ℓ = −1 + 0.00125·0.19315, gradient −1 + 0.00125·0.5 = −0.999375.
    H = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]], dtype=torch.float64)
    lp = torch.tensor(
        [[math.log(0.7), math.log(0.5), math.log(0.3), math.log(0.3), math.log(0.7)]], dtype=torch.float64
    )
    lp.requires_grad_(True)
    old = lp.detach().clone()
    old[0, 0] = old[0, 4] = math.log(0.5)
    ref = lp.detach().clone()
    ref[0, 1] = math.log(0.25)
    adv = torch.ones(1, dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.float64)
    widened, penalised = archer.entropy_sets(H, mask, archer.Params(kl_coef=SCRIPT_BETA))
    assert widened.tolist() == [[False, False, False, False, True]] and (penalised == ~widened).all()
    p = archer.Params(kl_coef=SCRIPT_BETA)
    val, grad = R.value_and_grad(archer.per_token_loss(lp, old, ref, adv, mask, H, p), lp, mask)
    k3 = 0.5 + math.log(2) - 1
    close(val, torch.tensor([[-1.2, -1 + 0.00125 * k3, -1.0, -1.0, -1.4]], dtype=torch.float64))
    close(grad, torch.tensor([[0.0, -0.999375, -1.0, -1.0, -1.4]], dtype=torch.float64))
    assert archer.metrics(H, mask, p) == {"rule/widened_frac": 0.2, "rule/penalised_frac": 0.8}


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize(
    "params", [{}, {"q": 0.5, "high_kl_coef": 0.01, "kl_coef": 0.1}, {"dual_clip": 1.5, "eps_low_wide": 0.3}]
)
def test_against_loop_and_official(token_adv, params, monkeypatch):
    p = archer.Params(**{"kl_coef": SCRIPT_BETA, **params})
    for b in R.batches(scale=2.0, token_adv=token_adv):
        lp, old, ref, A, mask, H = b["logp"], b["old"], b["ref"], b["adv"], b["mask"], b["entropy"]
        ours = archer.per_token_loss(lp, old, ref, A, mask, H, p)
        val, grad = R.value_and_grad(ours, lp, mask)
        lists = R.lists(lp), R.lists(old), R.lists(ref), R.token_lists(A, lp), R.valid_lists(mask), R.lists(H)
        tight, wide = (p.eps_low_tight, p.eps_high_tight), (p.eps_low_wide, p.eps_high_wide)
        rv, rg, high = R.ref_archer(*lists, p.q, tight, wide, p.dual_clip, p.kl_coef, p.high_kl_coef)
        close(val, torch.tensor(rv, dtype=torch.float64))
        close(grad, torch.tensor(rg, dtype=torch.float64))
        widened, _ = archer.entropy_sets(H, mask, p)
        assert {tuple(x) for x in torch.nonzero(widened).tolist()} == high
        # the official micro-batch: its pg and k3 matrices exactly, its scalar up to its 1e-8 denominators
        A2 = A[:, None].expand_as(lp).contiguous() if A.dim() == 1 else A
        policy_loss, seen = official(p, lp, old, ref, A2, mask, H, monkeypatch)
        _, penalised = archer.entropy_sets(H, mask, p)
        pg = clipped_surrogate(lp, old, A, *archer.clip_widths(penalised, p), p.dual_clip, clamp_log_ratio=True)
        close(*(R.value_and_grad(m, lp, mask)[0] for m in (pg, seen[0])))
        close(*(R.value_and_grad(m, lp, mask)[1] for m in (pg, seen[0])))
        close(*(R.value_and_grad(m, lp, mask)[0] for m in (archer.k3(lp, ref), seen[1])))
        ours_scalar = (ours * mask).sum() / mask.sum()
        close(ours_scalar, policy_loss, rtol=1e-7, atol=1e-10)
        close(
            torch.autograd.grad(ours_scalar, lp, retain_graph=True)[0],
            torch.autograd.grad(policy_loss, lp)[0],
            rtol=1e-7,
            atol=1e-10,
        )


def test_one_response_per_micro_batch_as_the_official_script(monkeypatch):
    # micro_batch_size_per_gpu = 1: every response is its own micro-batch, so the KL means are per response
    p = archer.Params(kl_coef=SCRIPT_BETA)
    b = next(R.batches(scale=2.0))
    lp, old, ref, A, mask, H = b["logp"], b["old"], b["ref"], b["adv"], b["mask"], b["entropy"]
    for i in range(lp.shape[0]):
        if mask[i].sum() == 0:
            continue  # the official code would divide 0 by 1e-8 there: no loss
        rows = slice(i, i + 1)
        ours = archer.per_token_loss(lp[rows], old[rows], ref[rows], A[rows], mask[rows], H[rows], p)
        ours_scalar = (ours * mask[rows]).sum() / mask[rows].sum()
        A2 = A[rows, None].expand_as(lp[rows]).contiguous()
        policy_loss, _ = official(p, lp[rows], old[rows], ref[rows], A2, mask[rows], H[rows], monkeypatch)
        close(ours_scalar, policy_loss, rtol=1e-7, atol=1e-10)


def test_invert_reads_the_official_masks_by_their_names():
    H = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.float64)
    widened, penalised = archer.entropy_sets(H, mask, archer.Params(invert=True, kl_coef=SCRIPT_BETA))
    assert widened.tolist() == [[True, True, True, True, False]] and penalised.tolist() == [[0, 0, 0, 0, 1]]


def test_empty_row_is_in_neither_set():
    H = torch.rand(2, 3, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    widened, penalised = archer.entropy_sets(H, mask, archer.Params(kl_coef=SCRIPT_BETA))
    assert not widened.any() and penalised.tolist() == [[False] * 3, [True, False, False]]


def test_beta_zero_is_the_official_actor_without_its_kl(monkeypatch):
    """β = 0 is accepted (archer.py note 7, docs/field.md): TRL computes no reference log-probs, the rule's
    loss is its clip part alone, and that is the official actor with use_kl_loss=False (its KL block
    skipped); β_high > 0 without β is refused, in one line."""
    from rule_batches import TRAINER

    from stare_lab.methods import LossBatch, get_method

    rule = get_method("archer")
    rule.check_trainer(TRAINER)  # β = 0: accepted
    with pytest.raises(ValueError, match=r"archer.*high_kl_coef=0.01 needs reference log-probs.*beta > 0"):
        get_method("archer", high_kl_coef=0.01).check_trainer(TRAINER)
    p = rule.effective_params(TRAINER)
    assert p.kl_coef == 0.0
    for b in R.batches(scale=2.0):
        lp, old, A, mask, H = b["logp"], b["old"], b["adv"], b["mask"], b["entropy"]
        if mask.sum() == 0:
            continue
        batch = LossBatch(lp, old, A, mask, H, mask > 0, TRAINER, ref_logp=None)
        terms = rule.loss_terms(batch)
        assert terms.own is None and terms.drops_kl
        ours = (terms.policy * mask).sum() / mask.sum()
        seen, agg = R.capture_loss_mat(off)
        monkeypatch.setattr(off, "agg_loss", agg)
        actor = Actor(p, H, lp)
        actor.config.use_kl_loss = False
        B, T = lp.shape
        data = {
            "responses": torch.zeros(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, 2, dtype=torch.long), mask.long()], dim=1),
            "old_log_probs": old,
            "advantages": A[:, None].expand_as(lp).contiguous(),
        }
        policy_loss, _, _ = off.micro_batch_policy_loss(actor, data, temperature=1.0)
        assert len(seen) == 1, "the official actor adds no KL term without use_kl_loss"
        close(ours, policy_loss, rtol=1e-7, atol=1e-10)
        close(torch.autograd.grad(ours, lp, retain_graph=True)[0], torch.autograd.grad(policy_loss, lp)[0], 1e-7, 1e-10)
