"""Token weights composed with TRL's own GRPO loss (TRL 1.16): the tensors that go into TRL's loss and,
for a rule that changes the loss, the term added to it.

The trainer's loss is `GRPOTrainer._compute_loss` itself with the rule's weights in TRL's per-token mask
slot: when `top_entropy_quantile < 1`, TRL multiplies `per_token_loss` by
`self.get_high_entropy_mask(entropies, mask, threshold)`. `trl_internals.weight_slot` arms that slot
for one call (the only place that touches TRL's private methods, with the inventory of every such
place and the test that notices a TRL change); this module computes what goes into it: the weights
rescaled for the rule's normalisation (`loss_weights`) and, for a loss-changing rule, the per-token
term added to TRL's loss (`surrogate_change`, `trl_aggregate`, `own_term`). So every loss TRL computes (the
clipped surrogate, cispo, sapo, luspo, vespo, sequence-level importance sampling, the off-policy
mask, the vLLM importance-sampling ratio, β·KL, the entropy bonus, the MoE router aux loss, the
multimodal forward) is TRL's own, and a TRL upgrade changes ours with it.

Where the slot sits in TRL 1.16 `_compute_loss` (docs/trl_parity.md has the full table):
    per_token_loss = <loss type's term>      # clipped surrogate | cispo | sapo | vespo; GSPO's sequence ratio
    per_token_loss *= off_policy_mask        # (B, 1)
    per_token_loss *= slot                   # ← our weights [B, T]
    per_token_loss *= vllm_is_ratio          # the vLLM correction multiplies after the weights
    per_token_loss += β · per_token_kl       # KL stays on every valid token
    loss = aggregate(per_token_loss · mask)  # the loss type's own denominator (token counts of `mask`)
    loss -= coef · H(mask · slot)            # the entropy bonus acts on the weighted tokens
    loss += router_aux_loss_coef · aux_loss  # every rule pays the MoE aux loss
Because the weights multiply the per-token loss before aggregation, normalize="valid" (and
"loss_type") is TRL's aggregation unchanged. normalize="selected" replaces token counts by weight
sums in the loss type's denominator; `selected_scale` expresses that as a constant factor on the
weights (per generation batch, micro-batch or row, depending on the loss type).

What is TRL's and what this module computes as TRL does. The loss is always TRL's `_compute_loss`,
called, not rewritten; this module touches no private member of TRL. Two things are computed here from
TRL 1.16's formulas, because TRL has no place that takes them:
- the factors that turn TRL's denominators into weight sums or into verl's per-micro-batch token mean
  (`selected_scale`, `verl_scale`): to divide by what TRL divides by, they form TRL's denominators as
  `_compute_loss` forms them (the classes of stare_lab/methods/loss_types.py);
- for a loss-changing rule (registry `loss=`), its policy term enters as a difference, since TRL has no
  slot for a per-token term of a rule's own: TRL's loss is left as it is, and the TRL aggregation of
  (ℓ_rule − ℓ_PPO)·opm·slot·is (minus β·kl for `drops_kl`) is added (`surrogate_change`, `trl_aggregate`;
  a term with its own denominator is added beside it, `own_term`). That needs PPO's clipped term ℓ_PPO
  (with TRL's two-sided `delta`: `surrogate.clipped_surrogate`) and TRL's aggregation per loss type
  (`surrogate.aggregate_tokens`) computed again here. The two PPO terms cancel to float rounding, not to
  the bit: such a rule's loss equals the rule's loss written out (`objective.token_loss`) to rounding
  (tests/training/test_loss_rules.py). `full` and every rule that only weights tokens never take this
  path, so their loss is TRL's to the bit.
Why a difference instead of a loss of our own for such a rule: added to TRL's loss, the rule's term gets
everything TRL applies to PPO's (the off-policy mask, the vLLM ratio, β·KL, the entropy bonus, the MoE aux
loss, every loss type's denominator) from TRL itself; a loss written here would copy each of them. Every
formula above is read from `_compute_loss`, row 2 of `trl_internals`' inventory, whose source hash makes
a TRL change fail tests/training/test_trl_internals.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stare_lab.methods.loss_types import (
    GENERATION_BATCH_DENOMINATOR,
    MICRO_BATCH_DENOMINATOR,
    NO_TOKEN_DENOMINATOR,
    PER_ROW_DENOMINATOR,
)
from stare_lab.methods.registry import NORMALIZE, LossTerms
from stare_lab.methods.surrogate import aggregate_tokens, clipped_surrogate, kl_penalty
from stare_lab.training import trl_internals


def loss_mask(inputs: dict) -> Tensor:
    """The mask TRL aggregates with: completion tokens, minus tool-output tokens when tools ran. [B, T]"""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def selected_scale(loss_type: str, weights: Tensor, mask: Tensor, num_items: Tensor, weight_total: Tensor) -> Tensor:
    """Factor c with TRL's denominator(mask) / c = the same denominator with counts replaced by weight sums.

    weights, mask: [B, T] of one micro-batch; num_items: the generation batch's valid-token count over
    all ranks (TRL's `num_items_in_batch`); weight_total: the generation batch's weight sum over all
    ranks. Returns a 0-dim tensor, or [B, 1] for the per-row loss types (grpo, sapo).
    A denominator of 0 (nothing selected) gives c = 0: the weights are all 0 there anyway.
    """
    m = mask.float()
    if loss_type in GENERATION_BATCH_DENOMINATOR:
        counts, sums = num_items.float().clamp(min=1.0), weight_total.float()
    elif loss_type in MICRO_BATCH_DENOMINATOR:  # TRL's bnpo divides by the micro-batch's (local) token count
        counts, sums = m.sum().clamp(min=1.0), (weights * m).sum()
    elif loss_type in PER_ROW_DENOMINATOR:
        counts, sums = m.sum(-1, keepdim=True).clamp(min=1.0), (weights * m).sum(-1, keepdim=True)
    elif loss_type in NO_TOKEN_DENOMINATOR:
        return torch.ones((), device=weights.device)
    else:
        raise ValueError(f"loss_type={loss_type!r}: no 'selected' normalisation is defined for it")
    return torch.where(sums > 0, counts / torch.where(sums > 0, sums, torch.ones_like(sums)), torch.zeros_like(sums))


def loss_weights(trainer: trl_internals.GRPOSteps, inputs: dict, normalize: str, aggregation: str = "trl") -> Tensor:
    """The tensor to put in TRL's slot: the rule's weights, rescaled for normalize="selected", or for
    aggregation="verl" (scope microbatch: `verl_scale`). [B, T]"""
    weights = inputs["token_weights"]
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize={normalize!r} is not one of {', '.join(NORMALIZE)}")
    if aggregation == "verl" and trainer.loss_type in GENERATION_BATCH_DENOMINATOR:
        return weights * verl_scale(trainer, weights, loss_mask(inputs), inputs["num_items_in_batch"], normalize)
    if normalize in ("valid", "loss_type"):
        return weights
    scale = selected_scale(
        trainer.loss_type, weights, loss_mask(inputs), inputs["num_items_in_batch"], inputs["token_weight_total"]
    )
    return weights * scale


def verl_scale(
    trainer: trl_internals.GRPOSteps, weights: Tensor, mask: Tensor, num_items: Tensor, normalize: str
) -> Tensor:
    """Factor c with TRL's generation-batch denominator / c = verl's legacy dp_actor token-mean of this micro-batch.

    verl (`dp_actor.update_policy` with `agg_loss(..., "token-mean")`): each micro-batch's loss is
    Σ(ℓ·w·m) / D_micro × loss_scale_factor, D_micro = Σ m (Σ w·m for "selected", the 80/20 code's
    `response_mask * entropy_top_mask`), loss_scale_factor = its share of the optimizer step's rows
    (1 / gradient_accumulation_steps; rows / mini-batch rows with dynamic batch sizes, the same for
    TRL's equal micro-batches). TRL's dapo/cispo/vespo divide by num_items / processes × accumulation
    / steps_per_generation (train), num_items / processes (eval). bnpo, grpo and sapo already
    aggregate per micro-batch as verl's token-mean / seq-mean-token-mean do, dr_grpo and luspo have
    no token count: there "verl" is TRL's aggregation. A micro-batch with D_micro = 0 gives c = 0.
    """
    m = mask.float()
    d = (weights * m).sum() if normalize == "selected" else m.sum()
    trl_denominator = num_items.float().clamp(min=1.0) / trainer.accelerator.num_processes
    if trainer.model.training:
        trl_denominator = trl_denominator * trainer.current_gradient_accumulation_steps / trainer.steps_per_generation
        d = d * trainer.current_gradient_accumulation_steps
    return torch.where(d > 0, trl_denominator / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))


def gradient_geometry(
    trainer: trl_internals.GRPOSteps, model, inputs: dict, weighted_loss: Tensor
) -> tuple[float, float]:
    """Cosine and norm ratio of the weighted loss's gradient against plain TRL's on the same micro-batch.

    The full-token loss is TRL's loss with the completion mask in the slot (a second forward, whose
    metrics and controller updates are undone). Both gradients include the terms TRL adds to every
    loss (β·KL, the entropy bonus, the MoE aux loss).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    with trl_internals.loss_side_effects_undone(trainer):
        full_loss = trl_internals.weighted_trl_loss(trainer, model, inputs, inputs["completion_mask"])
    g_w = torch.autograd.grad(weighted_loss, params, retain_graph=True, allow_unused=True)
    g_f = torch.autograd.grad(full_loss, params, allow_unused=True)
    # float64: a float32 cosine of two equal million-entry vectors is off by ~1e-4
    flat_w = torch.cat(
        [(g if g is not None else torch.zeros_like(p)).double().flatten() for g, p in zip(g_w, params, strict=True)]
    )
    flat_f = torch.cat(
        [(g if g is not None else torch.zeros_like(p)).double().flatten() for g, p in zip(g_f, params, strict=True)]
    )
    norm_f = flat_f.norm()
    if norm_f == 0:
        return float("nan"), float("nan")
    return (flat_w @ flat_f / (flat_w.norm() * norm_f)).item(), (flat_w.norm() / norm_f).item()


# ---- a rule that changes the loss (registry `loss=`): its terms added to TRL's own loss ---------------
def surrogate_change(
    trainer: trl_internals.GRPOSteps, inputs: dict, logp: Tensor, slot: Tensor, terms: LossTerms
) -> Tensor:
    """[B, T] the per-token term whose TRL aggregation, added to TRL's loss with `slot` in its weight slot,
    puts the rule's policy term in place of TRL's clipped surrogate (and, for `drops_kl`, removes TRL's β·KL).

    TRL's per-token loss is ℓ_PPO·opm·slot·is + β·kl and every loss type aggregates it linearly with
    denominators that do not depend on it, so TRL(slot) + agg((ℓ_rule − ℓ_PPO)·opm·slot·is − β·kl)
    = agg(ℓ_rule·opm·slot·is [+ β·kl]) with TRL's own denominator, off-policy mask (opm), vLLM IS ratio
    (is), entropy bonus and MoE aux loss. ℓ_PPO is recomputed here as TRL computes it (with its
    two-sided clipping `delta`); the two copies cancel to float rounding (tests/training/test_loss_rules.py).
    """
    mask = loss_mask(inputs)
    old = inputs.get("old_per_token_logps")
    old = logp.detach() if old is None else old
    advantages = inputs["advantages"]
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ppo, ratio = clipped_surrogate(logp, old, advantages, trainer.epsilon_low, trainer.epsilon_high, trainer.args.delta)
    change = terms.policy - ppo
    if trainer.off_policy_mask_threshold is not None:  # TRL's own mask, with TRL's arguments
        change = change * trainer.get_off_policy_mask(
            advantages=advantages,
            per_token_logps=logp,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
            mask=mask,
            off_policy_threshold=trainer.off_policy_mask_threshold,
        )
    change = change * slot
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction and trainer.loss_type != "vespo":
        change = change * inputs["importance_sampling_ratio"]
    if terms.drops_kl and trainer.beta != 0.0:
        kl = kl_penalty(logp, inputs["ref_per_token_logps"])
        if trainer.args.use_bias_correction_kl:
            kl = kl * ratio
        change = change - trainer.beta * kl
    return change


def trl_aggregate(trainer: trl_internals.GRPOSteps, per_token: Tensor, inputs: dict) -> Tensor:
    """TRL 1.16's aggregation of a per-token loss [B, T] for `trainer.loss_type` with this trainer's
    accumulation and processes (`surrogate.aggregate_tokens`: the loss type's denominator of `mask`'s token
    counts; eval: no accumulation, as TRL's)."""
    mask = loss_mask(inputs)
    training = trainer.model.training
    return aggregate_tokens(
        per_token * mask,
        mask,
        trainer.loss_type,
        accumulation=trainer.current_gradient_accumulation_steps if training else 1.0,
        max_completion_length=trainer.max_completion_length,
        generation_total=inputs.get("num_items_in_batch"),
        num_processes=trainer.accelerator.num_processes,
        steps_per_generation=trainer.steps_per_generation if training else 1,
    )


def own_term(trainer: trl_internals.GRPOSteps, terms: LossTerms) -> Tensor | float:
    """The rule's term with its own denominator, scaled for gradient accumulation as TRL's entropy bonus."""
    if terms.own is None:
        return 0.0
    return terms.own / (trainer.current_gradient_accumulation_steps if trainer.model.training else 1.0)


def refusals(trainer: trl_internals.GRPOSteps) -> list[str]:
    """TRL features that do not compose with token weights, each with its one-line reason."""
    problems = []
    if trainer.top_entropy_quantile < 1.0:
        problems.append("top_entropy_quantile < 1: its mask slot carries the token weights (use method=top_entropy)")
    if getattr(trainer, "tools", None):
        problems.append(
            "tools: the statistics pass does not yet apply TRL's tool_mask, so a rule would "
            "select tool-output tokens and count them in the 'selected' denominator"
        )
    return problems
