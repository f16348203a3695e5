"""entropy_adv: entropy advantage shaping, an exploration bonus bounded by the advantage (arXiv 2506.14758).

Cheng et al., "Reasoning with Exploration: An Entropy Perspective". With H_t the entropy of the policy's
next-token distribution at t (detached: the bonus carries no gradient):

    ψ_t  = min(α·H_t, |A_t|/κ)
    A′_t = A_t + ψ_t                                     on every valid token

With κ > 1 the bonus never flips A's sign and A′ = w·A with w = A′/A ∈ [1 − 1/κ, 1 + 1/κ] where A ≠ 0
(A = 0 gives ψ = 0): a positive per-token weight on PPO's clipped surrogate (KL term excluded).

No official code was found; this follows the paper.
Decisions:
1. [paper] α = 0.4 and κ = 2 (the paper's values with GRPO).
2. [ours] Scope: `scope="token"` (default) takes the current policy's entropy from the loss's own
   forward (TRL's, detached: free, and the rollout policy's on the first update of a batch);
   `scope="batch"` takes H from the rollout policy's statistics once per generation batch (a
   statistics pass or the generation-time recording). The paper's code is not public; both are offered.
3. [ours] 0 < κ < 1 is a valid parameter of the functions but makes w < 0 possible for A < 0 (the bonus
   can flip the sign): `advantage_weights` then raises, and only `per_token_loss` (A′ in the surrogate)
   is exact. The registered rule is a weight on TRL's clipped surrogate, so it refuses κ < 1.
5. [ours] As a registered rule w multiplies the surrogate in TRL's slot (not β·KL); loss types with a
   surrogate of their own are refused. Metrics: rule/bonus_mean, rule/bonus_capped_frac.
4. [ours] The surrogate is PPO's with the trainer's ε (and optional dual clip); the paper does not
   change the clip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import clipped_surrogate, refuse_own_surrogate, token_advantages
from stare_lab.methods.registry import RuleOutput, RuleState, TrainerValues, register
from stare_lab.methods.select import check_choice
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

SCOPES = ("token", "batch")


@dataclass(frozen=True)
class Params:
    alpha: float = 0.4  # arXiv 2506.14758: α = 0.4 with GRPO
    kappa: float = 2.0  # arXiv 2506.14758: κ = 2
    scope: str = "token"  # [ours] the loss's own entropy; "batch": the rollout statistics' (note 2)

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha} is out of range (0 ≤ alpha ≤ 1)")
        if not self.kappa > 0.0:
            raise ValueError(f"kappa={self.kappa} is out of range (kappa > 0)")
        check_choice("scope", self.scope, SCOPES)


def bonus(entropy: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> Tensor:
    """ψ [B, T] = min(α·H, |A|/κ) on valid tokens, 0 on padding."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, entropy).detach()
    psi = torch.minimum(p.alpha * entropy.detach(), A.abs() / p.kappa)
    return torch.where(mask > 0, psi, torch.zeros_like(psi))


def shaped_advantages(entropy: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> Tensor:
    """A′ [B, T] = A + ψ."""
    return token_advantages(advantages, entropy) + bonus(entropy, advantages, mask, p)


def advantage_weights(entropy: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> Tensor:
    """w [B, T] = A′/A where A ≠ 0, 1 where A = 0 or on padding (0 there); positive when κ > 1."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, entropy).detach()
    shaped = shaped_advantages(entropy, advantages, mask, p)
    w = torch.where(A != 0, shaped / torch.where(A != 0, A, torch.ones_like(A)), torch.ones_like(A))
    w = torch.where(mask > 0, w, torch.zeros_like(w))  # whatever sits on padding (NaN too)
    if bool((w[mask > 0] < 0).any()):
        raise ValueError(f"kappa={p.kappa} flips an advantage's sign: use A′ in the surrogate, not a weight")
    return w


def per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    entropy: Tensor,
    p: Params,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> Tensor:
    """ℓ [B, T]: PPO's clipped surrogate of A′ = A + ψ (H as given: rollout or current, per `scope`)."""
    return clipped_surrogate(
        logp, old_logp, shaped_advantages(entropy, advantages, mask, p), eps_low, eps_high, dual_clip
    )


def metrics(entropy: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> dict[str, float]:
    """rule/bonus_mean over valid tokens; rule/bonus_capped_frac: valid tokens with A ≠ 0 where |A|/κ binds."""
    valid = mask > 0
    n = float(valid.sum())
    if not n:
        return {"rule/bonus_mean": 0.0, "rule/bonus_capped_frac": 0.0}
    A = token_advantages(advantages, entropy)
    capped = valid & (A != 0) & (A.abs() / p.kappa < p.alpha * entropy)  # A = 0 binds trivially
    return {
        "rule/bonus_mean": float(bonus(entropy, advantages, mask, p).contiguous().sum()) / n,  # row-major order
        "rule/bonus_capped_frac": float(capped.sum()) / n,
    }


def check(p: Params, trainer: TrainerValues) -> None:
    refuse_own_surrogate(trainer, "a weight on A is a weight on PPO's surrogate only")
    if p.kappa < 1.0:
        raise ValueError(f"kappa={p.kappa} < 1 lets the bonus flip an advantage's sign, which no weight expresses")


@register("entropy_adv", Params, needs={"entropy"}, check=check)
def entropy_adv(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    H = stats.need("entropy", rule="entropy_adv")
    w = advantage_weights(H, stats.advantages, stats.mask, p).float()
    return RuleOutput(weights=w, normalize="valid", metrics=metrics(H, stats.advantages, stats.mask, p))
