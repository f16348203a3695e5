"""ce_gppo: gradient-preserving clipping, clipped tokens keep a scaled gradient (CE-GPPO, arXiv 2509.20712).

With r = π_θ/π_old, sg the stop-gradient and the trainer's ε_low, ε_high:

    ℓ_t = −β1·(1 − ε_low)·(r/sg r)·A     if A < 0 and r < 1 − ε_low
          −β2·(1 + ε_high)·(r/sg r)·A    if A > 0 and r > 1 + ε_high
          −r·A                           otherwise
    ℓ_t = min(ℓ_t, −A·c)  where A < 0                      (dual clip, c = 10)

r/sg r equals 1 in value and has the gradient of r, so a clipped token's loss keeps PPO's clipped
value (times β) but still passes β·(1 ± ε)·A·∇log π back. ℓ replaces TRL's clipped surrogate.

Differences from the official code (Kwai-Klear/CE-GPPO `verl/trainer/ppo/core_algos.py`
`compute_gppo_loss_general_beta`, loss_func "gppo_general", @10558fe):
1. [code] β1 = 0.5 (`recipe/dapo/1_5B_perf_run_gppo_v1_beta1_05_beta2_1_ours_math.sh`); the 7B script
   sets 0.75 and the config's default (`verl/trainer/config/ppo_trainer.yaml`) is 0.25. β2 = 1.
2. [code] The ratio is exp(log π − log π_old) without a clamp of the log-ratio (as the official code).
3. [code] ε and c are the trainer's clip settings; the official scripts use ε_low = ε_high = 0.2 and
   clip_ratio_c = 10, token-mean aggregation. TRL has no dual clip: `dual_clip=None` leaves it out.
4. [code] Scope: per token; nothing depends on the batch.
5. [ours] As a registered rule: weights 1; the loss replaces TRL's clipped surrogate with ℓ, using the
   trainer's ε; it applies its own dual clip, so TRL's `delta` is refused, as are loss types with a
   surrogate of their own. Metrics per micro-batch: rule/clipped_low_frac, rule/clipped_high_frac.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import refuse_delta, replaces_surrogate, token_advantages
from stare_lab.methods.registry import LossBatch, LossTerms, TrainerValues, register_loss

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor


@dataclass(frozen=True)
class Params:
    beta_low: float = 0.5  # CE-GPPO 1_5B_perf_run_gppo_v1_beta1_05_beta2_1_ours_math.sh: gppo_loss_beta1=0.5 (β1)
    beta_high: float = 1.0  # same script: gppo_loss_beta2=1.0 (β2)
    dual_clip: float | None = 10.0  # same script: actor.clip_ratio_c=10.0; None: no dual clip

    def __post_init__(self) -> None:
        for name in ("beta_low", "beta_high"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name}={getattr(self, name)} is out of range ({name} ≥ 0)")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"dual_clip={self.dual_clip} is out of range (dual_clip > 1)")


def clipped_sides(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float, eps_high: float):
    """(low, high) [B, T] bool: A < 0 with r < 1 − ε_low, and A > 0 with r > 1 + ε_high."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, logp)
    ratio = torch.exp(logp.detach() - old_logp)
    return (ratio < 1 - eps_low) & (A < 0), (ratio > 1 + eps_high) & (A > 0)


def per_token_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, p: Params, eps_low: float, eps_high: float
) -> Tensor:
    """ℓ [B, T] of CE-GPPO (gradient-preserving clip, then the dual clip for A < 0)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # 1 in value, ∇r in gradient
    low, high = clipped_sides(logp, old_logp, advantages, eps_low, eps_high)
    loss = torch.where(low, -p.beta_low * (1 - eps_low) * unit * A, -ratio * A)
    loss = torch.where(high, -p.beta_high * (1 + eps_high) * unit * A, loss)
    if p.dual_clip is not None:
        loss = torch.where(A < 0, torch.minimum(-A * p.dual_clip, loss), loss)
    return loss


def metrics(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float):
    """rule/clipped_low_frac, rule/clipped_high_frac: valid tokens on each gradient-preserved side."""
    valid = mask > 0
    n = float(valid.sum())
    low, high = clipped_sides(logp, old_logp, advantages, eps_low, eps_high)
    return {
        "rule/clipped_low_frac": float((low & valid).sum()) / n if n else 0.0,
        "rule/clipped_high_frac": float((high & valid).sum()) / n if n else 0.0,
    }


def check(p: Params, trainer: TrainerValues) -> None:
    replaces_surrogate(trainer)
    refuse_delta(trainer, "applies its own dual clip (dual_clip)")


@register_loss("ce_gppo", Params, check=check)
def loss(batch: LossBatch, p: Params) -> LossTerms:
    t = batch.trainer
    policy = per_token_loss(batch.logp, batch.old_logp, batch.advantages, batch.mask, p, t.epsilon_low, t.epsilon_high)
    low, high = clipped_sides(batch.logp, batch.old_logp, batch.advantages, t.epsilon_low, t.epsilon_high)
    valid = batch.mask > 0
    return LossTerms(
        policy=policy,
        metrics=metrics(batch.logp, batch.old_logp, batch.advantages, batch.mask, t.epsilon_low, t.epsilon_high),
        touched={"clipped low, gradient kept (β1)": low & valid, "clipped high, gradient kept (β2)": high & valid},
    )
