"""ict: train on the tokens whose distribution departs most from the group's (arXiv 2606.19771).

With P̄_t = mean over the live rollouts of the same prompt of their next-token distributions at
position t, u_i,t = JS(p_i,t ‖ P̄_t) ∈ [0, log 2] (`stats.js`, signals/js.py; recorded during
generation or computed by the stats pass, docs/pitfalls_signals.md):

    ω_i,t = 1 for every valid token                     while state.step < warmup_steps
    ω_i,t = 1[u_i,t among the top ⌈ρ·n⌉ of its scope]   afterwards

normalised by the number selected (normalize="selected").

Deviations and decisions:
1. [secondary] Score u = JS to the group mean and ρ = 0.1 come from a third-party reading.
2. [ours] Dense warm-up length warmup_steps = 10 (unpublished); during warm-up the rule is `full`.
3. [ours] Only rollouts still generating at position t count in P̄_t (TRL's completion mask); a
   position with one live rollout has u = 0.
4. [ours] Scope "batch" (the whole generation batch) and random tie-breaking at the boundary.
5. [ours] During warm-up `selected` is None (every valid token) and the normalisation stays
   "selected", which with all weights 1 is the same denominator as "valid".
6. [ours] u is compared on a grid of `resolution` = 1e-6 nats (select.py): JS values closer than
   that are ties, broken by the seeded order. On a model with peaked distributions most rollouts
   of a prompt agree, most of a batch has u below 1e-6 and the top 10% cut falls among them; their
   differences are the last bits of the forward pass (which change with the CPU's vector width), so
   without the grid the selection there was decided by float rounding, not by the signal.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common, check_fraction, select_top
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    rho: float = 0.1  # ICT [secondary]: keep the top 10% by JS
    warmup_steps: int = 10  # [ours] dense steps before selection starts
    scope: str = "batch"  # [ours]
    ties: str = "topk"
    normalize: str = "selected"
    resolution: float = 1e-6  # [ours] nats: JS values closer than this are ties (note 6)

    def __post_init__(self) -> None:
        check_common(self)
        check_fraction("rho", self.rho)
        if not self.resolution > 0:
            raise ValueError(f"resolution={self.resolution!r} is out of range (> 0)")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"warmup_steps={self.warmup_steps!r} is out of range (an integer ≥ 0)")


def in_warmup(state: RuleState, p: Params) -> bool:
    return state.step < p.warmup_steps


@register("ict", Params, needs={"js"})
def ict(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    js = stats.need("js", rule="ict")  # checked in the warm-up too: a missing statistic fails at once
    if in_warmup(state, p):
        return RuleOutput(weights=stats.mask.clone().float(), normalize=p.normalize, metrics={"rule/warmup": 1.0})
    keep = select_top(
        js,
        stats.valid,
        stats.group,
        p.rho,
        scope=p.scope,
        ties=p.ties,
        generator=state.generator("ict"),
        resolution=p.resolution if p.ties == "topk" else None,
    )
    return RuleOutput(
        weights=keep.float() * stats.mask, normalize=p.normalize, metrics={"rule/warmup": 0.0}, selected=keep
    )
