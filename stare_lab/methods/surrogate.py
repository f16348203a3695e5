"""PPO's clipped surrogate and the k3 KL estimator per token, and each loss type's aggregation, as TRL
1.16's `_compute_loss` writes them.

The one home of these formulas: `objective.token_loss` (the reference loss), `trl_loss.surrogate_change`
(the trainer's correction for a rule that replaces the surrogate, which must cancel TRL's own term
exactly) and the field's rules (`stare_lab.methods.ppo.clipped_surrogate`, verl's form: a log-ratio
clamp and a dual clip around this one) import them from here; `aggregate_tokens` is the aggregation of
`objective.aggregate` and `trl_loss.trl_aggregate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stare_lab.methods.loss_types import (
    CONSTANT_DENOMINATOR,
    GENERATION_BATCH_DENOMINATOR,
    MICRO_BATCH_DENOMINATOR,
    PER_ROW_DENOMINATOR,
    ROW_SUM,
)

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float | Tensor,
    eps_high: float | Tensor,
    delta: float | None = None,
    *,
    level: str = "token",
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token loss −min(min(r, δ)·A, clip(r, 1−ε_low, 1+ε_high)·A) [B, T] and the ratio r [B, T].

    advantages: [B] or [B, T]. eps_low, eps_high: floats (TRL's), or tensors (per token, Archer's widths),
    cast to r's dtype before 1 − ε is taken, as verl does. delta: TRL's two-sided clipping
    (`GRPOConfig.delta`, INTELLECT-2), None: off.
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
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

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
    if torch.is_tensor(eps_low) or torch.is_tensor(eps_high):
        low = 1 - torch.as_tensor(eps_low, dtype=coef_1.dtype, device=coef_1.device)
        high = 1 + torch.as_tensor(eps_high, dtype=coef_1.dtype, device=coef_1.device)
        coef_2 = torch.clamp(coef_1, low, high)
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    ratio = coef_1
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages), ratio


def kl_penalty(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1


def aggregate_tokens(
    x: Tensor,
    counts: Tensor,
    loss_type: str,
    *,
    accumulation: float,
    max_completion_length: int,
    generation_total: Tensor | None = None,
    num_processes: int = 1,
    steps_per_generation: int = 1,
) -> Tensor:
    """TRL 1.16's aggregation of a masked per-token loss x [B, T] for `loss_type` (`_compute_loss` from
    "if self.loss_type in ['grpo', 'sapo']" on): the one home of it, for the reference loss (`aggregate`)
    and the trainer's (`trl_loss.trl_aggregate`).

    counts [B, T]: what each token counts for in a token-count denominator (the mask; weights·mask for
    normalize "selected"); generation_total: the generation batch's count over every rank (dapo, cispo,
    vespo: `num_items_in_batch`, or its weight sum). accumulation: the gradient accumulation steps (1 in
    eval; with steps_per_generation 1 the generation-batch normalizer is then TRL's eval one).
    """
    if loss_type in PER_ROW_DENOMINATOR:
        return (x.sum(-1) / _safe(counts.sum(-1))).mean() / accumulation
    if loss_type in MICRO_BATCH_DENOMINATOR:
        return x.sum() / _safe(counts.sum()) / accumulation
    if loss_type in CONSTANT_DENOMINATOR:
        return x.sum() / (x.size(0) * max_completion_length) / accumulation
    if loss_type in ROW_SUM:  # each row's token sum, mean over rows: no token count ("selected" = "valid")
        return x.sum(-1).mean() / accumulation
    if loss_type in GENERATION_BATCH_DENOMINATOR:  # rescaled to one accumulation window
        if generation_total is None:
            raise ValueError(f"loss_type={loss_type!r} needs the generation batch's total (num_items_in_batch)")
        normalizer = _safe(generation_total) / num_processes * accumulation / steps_per_generation
        return x.sum() / normalizer
    raise ValueError(f"loss_type={loss_type!r}: no aggregation known")


def _safe(denom: Tensor) -> Tensor:
    """Denominators of 0 (a row or batch with nothing selected) give a loss of 0, not NaN.

    For integer token counts this equals TRL's `clamp(min=1.0)` exactly.
    """
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    return torch.where(denom > 0, denom, torch.ones_like(denom)) if torch.is_tensor(denom) else max(denom, 1.0)
