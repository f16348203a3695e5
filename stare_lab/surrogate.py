"""PPO's clipped surrogate and the k3 KL estimator per token, as TRL 1.16's `_compute_loss` writes them.

The one home of both formulas: `objective.token_loss` (the reference loss) and
`trl_loss.surrogate_change` (the trainer's correction for a rule that replaces the surrogate, which must
cancel TRL's own term exactly) import them from here.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float, eps_high: float, delta: float | None = None
) -> tuple[Tensor, Tensor]:
    """Per-token loss −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A) [B, T] and the ratio r [B, T].

    advantages: [B] or [B, T]. delta: optional upper clamp of r in the unclipped branch (TRL's two-sided clipping).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    ratio = coef_1
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages), ratio


def kl_penalty(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1."""
    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
