"""opefo: On-Policy Entropy Flow Optimisation (arXiv 2605.11491).

First-order entropy change that the update of token t of rollout i causes (η dropped, it cancels):

    flow "simple": ΔH = −A·π·(log π + H)
    flow "full":   ΔH = −A·[π(log π + H) − Σ_v p_v²(log p_v + H)]
                      = −A·[π(log π + H) − (p2logp + H·p2)]

Within each scope unit F+ = Σ_{ΔH>0} ΔH, F− = Σ_{ΔH<0} |ΔH| over valid tokens, and

    λ = (F− − F+) / (F− + F+)  ∈ [−1, 1]  (0 when F+ = F− = 0)
    ω = 1 + λ where ΔH > 0,  1 − λ where ΔH < 0,  1 where ΔH = 0,

so that the weighted first-order flow Σ ω·ΔH = F+ − F− + λ(F+ + F−) is zero. Not renormalised.

Deviations and decisions:
1. [ours, from the secondary reading] The one-term flow; the paper's Eq. 6 was not seen. The full
   two-term first-order form (docs/pitfalls.md, Notation) is `flow: full` (needs p2 = Σ p², p2logp = Σ p² log p).
2. [ours] λ per scope unit, default the whole generation batch, from the rollout policy's
   statistics. The paper is strictly on-policy (one update per rollout batch).
3. [ours] λ is clipped to [−1, 1] (a no-op up to rounding: |F− − F+| ≤ F− + F+), computed in
   float64. λ = 0 when F+ = F− = 0 (an all-A = 0 batch: every weight 1). With one sign of flow
   only, λ = ±1 and that side's tokens get weight 0; the net flow is still 0. ΔH = 0 → weight 1.
4. Metrics: rule/lambda (mean λ over scope units: the batch λ for scope "batch"), rule/flow_pos,
   rule/flow_neg and rule/net_flow_after = Σ ω·ΔH over the batch (≈ 0 up to rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_choice, check_common, scope_ids
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

FLOWS = ("simple", "full")


@dataclass(frozen=True)
class Params:
    flow: str = "simple"  # OPEFO [secondary]: −A·π·(log π + H); "full" adds the Σ p² term
    scope: str = "batch"  # [ours]
    normalize: str = "valid"  # OPEFO: reweighting, no renormalisation

    def __post_init__(self) -> None:
        check_common(self)
        check_choice("flow", self.flow, FLOWS)


def needs(p: Params, trainer=None) -> set[str]:
    return {"logp", "entropy", "p2", "p2logp"} if p.flow == "full" else {"logp", "entropy"}


def entropy_flow(stats: TokenStats, flow: str) -> Tensor:
    """ΔH [B, T] (float64), 0 on padding."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    logp, H = stats.logp.double(), stats.need("entropy", rule="opefo").double()
    pi = torch.exp(logp)
    term = pi * (logp + H)
    if flow == "full":
        term = term - (stats.need("p2logp", rule="opefo").double() + H * stats.need("p2", rule="opefo").double())
    return torch.where(stats.valid, -stats.token_advantages.double() * term, torch.zeros_like(term))


def scope_sum(x: Tensor, ids: Tensor, n_units: int) -> Tensor:
    """[n_units] sum of x [B, T] over each scope unit."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    return torch.zeros(n_units, dtype=x.dtype, device=x.device).index_add_(0, ids.reshape(-1), x.reshape(-1))


@register("opefo", Params, needs=needs)
def opefo(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    stats.require(*sorted(needs(p)), rule="opefo")
    dH = entropy_flow(stats, p.flow)
    ids = scope_ids(stats.valid, stats.group, p.scope)
    n_units = int(ids.max()) + 1 if ids.numel() else 0
    f_pos, f_neg = scope_sum(dH.clamp(min=0), ids, n_units), scope_sum((-dH).clamp(min=0), ids, n_units)
    total = f_pos + f_neg
    lam = torch.where(total > 0, (f_neg - f_pos) / torch.where(total > 0, total, 1.0), 0.0).clamp(-1.0, 1.0)
    w = 1.0 + torch.sign(dH) * lam[ids]  # 1+λ where ΔH > 0, 1−λ where ΔH < 0, else 1
    weights = (w * stats.mask.double()).float()
    live = scope_sum(stats.mask.double(), ids, n_units) > 0
    metrics = {
        "rule/lambda": float(lam[live].mean()) if live.any() else 0.0,  # mean over scope units
        "rule/flow_pos": float(f_pos.sum()),
        "rule/flow_neg": float(f_neg.sum()),
        "rule/net_flow_after": float((w * dH).contiguous().sum()),  # row-major: the same for any input strides
    }
    return RuleOutput(weights=weights, normalize=p.normalize, metrics=metrics)
