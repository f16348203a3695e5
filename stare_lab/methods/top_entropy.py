"""top_entropy: keep the top ρ of tokens by predictive entropy (the "80/20" rule).

Paper: Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", arXiv 2506.01939.

Equation implemented: with H_t = -Σ_v p_v,t log p_v,t of the rollout policy,
    w_t = 1[H_t ≥ τ_ρ] on valid tokens, τ_ρ = the (1-ρ) threshold of H within the scope unit,
and the loss is divided by Σ w (normalize="selected").

Deviations and decisions:
1. [paper] ρ = 0.2: only the top 20% highest-entropy ("forking") tokens get a gradient.
2. [ours] Threshold taken per generation batch (scope="batch"), from detached statistics,
   before the batch is split; the official code and TRL take it per micro-batch [code]
   (docs/pitfalls.md, Selection). `scope` may be "group" or "sequence", or "microbatch": the
   official code's `get_global_entropy_top_mask` per micro-batch (per process by default) on the
   training forward's entropies, the loss a token mean over the micro-batch's selected tokens ×
   its share of the step's rows (docs/pitfalls.md, "scope: microbatch"). There the official k is
   `max(1, int(ρ·n + 0.9999))`, ours ⌈ρ·n⌉ (they differ when ρ·n is within 1e-4 above an integer),
   and its ties fall as `torch.topk` orders them, ours by the seeded keys of note 3.
3. [ours] ties="topk" keeps exactly ⌈ρ·n⌉ tokens, ties broken by a seeded random order;
   ties="quantile" keeps every token with H ≥ torch.quantile(H, 1-ρ) (TRL's behaviour).
4. [paper] normalize="selected": the paper averages the loss over the kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common, check_fraction, select_top, selection_metrics
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor


@dataclass(frozen=True)
class Params:
    rho: float = 0.2  # 80/20 §4: the top 20% of tokens by entropy
    scope: str = "batch"  # [ours]; the official code: per micro-batch
    ties: str = "topk"  # [ours] exact ⌈ρ·n⌉; "quantile" = TRL's top_entropy_quantile
    normalize: str = "selected"  # 80/20: loss averaged over the selected tokens

    def __post_init__(self) -> None:
        check_fraction("rho", self.rho)
        check_common(self)


def keep_fraction(
    score: Tensor, score_name: str, stats: TokenStats, state: RuleState, p, *, largest: bool, salt: str
) -> RuleOutput:
    """Weight 1 on the top (largest) or bottom fraction p.rho of `score` per scope unit, 0 elsewhere.

    Shared by top_entropy, low_entropy, anchor and explorer so the four differ only in their score
    and direction. The tie-break generator is salted with the rule name: two rules on one batch
    break ties independently, one rule on one batch always identically.
    """
    valid = stats.valid
    sel = select_top(
        score, valid, stats.group, p.rho, scope=p.scope, ties=p.ties, largest=largest, generator=state.generator(salt)
    )
    metrics = selection_metrics("rule/", sel, valid)
    n_valid, n_sel = int(valid.sum()), int(sel.sum())
    # Mean score of all valid vs kept tokens: lets a control arm show how far the subsets differ.
    metrics[f"rule/{score_name}_mean"] = float(score[valid].float().mean()) if n_valid else 0.0
    metrics[f"rule/{score_name}_kept_mean"] = float(score[sel].float().mean()) if n_sel else 0.0
    return RuleOutput(weights=sel.float(), normalize=p.normalize, metrics=metrics, selected=sel)


@register("top_entropy", Params, needs={"entropy"})
def top_entropy(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    entropy = stats.need("entropy", rule="top_entropy")
    return keep_fraction(entropy, "entropy", stats, state, p, largest=True, salt="top_entropy")
