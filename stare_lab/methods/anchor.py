"""anchor: keep the lowest ρ of tokens by attention entropy AE ("anchors").

Paper: the anchor/explorer study of attention entropy in RLVR, arXiv 2605.07660.

Equation implemented (AE itself is computed by the statistics pass, signals/attention.py): with
ā_t the head-averaged attention row of response token t at layer ℓ,
    AE_t = -Σ_j ā_tj log ā_tj / log n_t ∈ [0, 1]   (AE = 0 at n_t = 1),
    w_t = 1[AE_t ≤ τ_ρ] on valid tokens, τ_ρ = the ρ threshold of AE within the scope unit,
and the loss is divided by Σ w (normalize="selected").

Deviations and decisions:
1. [paper] Anchors (focused attention, low AE) carry the learning signal; ρ = 0.2 [ours: the
   paper's exact ρ was not available; it matches its random-20% control [secondary]].
2. [ours] Layer: `layers=None` = the middle layer (num_layers // 2); an int or a tuple averages
   AE over the listed layers. The rule declares them at registration (`attn_layers=`); the
   statistics pass computes AE there and this rule only reads `stats.attn_entropy`. Negative
   indices count back from the last layer; `signals.resolve_layers` checks the range against the
   model, which the rule does not know.
3. [ours] scope="batch", ties="topk" (docs/pitfalls.md, Selection). The first response token can
   have AE = 0 only when n_t = 1, i.e. an empty prompt; ties are then broken by a seeded random order.
4. [ours] normalize="selected", like top_entropy, so anchor/explorer/top_entropy/random differ
   only in which tokens are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common, check_fraction
from stare_lab.methods.top_entropy import keep_fraction
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    rho: float = 0.2  # [ours] 20%, as the paper's random-20% control [secondary]
    layers: int | tuple[int, ...] | None = None  # [ours] None = the middle layer
    scope: str = "batch"  # [ours] docs/pitfalls.md, Selection
    ties: str = "topk"  # [ours] exact ⌈ρ·n⌉, seeded tie-break
    normalize: str = "selected"  # [ours] as top_entropy

    def __post_init__(self) -> None:
        check_fraction("rho", self.rho)
        check_common(self)
        object.__setattr__(self, "layers", check_layers(self.layers))


def check_layers(layers):
    """None, an int, or a non-empty list/tuple of ints (YAML gives lists; store a hashable tuple)."""
    if layers is None:
        return None
    items = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    try:
        items = list(items)
    except TypeError:
        raise ValueError(f"layers={layers!r} must be None, an int or a list of ints") from None
    if not items or any(isinstance(i, bool) or not isinstance(i, int) for i in items):
        raise ValueError(f"layers={layers!r} must be None, an int or a non-empty list of ints")
    return layers if isinstance(layers, int) else tuple(items)


def keep_by_ae(stats: TokenStats, state: RuleState, p: Params, *, rule: str, largest: bool) -> RuleOutput:
    """Keep the top (largest=True, explorers) or bottom (anchors) fraction p.rho by AE."""
    return keep_fraction(
        stats.need("attn_entropy", rule=rule), "attn_entropy", stats, state, p, largest=largest, salt=rule
    )


@register("anchor", Params, needs={"attn_entropy"}, attn_layers=lambda p: p.layers)
def anchor(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    return keep_by_ae(stats, state, p, rule="anchor", largest=False)
