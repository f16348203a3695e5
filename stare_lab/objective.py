"""The clipped surrogate, the KL term and loss aggregation with token weights, written out.

The trainer does not call this module: its loss is TRL's own `_compute_loss` with the weights in
TRL's per-token mask slot (`stare_lab/trl_loss.py`, docs/trl_parity.md). This is the explicit
formulation of the same composition for the supported clipped-surrogate loss types (grpo, bnpo,
dr_grpo, dapo), kept as the independent reference that the invariant, distributed and
micro-batch tests compare against; with weights equal to the mask it equals plain TRL bit for
bit (tests/test_objective.py).

Normalisation (docs/pitfalls.md, Normalisation):
- "loss_type" / "valid": the loss type's own denominator (token counts of valid tokens); an
  unselected token contributes 0 to the numerator and still counts in the denominator.
- "selected": the same denominator with token counts replaced by sums of weights. For `dapo`
  the weight sum spans the whole generation batch (all ranks), computed once at generation
  time, so the loss does not depend on how the batch is split into micro-batches. `dr_grpo`'s
  denominator is a constant (B·max_completion_length), so "selected" equals "valid" there.
The weights multiply the clipped policy term only; the KL penalty (β > 0) stays on every valid
token [ours]. (Here the KL term shares the "selected" denominator; in the trainer, TRL's slot
divides it by TRL's own valid-token denominator: the two agree whenever β = 0 or normalize ≠ "selected".)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


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


@dataclass(frozen=True)
class Aggregation:
    """What the denominator of each loss type needs besides the micro-batch itself."""

    loss_type: str = "dapo"
    grad_accum: int = 1  # gradient accumulation steps (1 in eval)
    steps_per_generation: int = 1  # micro-batches per generation batch on one rank
    num_processes: int = 1
    max_completion_length: int = 1  # dr_grpo's constant denominator

    def __post_init__(self) -> None:
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported; use one of {', '.join(SUPPORTED_LOSS_TYPES)}"
            )


def aggregate(
    per_token_loss: Tensor,
    weights: Tensor,
    mask: Tensor,
    agg: Aggregation,
    *,
    normalize: str,
    num_items: Tensor | None = None,
    weight_total: Tensor | None = None,
    kl: Tensor | None = None,
    beta: float = 0.0,
) -> Tensor:
    """Scalar loss of one micro-batch.

    per_token_loss, weights, mask: [B, T]; num_items: global count of valid tokens of the generation
    batch (dapo); weight_total: global sum of weights of the generation batch (dapo, "selected").
    """
    if normalize not in ("valid", "selected", "loss_type"):
        raise ValueError(f"normalize={normalize!r} is not one of valid, selected, loss_type")
    selected = normalize == "selected"
    loss = per_token_loss * weights
    if beta != 0.0:
        loss = loss + beta * kl
    masked = loss * mask
    if agg.loss_type == "grpo":
        denom = (weights * mask).sum(-1) if selected else mask.sum(-1)
        return (masked.sum(-1) / _safe(denom)).mean() / agg.grad_accum
    if agg.loss_type == "bnpo":
        denom = (weights * mask).sum() if selected else mask.sum()
        return masked.sum() / _safe(denom) / agg.grad_accum
    if agg.loss_type == "dr_grpo":
        return masked.sum() / (per_token_loss.size(0) * agg.max_completion_length) / agg.grad_accum
    # dapo: the denominator spans the generation batch, rescaled to one accumulation window
    total = weight_total if selected else num_items
    normalizer = _safe(total) / agg.num_processes * agg.grad_accum / agg.steps_per_generation
    return masked.sum() / normalizer


def _safe(denom: Tensor) -> Tensor:
    """Denominators of 0 (a row or batch with nothing selected) give a loss of 0, not NaN.

    For integer token counts this equals TRL's `clamp(min=1.0)` exactly.
    """
    return torch.where(denom > 0, denom, torch.ones_like(denom)) if torch.is_tensor(denom) else max(denom, 1.0)
