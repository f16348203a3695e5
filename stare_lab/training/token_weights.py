"""The rule applied to a batch: the loss inputs the trainer attaches, for every scope (trainer glue, not a rule).

`apply_rule` is the one place a configured rule runs inside training. Scope batch, group and
sequence call it once per generation batch from the rollout policy's statistics, in
`_generate_and_score_completions`; scope "microbatch" calls it once per micro-batch from the
training forward's own statistics, inside `_compute_loss` (TRL's loss slot, `trl_internals.weight_slot`).
Either way it gathers the statistics over ranks (the rule sees every rank's rows, docs/distributed.md
§4), runs the rule once, and returns this rank's loss inputs:

    token_weights       [B, T] float  the rule's weights of this rank's rows
    token_selected      [B, T] float  the rule's selected subset (metrics: entropy of selected tokens)
    token_normalize     0-dim long    index of the rule's normalisation in `NORMALIZE`
    token_weight_total  0-dim float   the weight sum the "selected" denominator uses (trl_loss.loss_weights)

scope "microbatch" runs a rule as the official STARE and 80/20 codes (verl's legacy `dp_actor`)
do: per micro-batch, from the current policy's statistics of the training forward itself, with no
extra forward (docs/pitfalls.md, "scope: microbatch", says where each option differs from them).
- At generation time the rule state gets the step (the rule's seeded draws and schedules move) and
  `step_stats`, the whole generation batch's statistics the rule declares in `step_needs` (STARE's
  H̄ for its gate and adaptive W/M, once per step); the loss inputs are NaN stand-ins
  (`deferred_inputs`), so a loss that read them before its forward would fail loudly.
- In the loss, `microbatch_stats` builds the micro-batch's `TokenStats` from that forward's detached
  log-probs and entropies (temperature-scaled, as TRL's fused head computes them; old/ref log-probs
  from TRL's batch: `MICROBATCH_STATISTICS`) and the rule runs on them. `group` is the row index:
  TRL shuffles rows before splitting, so a micro-batch holds no whole groups.
- ranks "process" (default, the official codes: each GPU selects within its own micro-batch) or
  "gathered" (the micro-batch of every rank, as TRL's `top_entropy_quantile` gathers its quantile).
- aggregation "verl" (default, verl's legacy dp_actor `token-mean`): each micro-batch's loss is its
  own token mean (over valid tokens, or over the weights for normalize "selected") times its share of
  the rows of the optimizer step (1 / gradient_accumulation_steps), `trl_loss.loss_weights`; "trl":
  TRL's loss type aggregation (dapo: the generation batch's token count; "selected": the micro-batch's
  weight sum × micro-batches per generation batch, so the dapo denominator is that micro-batch's count).
A loss-changing rule of this scope (Clip-Cov, KL-Cov) takes the same path: the micro-batch's
statistics, the step, the ranks and the aggregation come from here, not from the rule.

scope "token" (adv_reweight, Lopti, entropy_adv) is a per-token rule computed inside the loss for what
that costs nothing there (TRL's own π_old, the forward's entropy): nothing depends on other rows, so
it runs on the micro-batch alone and the loss keeps TRL's aggregation (the split changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stare_lab.methods.registry import NORMALIZE, Rule, RuleState, TrainerValues
from stare_lab.signals import distributed
from stare_lab.stats import TokenStats

# What the training forward inside the loss gives (logp, entropy) and TRL's batch carries (old, ref).
MICROBATCH_STATISTICS = frozenset({"logp", "entropy", "old_logp", "ref_logp"})


@dataclass
class RuleCall:
    """One rule call: this rank's loss inputs, and the global batch, weights and metrics it came from."""

    inputs: dict[str, Tensor]  # the four loss inputs of the module docstring, this rank's rows
    stats: TokenStats  # the batch the rule saw (every rank's rows)
    weights: Tensor  # [B_global, T] the rule's weights
    selected: Tensor  # [B_global, T] bool, within the valid tokens
    metrics: dict[str, float]


def apply_rule(
    rule: Rule, state: RuleState, local: TokenStats, accelerator, *, gather: bool = True, total_scale: int = 1
) -> RuleCall:
    """The rule once on the global batch of `local` (this rank's TokenStats), or on `local` alone with
    gather=False; `total_scale` multiplies the weight sum (scope "microbatch", `microbatch_total_scale`)."""
    if gather:
        stats, rows = distributed.global_token_stats(local, accelerator)
    else:
        stats, rows = local, (slice(0, local.shape[0]), slice(0, local.shape[1]))
    with distributed.deterministic():
        result = rule(stats, state)
    weights = result.weights.to(local.mask.device)
    selected = (result.selected if result.selected is not None else stats.valid) & stats.valid
    inputs = {
        "token_weights": distributed.local_rows(weights, rows),
        "token_selected": distributed.local_rows(selected, rows).float(),
        "token_normalize": torch.tensor(NORMALIZE.index(result.normalize)),
        "token_weight_total": weights.sum() * total_scale,  # gathered: every rank's rows are in it
    }
    return RuleCall(inputs, stats, weights, selected, result.metrics)


# ---- scope "microbatch" (and "token") --------------------------------------------------------
IN_LOSS_SCOPES = ("microbatch", "token")


def selects_in_loss(rule: Rule, trainer_values: TrainerValues) -> bool:
    """True for a rule configured with scope "microbatch" or "token"; one-line ValueError if it reads more
    than the loss has."""
    scope = getattr(rule.params, "scope", None)
    if scope not in IN_LOSS_SCOPES:
        return False
    extra = rule.needs_for(trainer_values) - MICROBATCH_STATISTICS
    if extra:
        raise ValueError(
            f"rule {rule.name!r}: scope={scope!r} selects from the training forward, which gives "
            f"logp and entropy only, but the rule reads {', '.join(sorted(extra))} "
            f"(use scope batch, group or sequence)"
        )
    return True


def per_token_scope(rule: Rule) -> bool:
    """scope "token": computed in the loss, on the micro-batch alone, under TRL's aggregation."""
    return getattr(rule.params, "scope", None) == "token"


def microbatch_total_scale(ranks: str, num_processes: int, steps_per_generation: int) -> int:
    """Factor on a micro-batch's weight sum so that TRL's dapo "selected" denominator (weight_total /
    processes × accumulation / steps_per_generation) is that micro-batch's weight sum × accumulation
    (aggregation "trl"): the gathered sum spans every rank already, a per-process one does not."""
    return steps_per_generation * (num_processes if ranks == "process" else 1)


def deferred_inputs(mask: Tensor) -> dict[str, Tensor]:
    """Placeholders of the loss inputs, replaced for each micro-batch inside the loss. The weights are NaN
    until then, so a loss that read them before its forward would fail loudly, not train on all tokens."""
    return {
        "token_weights": torch.full(mask.shape, float("nan"), device=mask.device),
        "token_weight_total": torch.tensor(float("nan"), device=mask.device),
        "token_normalize": torch.tensor(NORMALIZE.index("valid")),
        "token_selected": mask.float(),
    }


@torch.no_grad()
def microbatch_stats(
    needs: frozenset[str], inputs: dict, entropies: Tensor, logp: Tensor, process_index: int
) -> TokenStats:
    """This rank's TokenStats of one micro-batch from the training forward's statistics (detached)."""
    mask = inputs["completion_mask"]
    B, T = mask.shape
    lp = logp.detach().float() if "logp" in needs else torch.full((B, T), float("nan"), device=mask.device)
    fields = {}
    if "entropy" in needs:
        fields["entropy"] = entropies.detach().float()
    if "old_logp" in needs:  # TRL's own π_old: its old log-probs, or (none computed) the forward's, detached
        old = inputs.get("old_per_token_logps")
        fields["old_logp"] = old.float() if old is not None else logp.detach().float()
    if "ref_logp" in needs:
        fields["ref_logp"] = inputs["ref_per_token_logps"].float()
    group = process_index * B + torch.arange(B, device=mask.device)
    return TokenStats(logp=lp, mask=mask, advantages=inputs["advantages"], group=group, **fields)


def token_fractions(
    weights: torch.Tensor, mask: torch.Tensor, touched: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] bool trained, [B, T] bool touched) of one micro-batch, the same definition for every rule
    (docs/run_record.md, "Token fractions"):

    trained: valid tokens whose policy term is in the loss, rule weight ≠ 0 (`full`: every valid token);
    touched: valid tokens whose objective differs from `full`'s (PPO's clipped surrogate with weight 1):
        rule weight ≠ 1, or in one of a loss-changing rule's `LossTerms.touched` sets (KL-Cov's penalised
        tokens, DPPO's tokens outside its trust region, CE-GPPO's clipped tokens with their gradient kept).
    The weights are the rule's, before the "selected" normalisation rescales them in TRL's slot.
    """
    valid = mask > 0
    changed = torch.zeros_like(valid)
    for m in touched.values():
        changed = changed | m.bool()
    return valid & (weights != 0), valid & ((weights != 1) | changed)
