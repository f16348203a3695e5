"""stapo: drop spurious tokens from positive rollouts (arXiv 2602.15620).

A token is spurious when it was improbable, the policy was confident, and it was rewarded:

    drop(t) = A > 0  and  π < τ_p  and  H < q_h,    q_h = quantile of H over the batch's valid tokens
    ω = 0 if drop(t), else 1; the loss is renormalised over the kept tokens (normalize="selected").

Deviations and decisions:
1. [secondary] Rule, τ_p = 0.002 and the renormalisation come from a third-party reading.
2. [ours] The paper is inconsistent on the entropy quantile (0.8 vs 0.2): default 0.2,
   configurable as `tau_h_quantile`. q_h is the linear-interpolation quantile (as
   `torch.quantile`) over every valid token of the generation batch; both comparisons are strict.
3. [ours] π is the rollout policy's probability at the sampling temperature (`stats.logp`),
   compared as log π < log τ_p. q_h is over the generation batch this rank holds, computed by
   sorting (`select.quantile`: `torch.quantile` refuses more than 2^24 tokens).
4. Metric rule/masked_frac: the dropped fraction of valid tokens (tiny in practice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common, check_fraction, quantile
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    tau_p: float = 0.002  # STAPO [secondary]: probability threshold τ_p
    tau_h_quantile: float = 0.2  # [ours]: the paper says both 0.8 and 0.2
    normalize: str = "selected"  # STAPO [secondary]: renormalise over kept tokens

    def __post_init__(self) -> None:
        check_common(self)
        check_fraction("tau_p", self.tau_p)
        check_fraction("tau_h_quantile", self.tau_h_quantile, open_low=False)


@register("stapo", Params, needs={"logp", "entropy"})
def stapo(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    H = stats.need("entropy", rule="stapo")
    valid = stats.valid
    n_valid = int(valid.sum())
    if n_valid == 0:
        return RuleOutput(weights=stats.mask.clone().float(), normalize=p.normalize, metrics={"rule/masked_frac": 0.0})
    q_h = float(quantile(H[valid].double(), p.tau_h_quantile))
    drop = valid & (stats.token_advantages > 0) & (stats.logp < math.log(p.tau_p)) & (H < q_h)
    keep = valid & ~drop
    metrics = {"rule/masked_frac": float(drop.sum()) / n_valid, "rule/entropy_quantile": q_h}
    return RuleOutput(weights=keep.float(), normalize=p.normalize, metrics=metrics, selected=keep)
