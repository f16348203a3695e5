"""PPO's pieces the field's rules share: token advantages, verl's form of the clipped surrogate, and the
trainer settings a rule refuses because of what it does to PPO's surrogate (one line each).

A rule that replaces the surrogate (`register(..., loss=fn)`) calls `replaces_surrogate` in its `check`:
its policy term is put in place of PPO's per-token clipped term inside TRL's loss
(stare_lab.training.trl_loss.surrogate_change), which only a loss type whose policy term is that surrogate, with
a per-token ratio, has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import stare_lab.methods.surrogate as surrogate
from stare_lab.methods.loss_types import OWN_SURROGATE, PPO_SURROGATE
from stare_lab.methods.rule_types import TrainerValues

if TYPE_CHECKING:  # annotations only
    from torch import Tensor


def token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """[B, T] advantages from [B] or [B, T] (as TokenStats.token_advantages)."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float | Tensor,
    eps_high: float | Tensor,
    dual_clip: float | None = None,
    *,
    clamp_log_ratio: bool = False,
) -> Tensor:
    """[B, T] PPO's max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), ε per token or scalar, as verl writes it.

    The surrogate is `stare_lab.methods.surrogate.clipped_surrogate` (= −min(r·A, clip(r)·A), the same numbers),
    with verl's ε arithmetic (1 − ε in r's dtype, for a float ε too) and verl's two additions: with
    `dual_clip` c, tokens with A < 0 take min(that, −A·c) (Ye et al. 2019, verl's `clip_ratio_c`; TRL's
    `delta` caps r for either sign instead); `clamp_log_ratio` clamps log r to ±20 first, as verl's
    vanilla loss does.
    """
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, logp)
    log_ratio = logp - old_logp
    if clamp_log_ratio:
        log_ratio = torch.clamp(log_ratio, min=-20.0, max=20.0)
    eps = [e if torch.is_tensor(e) else torch.tensor(e, dtype=log_ratio.dtype) for e in (eps_low, eps_high)]
    loss, _ = surrogate.clipped_surrogate(log_ratio, torch.zeros_like(log_ratio), A, eps[0], eps[1])
    if dual_clip is not None:
        loss = torch.where(A < 0, torch.minimum(-A * dual_clip, loss), loss)
    return loss


def replaces_surrogate(trainer: TrainerValues) -> None:
    """A rule whose policy term replaces PPO's clipped surrogate: a loss type with that surrogate and a
    per-token ratio (the module docstring)."""
    if trainer.loss_type not in PPO_SURROGATE:
        raise ValueError(
            f"replaces PPO's clipped surrogate, but trainer.loss_type={trainer.loss_type} has a surrogate of "
            f"its own (use one of {', '.join(PPO_SURROGATE)})"
        )
    if trainer.importance_sampling_level != "token":
        raise ValueError(
            f"has a per-token ratio, but importance_sampling_level={trainer.importance_sampling_level} makes "
            "TRL's ratio per sequence (use 'token')"
        )


def refuse_own_surrogate(trainer: TrainerValues, what: str) -> None:
    """A rule whose weights act on PPO's surrogate only (`what` says how): no loss type with its own."""
    if trainer.loss_type in OWN_SURROGATE:
        raise ValueError(f"{what}; loss_type={trainer.loss_type} has its own")


def refuse_delta(trainer: TrainerValues, why: str) -> None:
    """TRL's two-sided clipping `delta` (a dual clip) where the field's rule has none, or its own."""
    if trainer.delta is not None:
        raise ValueError(f"{why}; TRL's delta={trainer.delta} adds one (leave it unset)")
