"""scope "microbatch": a rule selects inside the loss, per micro-batch, from the training forward's own statistics.

The official STARE and 80/20 codes (and TRL's `top_entropy_quantile`) take their thresholds per
micro-batch from the current policy's entropies of the training forward itself, with no extra
forward. With `scope="microbatch"` a rule does the same: at generation time nothing is computed
(`defer_to_loss` attaches NaN weights that the loss overwrites), and the first forward inside `_compute_loss` calls
`microbatch_weights`, which builds `TokenStats` of the micro-batch from that forward's detached
log-probs and entropies (temperature-scaled, as TRL's fused head computes them), gathers them over
ranks (the rule sees the micro-batch of every rank, like TRL's gathered quantile), runs the rule
(selection over the micro-batch as scope "batch" does over the generation batch) and writes the
micro-batch's weights. Only rules that read logp, entropy, old_logp or ref_logp can do this.

Normalisation "selected": each micro-batch is averaged over its own selected tokens (the official
codes' token-mean), so `token_weight_total` = the micro-batch's global weight sum × the micro-batches
per generation batch, which makes objective.aggregate's dapo denominator that micro-batch's count.
Rule state (STARE's W, M, gate) advances once per micro-batch. `group` is the row index: TRL shuffles
rows before splitting, so a micro-batch holds no whole groups.
"""

from __future__ import annotations

import torch

from stare_lab import distributed
from stare_lab.stats import TokenStats

MICROBATCH_STATISTICS = frozenset({"logp", "entropy", "old_logp", "ref_logp"})


def check_microbatch_scope(rule, trainer_values) -> bool:
    """True for a rule configured with scope="microbatch"; one-line ValueError if it reads more than the loss has."""
    if getattr(rule.params, "scope", None) != "microbatch":
        return False
    extra = rule.needs_for(trainer_values) - MICROBATCH_STATISTICS
    if extra:
        raise ValueError(
            f"rule {rule.name!r}: scope='microbatch' selects from the training forward, which gives "
            f"logp and entropy only, but the rule reads {', '.join(sorted(extra))} "
            f"(use scope batch, group or sequence)"
        )
    return True


def defer_to_loss(trainer, out: dict) -> dict:
    """Placeholders of the loss inputs; `microbatch_weights` replaces them for each micro-batch. The weights
    are NaN until then, so a loss that read them before its forward would fail loudly, not train on all tokens."""
    from stare_lab.trainer import NORMALIZE_CODES

    mask = out["completion_mask"]
    out["token_weights"] = torch.full(mask.shape, float("nan"), device=mask.device)
    out["token_weight_total"] = torch.tensor(float("nan"), device=mask.device)
    out["token_normalize"] = torch.tensor(NORMALIZE_CODES.index("valid"))
    out["token_selected"] = mask.float()
    return out


@torch.no_grad()
def microbatch_stats(trainer, inputs: dict, entropies, logp) -> TokenStats:
    """This rank's TokenStats of one micro-batch from the training forward's statistics (detached)."""
    mask = inputs["completion_mask"]
    B, T = mask.shape
    needs = trainer.rule.needs_for(trainer.trainer_values)
    lp = logp.detach().float() if "logp" in needs else torch.full((B, T), float("nan"), device=mask.device)
    fields = {}
    if "entropy" in needs:
        fields["entropy"] = entropies.detach().float()
    if "old_logp" in needs:
        old = inputs.get("old_per_token_logps")
        fields["old_logp"] = old.float() if old is not None else lp
    if "ref_logp" in needs:
        fields["ref_logp"] = inputs["ref_per_token_logps"].float()
    group = trainer.accelerator.process_index * B + torch.arange(B, device=mask.device)
    return TokenStats(logp=lp, mask=mask, advantages=inputs["advantages"], group=group, **fields)


def microbatch_weights(trainer, inputs: dict, entropies, logp) -> None:
    from stare_lab.trainer import NORMALIZE_CODES

    local = microbatch_stats(trainer, inputs, entropies, logp)
    stats, rows = distributed.global_token_stats(local, trainer.accelerator)
    with distributed.deterministic():
        result = trainer.rule(stats, trainer.rule_state)
    mask = inputs["completion_mask"]
    weights = result.weights.to(mask.device)
    selected = (result.selected if result.selected is not None else stats.valid) & stats.valid
    training = trainer.model.training
    inputs["token_weights"] = distributed.local_rows(weights, rows)
    inputs["token_selected"] = distributed.local_rows(selected, rows).float()
    inputs["token_normalize"] = torch.tensor(NORMALIZE_CODES.index(result.normalize))
    inputs["token_weight_total"] = weights.sum() * (trainer.args.steps_per_generation if training else 1)
    trainer._log_rule_metrics("train" if training else "eval", stats, weights, selected.float(), result.metrics, None)
