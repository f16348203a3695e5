"""The source of a generation batch's statistics: the cheapest one that gives them (docs/design.md, "Statistics").

- "none": the rule reads nothing the model computes (full; random without a reference rule).
- "microbatch": scope "microbatch" (stare_lab/token_weights.py): selection inside the loss from the
  training forward's own statistics; nothing at generation time. A rule of that scope that reads a
  statistic once per step (`step_needs`: STARE's H̄) takes it from one of the sources below.
- "old_logp_forward": TRL makes a no-grad forward of the rollout policy for its old log-probs
  (num_iterations > 1, or steps_per_generation > gradient_accumulation_steps): that one forward is
  the statistics pass (`ride_old_logp_forward`) and its log-probs are handed to TRL as
  `old_per_token_logps`, so no second forward runs.
- "generation": transformers generates (no vLLM, no continuous batching, no rollout_func, no tools):
  logp, entropy, p², p²·log p, attention entropy and, in one process, JS to the group mean are
  recorded while sampling (signals/generation.py); with several processes JS takes the pass.
- "pass": one no-grad forward after generation (signals.statistics.token_statistics).
docs/pitfalls_signals.md, "Statistics sources", has the table per rule and configuration.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from stare_lab.stats import STATISTICS

from .generation import GENERATION_STATISTICS
from .statistics import MULTIMODAL_KEYS

MODEL_SOURCES = ("vocab", "group", "attention")


def trl_makes_old_logp_forward(trainer) -> bool:
    """TRL 1.16's own condition (GRPOTrainer._generate_and_score_completions) for its old-log-prob forward."""
    a = trainer.args
    generate_every = a.steps_per_generation * trainer.num_iterations
    return a.gradient_accumulation_steps % generate_every != 0 or bool(
        trainer.use_vllm and trainer.vllm_importance_sampling_correction
    )


def model_needs(trainer) -> frozenset[str]:
    """The statistics of the generation batch (`trainer.batch_needs`: the rule's, or for scope "microbatch"
    those it reads once per step) that need a forward of the rollout policy (logp stands in for an on-policy
    old_logp)."""
    needs = trainer.batch_needs
    out = {n for n in needs if STATISTICS[n].source in MODEL_SOURCES}
    if "old_logp" in needs and not trl_makes_old_logp_forward(trainer):
        out.add("logp")  # on-policy: π_old is the rollout policy
    return frozenset(out)


def transformers_generation(trainer) -> bool:
    return not (
        trainer.use_vllm
        or getattr(trainer, "use_transformers_continuous_batching", False)
        or getattr(trainer, "rollout_func", None) is not None
        or getattr(trainer, "tools", None)
    )


def generation_needs(trainer) -> frozenset[str]:
    return frozenset(model_needs(trainer) & GENERATION_STATISTICS)


def stats_source(trainer) -> str:
    """The source of this trainer's statistics, one of the module docstring's list."""
    if trainer.selects_in_loss and not model_needs(trainer):
        return "microbatch"
    if not model_needs(trainer):
        return "none"
    if trl_makes_old_logp_forward(trainer):
        return "old_logp_forward"
    if trainer.stats_at_generation and transformers_generation(trainer) and generation_needs(trainer):
        return "generation"
    return "pass"


def ride_old_logp_forward(
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
