"""rsi_band: keep tokens whose relative surprisal index RSI = s / H lies in a band (RSI-S).

Paper: arXiv 2606.31575 (RSI-S).

Equation implemented (the abstract of arXiv 2606.31575 [secondary]):
    s_t = -log π(a_t),  H_t = -Σ_v p_v,t log p_v,t,
    RSI_t = s_t / H_t  (RSI_t = 0 where H_t < 1e-6),
    w_t = 1[low ≤ RSI_t ≤ high] on valid tokens; the loss is divided by Σ w.
RSI = 1 is the neutral point: reinforcing a token with RSI > 1 raises entropy (docs/pitfalls.md, Notation).

Deviations and decisions:
1. [secondary, matches the abstract] RSI = s / H.
2. [ours] Guard H < 1e-6 → RSI = 0: a near-deterministic token is "low", so the default band
   drops it (its gradient e_a - p is ≈ 0 anyway); a band with low = 0 keeps it.
3. [ours] Bounds were not published: default [0.5, 2.0]. `high` may be inf (also the string
   "inf" from YAML), for the open top band of the RSI-bands sweep. Both bounds are inclusive.
4. [paper] Kept tokens are averaged: normalize="selected".
5. [paper] Kept, dropped-low and dropped-high fractions of valid tokens are logged every step.
6. [ours] The band is absolute, so there is no scope: a token's weight depends on itself only.
7. [ours] Adjacent bands of an RSI-bands sweep share their boundary value (both bounds are
   inclusive), a measure-zero set in practice. rule/kept_frac + low_frac + high_frac = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_common
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    import torch

H_EPS = 1e-6  # [ours] guard H < 1e-6 → RSI = 0 (note 2)


@dataclass(frozen=True)
class Params:
    low: float = 0.5  # [ours] bounds not published (note 3)
    high: float = 2.0  # [ours]; float("inf") or "inf" = no upper bound
    normalize: str = "selected"  # [paper] loss averaged over kept tokens

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            value = getattr(self, name)
            try:
                # float() also parses YAML's "inf" string; bool is rejected as a likely typo
                num = float(value) if not isinstance(value, bool) else math.nan
            except (TypeError, ValueError):
                num = math.nan
            if math.isnan(num):
                raise ValueError(f"{name}={value!r} is not a number")
            object.__setattr__(self, name, num)
        if self.low > self.high:
            raise ValueError(f"low={self.low} > high={self.high}: the RSI band needs low ≤ high")
        check_common(self)


def relative_surprisal(stats: TokenStats) -> torch.Tensor:
    """[B, T] RSI = s / H, 0 where H < 1e-6."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    H = stats.need("entropy", rule="rsi_band").float()
    safe_H = torch.where(H < H_EPS, torch.ones_like(H), H)
    return torch.where(H < H_EPS, torch.zeros_like(H), stats.surprisal.float() / safe_H)


@register("rsi_band", Params, needs={"logp", "entropy"})
def rsi_band(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    stats.require("entropy", rule="rsi_band")
    valid = stats.valid
    rsi = relative_surprisal(stats)
    kept = valid & (rsi >= p.low) & (rsi <= p.high)
    n = float(valid.sum())

    def frac(m: torch.Tensor) -> float:
        return float((m & valid).sum()) / n if n else 0.0

    metrics = {"rule/kept_frac": frac(kept), "rule/low_frac": frac(rsi < p.low), "rule/high_frac": frac(rsi > p.high)}
    return RuleOutput(weights=kept.float(), normalize=p.normalize, metrics=metrics, selected=kept)
