"""plugin_example: a token rule defined outside stare_lab, to prove that a rule is one file.

Importing this module registers the rule; nothing else in the project changes. It keeps the
tokens whose surprisal s = -log π is above their row's mean surprisal, and scales them by the
trainer's clip ε_high (read through a trainer-valued parameter), so it exercises a declared
statistic (`logp`), a trainer value, and the "selected" normalisation:

    w_t = (1 + ε_high) · 1[s_t > mean_row(s)]  on valid tokens;  normalize = "selected".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from stare_lab.methods import RuleOutput, RuleState, register
from stare_lab.stats import TokenStats

NAME = "plugin_example"


@dataclass(frozen=True)
class Params:
    eps_high: float | None = field(default=None, metadata={"trainer": "epsilon_high"})  # None: the trainer's
    normalize: str = "selected"


@register(NAME, Params, needs={"logp"})
def plugin_example(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    valid = stats.valid
    s = torch.where(valid, stats.surprisal, torch.zeros_like(stats.surprisal))
    n = valid.sum(-1, keepdim=True).clamp(min=1)
    above = valid & (s > s.sum(-1, keepdim=True) / n)
    return RuleOutput(
        weights=above.float() * (1 + p.eps_high),
        normalize=p.normalize,
        metrics={"rule/kept_frac": float(above.sum()) / max(int(valid.sum()), 1)},
        selected=above,
    )
