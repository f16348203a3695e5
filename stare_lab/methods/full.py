"""full: weight 1 on every valid token, the GRPO/DAPO baseline.

The loss is aggregated with TRL's own `loss_type` (normalize="loss_type"), so a `full` run
reproduces plain `trl.GRPOTrainer` losses and gradients exactly (a test).

scope="microbatch" is the matched control of the rules that select per micro-batch (Clip-Cov and
KL-Cov at their default scope, any rule run with scope "microbatch"): the same weights (every valid token), run
inside the loss on each micro-batch as those rules run, so the loss is aggregated as theirs is, by
`trainer.microbatch_aggregation` (default "verl": each micro-batch's own token mean times its share of
the step's rows, verl's legacy dp_actor `token-mean`; docs/pitfalls.md, "scope: microbatch"). With the
dapo loss type that differs from plain `full`, whose denominator is the whole generation batch's token
count: a table of `clip_cov` against `full` alone mixes the rule with the aggregation (issue 26.6,
docs/field.md "Matched controls"). With `trainer.microbatch_aggregation: trl` it is plain `full` again.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_choice, check_common
from stare_lab.stats import TokenStats

SCOPES = ("batch", "microbatch")


@dataclass(frozen=True)
class Params:
    normalize: str = "loss_type"
    scope: str = "batch"  # "microbatch": aggregated per micro-batch as Clip-Cov/KL-Cov (module docstring)

    def __post_init__(self) -> None:
        check_common(self)
        check_choice("scope", self.scope, SCOPES)


@register("full", Params)
def full(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    return RuleOutput(weights=stats.mask.clone(), normalize=p.normalize, metrics={})
