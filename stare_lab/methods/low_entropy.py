"""low_entropy: keep the lowest ρ of tokens by predictive entropy (a control arm).

Paper: the control of Wang et al., arXiv 2506.01939 (training on the 80% lowest-entropy tokens
hurts), and of the anchor/explorer study, arXiv 2605.07660, which reports that predictive entropy
does not explain its anchor/explorer asymmetry; stare_lab lets a user check that at equal ρ.

Equation implemented: w_t = 1[H_t ≤ τ'_ρ] on valid tokens, τ'_ρ = the ρ threshold of H within
the scope unit; the loss is divided by Σ w (normalize="selected").

Deviations and decisions:
1. [ours] ρ = 0.2 by default so the arm matches top_entropy/anchor/explorer at equal budget
   (the anchor/explorer study compares its controls at equal ρ); the 80/20 paper's own control
   keeps 80%: set rho=0.8 to reproduce that ablation.
2. [ours] scope, ties and normalisation as top_entropy (shared code: `keep_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.top_entropy import Params as TopEntropyParams
from stare_lab.methods.top_entropy import keep_fraction
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params(TopEntropyParams):
    """Same fields and defaults as top_entropy (ρ = 0.2 [ours], scope batch, ties topk, selected)."""


@register("low_entropy", Params, needs={"entropy"})
def low_entropy(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    return keep_fraction(
        stats.need("entropy", rule="low_entropy"), "entropy", stats, state, p, largest=False, salt="low_entropy"
    )
