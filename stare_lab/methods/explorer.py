"""explorer: keep the highest ρ of tokens by attention entropy AE ("explorers").

Paper: the anchor/explorer study of attention entropy in RLVR, arXiv 2605.07660.

Equation implemented: w_t = 1[AE_t ≥ τ_{1-ρ}] on valid tokens, τ_{1-ρ} = the (1-ρ) threshold
of AE within the scope unit (AE as in anchor.py); the loss is divided by Σ w.

Deviations and decisions:
1. [secondary] Explorer-only training collapses in 5 of 8 seeds; this arm exists to reproduce
   that asymmetry against `anchor`, not as a recommended method.
2. [ours] Everything else (ρ = 0.2, layers, scope, ties, normalize) as anchor.py, whose Params
   and selection helper this file reuses, so the two arms differ only in direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.anchor import Params as AnchorParams
from stare_lab.methods.anchor import keep_by_ae
from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params(AnchorParams):
    """Same fields and defaults as anchor (ρ = 0.2, middle layer, scope batch, ties topk, selected)."""


@register("explorer", Params, needs={"attn_entropy"}, attn_layers=lambda p: p.layers)
def explorer(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    return keep_by_ae(stats, state, p, rule="explorer", largest=True)
