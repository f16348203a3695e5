"""full: weight 1 on every valid token, the GRPO/DAPO baseline.

The loss is aggregated with TRL's own `loss_type` (normalize="loss_type"), so a `full` run
reproduces plain `trl.GRPOTrainer` losses and gradients exactly (a test).
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    normalize: str = "loss_type"

    def __post_init__(self) -> None:
        check_common(self)


@register("full", Params)
def full(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    return RuleOutput(weights=stats.mask.clone(), normalize=p.normalize, metrics={})
