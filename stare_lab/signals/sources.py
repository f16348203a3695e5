"""The source of a generation batch's statistics: the cheapest one that gives them (docs/design.md, "Statistics").

- "none": the rule reads nothing the model computes (full; random without a reference rule).
- "microbatch": scope "microbatch" (stare_lab/training/token_weights.py): selection inside the loss from the
  training forward's own statistics; nothing at generation time. A rule of that scope that reads a
  statistic once per step (`step_needs`: STARE's H̄) takes it from one of the sources below.
- "old_logp_forward": TRL makes a no-grad forward of the rollout policy for its old log-probs
  (num_iterations > 1, or steps_per_generation > gradient_accumulation_steps): that one forward is
  the statistics pass (`statistics_from_old_logp_forward`) and its log-probs are handed to TRL as
  `old_per_token_logps`, so no second forward runs.
- "generation": transformers generates (no vLLM, no continuous batching, no rollout_func, no tools):
  logp, entropy, p², p²·log p, attention entropy and, in one process, JS to the group mean are
  recorded while sampling (signals/generation.py); with several processes JS takes the pass.
- "pass": one no-grad forward after generation (signals.statistics.token_statistics).
docs/pitfalls_signals.md, "Statistics sources", has the table per rule and configuration.

The functions here take values, not the trainer: what TRL does (its old-log-prob forward, which
generator samples) is read off TRL by `stare_lab.training.trl_internals` and passed in by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from stare_lab.stats import STATISTICS

from .generation import GENERATION_STATISTICS
from .statistics import MULTIMODAL_KEYS

MODEL_SOURCES = ("vocab", "group", "attention")


def model_needs(needs: frozenset[str], old_logp_forward: bool) -> frozenset[str]:
    """Of the generation batch's statistics `needs` (the rule's, or for scope "microbatch" those it reads
    once per step), those that need a forward of the rollout policy; logp stands in for an on-policy old_logp
    when TRL makes no old-log-prob forward (`old_logp_forward`: `trl_internals.makes_old_logp_forward`)."""
    out = {n for n in needs if STATISTICS[n].source in MODEL_SOURCES}
    if "old_logp" in needs and not old_logp_forward:
        out.add("logp")  # on-policy: π_old is the rollout policy
    return frozenset(out)


def generation_needs(needs: frozenset[str], old_logp_forward: bool) -> frozenset[str]:
    """What of `model_needs` can be recorded while transformers generates."""
    return frozenset(model_needs(needs, old_logp_forward) & GENERATION_STATISTICS)


def stats_source(
    needs: frozenset[str],
    *,
    selects_in_loss: bool,
    old_logp_forward: bool,
    transformers_generates: bool,
    at_generation: bool,
) -> str:
    """The source of a generation batch's statistics, one of the module docstring's list.

    needs: the statistics of the generation batch; selects_in_loss: the rule runs in the loss (scope
    "microbatch" or "token"); old_logp_forward: TRL makes its no-grad old-log-prob forward;
    transformers_generates: TRL samples with transformers' generate (`trl_internals.generates_with_transformers`);
    at_generation: recording while generating is allowed (`trainer.stats_at_generation`).
    """
    model = model_needs(needs, old_logp_forward)
    if selects_in_loss and not model:
        return "microbatch"
    if not model:
        return "none"
    if old_logp_forward:
        return "old_logp_forward"
    if at_generation and transformers_generates and generation_needs(needs, old_logp_forward):
        return "generation"
    return "pass"


def statistics_from_old_logp_forward(
    statistics: Callable[[dict, frozenset[str]], dict[str, Tensor]],
    needs: frozenset[str],
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    forward_kwargs: dict,
) -> dict[str, Tensor]:
    """TRL's old-log-prob call answered by the statistics pass: `statistics(batch, needs | {"logp"})` of the
    same rows (the caller hands its "logp" to TRL as the old log-probs and keeps the rest)."""
    k = logits_to_keep
    batch = {
        "prompt_ids": input_ids[:, :-k],
        "prompt_mask": attention_mask[:, :-k],
        "completion_ids": input_ids[:, -k:],
        "completion_mask": attention_mask[:, -k:],
    }
    batch.update({key: v for key, v in forward_kwargs.items() if key in MULTIMODAL_KEYS and v is not None})
    return statistics(batch, needs | {"logp"})
