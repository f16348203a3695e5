"""The loss: what one micro-batch back-propagates, the rule's weights included (docs/design.md, "The loss").

- `trainer_loss` is the trainer's loss: TRL's own `GRPOTrainer._compute_loss` with the rule's weights
  in TRL's per-token mask slot (`stare_lab/training/trl_internals.py`, docs/trl_parity.md), so every TRL loss type
  and term composes, and with weights equal to the mask it is plain TRL to the bit.
- `token_loss(rule, stats, state, logp)` is the same loss written out over tensors for one micro-batch
  of one process (the loss types whose policy term is PPO's clipped surrogate: grpo, bnpo, dr_grpo, dapo,
  luspo): the contract tests and users rely on, and the independent reference the invariant, distributed
  and micro-batch tests compare against (`clipped_surrogate`, `kl_penalty`, `aggregate`). It reads every
  trainer value a rule sees (`TrainerValues`): ε_low, ε_high, β, the loss type, TRL's two-sided clipping
  `delta` and `importance_sampling_level` (GSPO's per-sequence ratio), so that it equals the trainer's
  loss for each of them (tests/methods/test_dual_clip.py); cispo, sapo and vespo (surrogates of their own) are
  refused with one line.

Normalisation (docs/pitfalls.md, Normalisation):
- "loss_type" / "valid": the loss type's own denominator (token counts of valid tokens); an
  unselected token contributes 0 to the numerator and still counts in the denominator.
- "selected": the same denominator with token counts replaced by sums of weights. For `dapo`
  the weight sum spans the whole generation batch (all ranks), computed once at generation
  time, so the loss does not depend on how the batch is split into micro-batches. `dr_grpo`'s
  denominator is a constant (B·max_completion_length) and `luspo` has none (a row's token sum, mean
  over rows), so "selected" equals "valid" there.
The weights multiply the clipped policy term only; the KL penalty (β > 0) stays on every valid
token [ours]. (Here the KL term shares the "selected" denominator; in the trainer, TRL's slot
divides it by TRL's own valid-token denominator: the two agree whenever β = 0 or normalize ≠
"selected".) A rule that changes the loss (`Rule.changes_loss`, registry `loss=`) gives its own
per-token policy term in place of the clipped surrogate (weighted and aggregated as it), and may add
a term with its own denominator in place of the KL (`LossTerms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stare_lab.methods.loss_types import GENERATION_BATCH_DENOMINATOR, PPO_SURROGATE
from stare_lab.methods.registry import NORMALIZE, LossBatch, LossTerms, Rule, RuleState
from stare_lab.methods.surrogate import aggregate_tokens, clipped_surrogate, kl_penalty
from stare_lab.stats import TokenStats

__all__ = [
    "Aggregation",
    "aggregate",
    "aggregate_tokens",
    "clipped_surrogate",
    "kl_penalty",
    "token_loss",
    "trainer_loss",
]


@dataclass(frozen=True)
class Aggregation:
    """What the denominator of each loss type needs besides the micro-batch itself."""

    loss_type: str = "dapo"
    grad_accum: int = 1  # gradient accumulation steps (1 in eval)
    steps_per_generation: int = 1  # micro-batches per generation batch on one rank
    num_processes: int = 1
    max_completion_length: int = 1  # dr_grpo's constant denominator

    def __post_init__(self) -> None:
        if self.loss_type not in PPO_SURROGATE:  # token_loss computes PPO's clipped surrogate
            raise ValueError(f"loss_type={self.loss_type!r} is not supported; use one of {', '.join(PPO_SURROGATE)}")


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
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize={normalize!r} is not one of {', '.join(NORMALIZE)}")
    selected = normalize == "selected"
    loss = per_token_loss * weights
    if beta != 0.0:
        if kl is None:
            raise ValueError("beta != 0 needs the per-token kl")
        loss = loss + beta * kl
    total = weight_total if selected else num_items
    if agg.loss_type in GENERATION_BATCH_DENOMINATOR and total is None:
        raise ValueError(f"loss_type={agg.loss_type!r} needs {'weight_total' if selected else 'num_items'}")
    return aggregate_tokens(
        loss * mask,
        weights * mask if selected else mask,
        agg.loss_type,
        accumulation=agg.grad_accum,
        max_completion_length=agg.max_completion_length,
        generation_total=total,
        num_processes=agg.num_processes,
        steps_per_generation=agg.steps_per_generation,
    )


def token_loss(
    rule: Rule, stats: TokenStats, state: RuleState, logp: Tensor, *, max_completion_length: int = 0
) -> Tensor:
    """The scalar loss one micro-batch back-propagates, taken as a whole step of one process (docs/design.md).

    logp: [B, T] current log-probs with grad. The rule runs on `stats` (for a rule of scope "microbatch":
    the micro-batch's own, from the current policy, detached); `stats.old_logp` None means on-policy
    (π_old = sg π, TRL's choice), `stats.ref_logp` is read when β > 0. `state.trainer` gives the loss type,
    ε, β, TRL's two-sided clipping δ (`delta`: r capped at δ in the unclipped branch, as TRL's
    `_compute_loss`) and the importance-sampling level (per token, or GSPO's per sequence).
    max_completion_length: dr_grpo's constant (0: the batch's T). For `full` this equals TRL's
    `_compute_loss` on the same micro-batch with one micro-batch per step (tests/training/test_objective.py); for
    every registered rule the trainer's loss equals it (tests/training/test_loss_rules.py). A loss-changing rule's
    `loss` reads `stats.entropy` as the current policy's entropy (NaN where not given) and the rule's
    `selected` tokens; its policy term replaces the clipped surrogate, its `own` term is added once, and
    with `drops_kl` the β·KL term is left out.
    """
    values = state.trainer
    if values is None:
        raise ValueError("token_loss needs state.trainer (TrainerValues: loss type, clip ε, β)")
    out = rule(stats, state)
    old = stats.old_logp if stats.old_logp is not None else logp.detach()
    mask = stats.mask
    terms: LossTerms | None = None
    if rule.changes_loss:
        entropy = stats.entropy if stats.entropy is not None else torch.full_like(mask, float("nan"))
        selected = out.selected if out.selected is not None else stats.valid
        batch = LossBatch(logp, old, stats.advantages, mask, entropy, selected, values, stats.ref_logp)
        terms = rule.loss_terms(batch)
        per_token = terms.policy
    else:
        per_token, _ = clipped_surrogate(
            logp,
            old,
            stats.advantages,
            values.epsilon_low,
            values.epsilon_high,
            values.delta,
            level=values.importance_sampling_level,
            mask=mask,
        )
    beta = 0.0 if terms is not None and terms.drops_kl else values.beta
    kl = kl_penalty(logp, stats.need("ref_logp", rule=rule.name)) if beta != 0.0 else None
    agg = Aggregation(loss_type=values.loss_type, max_completion_length=max_completion_length or mask.size(1))
    loss = aggregate(
        per_token,
        out.weights,
        mask,
        agg,
        normalize=out.normalize,
        num_items=mask.sum(),
        weight_total=(out.weights * mask).sum(),
        kl=kl,
        beta=beta,
    )
    if terms is not None and terms.own is not None:
        loss = loss + terms.own
    return loss


def trainer_loss(trainer, model, inputs: dict, weights=None, on_entropies=None) -> Tensor:
    """The trainer's loss of one micro-batch: TRL's `_compute_loss` with the rule's weights in its slot.

    weights: None, the batch's `token_weights` (from generation time) rescaled for its normalisation
    (`trl_loss.loss_weights`); or a callable `(logp, entropies) -> [B, T]` evaluated right after TRL's
    forward (scope "microbatch"). on_entropies(entropies, mask): sees the forward's entropies (metrics).
    """
    from stare_lab.training import (  # deferred: trl (the tensor-level functions above need none of it)
        trl_internals,
        trl_loss,
    )

    if weights is None:
        weights = trl_loss.loss_weights(trainer, inputs, NORMALIZE[int(inputs["token_normalize"])])
    return trl_internals.weighted_trl_loss(trainer, model, inputs, weights, on_entropies=on_entropies)
