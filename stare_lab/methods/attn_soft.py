"""attn_soft: dynamic soft reweighting by attention entropy, anchors first, explorers later.

Label results "our AE schedule": the idea is the anchor/explorer paper's (arXiv 2605.07660,
[paper]); its reweighting function was not available, so the formula below is ours.

Equation implemented [ours]:
    u_t = rank of AE_t among valid tokens of its scope unit, / (n - 1) ∈ [0, 1]  (0 = most anchor-like)
    λ   = training progress, rising linearly from 0 (first step) to 1 (last step)
    w_t = 1 + κ·(2u_t - 1)·(2λ - 1),   κ = 0.5
then w is renormalised to mean 1 over the valid tokens of the batch; normalize="valid".

Deviations and decisions:
1. [ours] Ranks, not raw AE: the schedule does not depend on AE's scale, which varies by layer
   and model. Ties share their mean rank; a scope unit with one token gets u = 0.5 (w = 1).
2. [ours] κ = 0.5: anchors weigh 1.5 and explorers 0.5 at λ = 0, the reverse at λ = 1, and
   every token 1 at λ = 0.5. κ ∈ [0, 1] keeps every weight ≥ 0.
3. [ours] Mean-1 renormalisation over the batch's valid tokens. Mean rank is (n-1)/2 in every
   scope unit, so the mean weight is already 1; the division only guards rounding.
4. [ours] normalize="valid": soft weights rescale token losses; no token is dropped.
5. [ours] λ = RuleState.progress = step / (total_steps - 1), so the last step is at λ = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.anchor import check_layers
from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common, rank_normalise
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    kappa: float = 0.5  # [ours] κ = 0.5 (weights in [0.5, 1.5])
    layers: int | tuple[int, ...] | None = None  # [ours] None = the middle layer, as anchor
    scope: str = "batch"  # [ours] scope of the AE ranks
    normalize: str = "valid"  # [ours] soft weights, nothing dropped

    def __post_init__(self) -> None:
        if not 0.0 <= self.kappa <= 1.0:
            raise ValueError(f"kappa={self.kappa} is out of range (0 ≤ kappa ≤ 1; kappa > 1 gives negative weights)")
        check_common(self)
        object.__setattr__(self, "layers", check_layers(self.layers))


@register("attn_soft", Params, needs={"attn_entropy"}, attn_layers=lambda p: p.layers)
def attn_soft(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    ae = stats.need("attn_entropy", rule="attn_soft")
    valid = stats.valid
    u = rank_normalise(ae, valid, stats.group, p.scope)  # [B, T], 0 = lowest AE
    lam = state.progress
    w = 1.0 + p.kappa * (2.0 * u - 1.0) * (2.0 * lam - 1.0)
    w = w * valid
    n_valid = int(valid.sum())
    if n_valid:
        w = w * (n_valid / w.contiguous().sum())  # row-major order: the same sum for any input strides
    metrics = {
        "rule/progress": lam,
        "rule/weight_min": float(w[valid].min()) if n_valid else 0.0,
        "rule/weight_max": float(w[valid].max()) if n_valid else 0.0,
    }
    return RuleOutput(weights=w, normalize=p.normalize, metrics=metrics, selected=None)
