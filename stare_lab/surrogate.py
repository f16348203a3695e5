"""PPO's clipped surrogate and the k3 KL estimator per token, as TRL 1.16's `_compute_loss` writes them.

The one home of both formulas: `objective.token_loss` (the reference loss) and
`trl_loss.surrogate_change` (the trainer's correction for a rule that replaces the surrogate, which must
cancel TRL's own term exactly) import them from here.
"""

from __future__ import annotations

import torch
from torch import Tensor

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
    *,
    level: str = "token",
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token loss −min(min(r, δ)·A, clip(r, 1−ε_low, 1+ε_high)·A) [B, T] and the ratio r [B, T].

    advantages: [B] or [B, T]. delta: TRL's two-sided clipping (`GRPOConfig.delta`, INTELLECT-2), None: off.
    As TRL writes it, δ caps r in the unclipped branch only, whatever the sign of A: for A < 0 and r > δ
    the loss is δ·|A| with zero gradient (verl's dual clip with c = δ, when δ ≥ 1 + ε_high); for A > 0 the
    cap never wins when δ ≥ 1 + ε_high (clip(r)·A ≤ (1 + ε_high)·A is the smaller branch); with
    δ < 1 + ε_high it would (TRL does not refuse that, and neither do we: the formula is TRL's).
    level: TRL's `importance_sampling_level`; "sequence" (GSPO) takes one ratio per row,
    r = exp(mean over the row's `mask` tokens of log π − log π_old), and the loss and ratio are [B, 1]
    (broadcast by the caller, as TRL's). Padding is left out of that mean by `torch.where` rather than
    TRL's multiplication by the mask, so non-finite padding (the tests' NaN) stays out of it [ours; equal
    on finite inputs].
    """
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level={level!r} is not one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    log_ratio = logp - old_logp
    if level == "sequence":
        if mask is None:
            raise ValueError("importance_sampling_level='sequence' needs the mask (the row mean of log r)")
        kept = torch.where(mask > 0, log_ratio, torch.zeros_like(log_ratio))
        log_ratio = (kept.sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    ratio = coef_1
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages), ratio


def kl_penalty(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1."""
    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
