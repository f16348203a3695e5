"""adv_reweight: Advantage Reweighting, damp the advantage of low-probability tokens (arXiv 2505.12929).

With π_old the rollout policy's probability of the sampled token (at the sampling temperature):

    A′_t = (α·π_old(a_t) + 1 − α)·A_t          on every valid token (α ∈ [0, 1]; α = 0 is plain GRPO)

The weight w_t = α·π_old + 1 − α ∈ [1 − α, 1] is positive, so PPO's clipped surrogate (and its dual
clip) of A′ is w times that of A: the rule is a per-token weight on the surrogate, KL term excluded.

Differences from the official code (zhyang2226/AR-Lopti `verl/trainer/ppo/ray_trainer.py`
`compute_reweight_advantage`, reweight_method "both_linear_normal", @cbeb333):
1. [code] The official weight is `reweight_k·π_old + reweight_tau` with the two set apart; its
   scripts set reweight_tau = 1 − reweight_k ("(1 - alpha) in the paper"). `tau=None` is 1 − α;
   set `tau` for the official two-parameter form.
2. [code] "both_linear_normal" also multiplies negative advantages by `neg_adv_weight`; the scripts
   set 1.0 (the config's default is 0.8, never used by a script): `neg_weight=1.0`.
3. [code] α: `scripts/train_kklogic_AR_4x80GB.sh` sets reweight_k = 0.2, the AR+Lopti script 0.3
   (use `alpha=0.3` with lopti).
4. [ours] The weight multiplies the policy-gradient surrogate, not the KL or entropy terms: the
   official code reweights the advantage, which those terms never read. A trainer that weights
   TRL's whole per-token loss (β·KL included) must apply this weight to the surrogate only.
5. [code] Scope: the generation batch, π_old = exp(old log-probs) computed once after rollout, before
   any update (the official `batch.batch['old_log_probs']`); micro-batch splits change nothing.
6. [ours] As a registered rule, w is a weight in TRL's per-token slot, which multiplies the surrogate
   and not β·KL (note 4). scope "token" (default) computes it inside the loss from TRL's own π_old
   (`old_per_token_logps`, or the training forward's detached log-probs when TRL computes none because
   they are equal): no extra forward. scope "batch" computes it at generation time from the statistics
   (the same values; a statistics forward when TRL makes no old-log-prob forward). Loss types with a
   surrogate of their own (cispo, sapo, vespo) are refused: a weight on A is not a weight on their loss.
   With TRL's entropy bonus, the bonus averages over the weighted tokens (training/trl_loss.py), as for every rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import clipped_surrogate, refuse_own_surrogate, token_advantages
from stare_lab.methods.registry import RuleOutput, RuleState, TrainerValues, register
from stare_lab.methods.select import check_choice, check_fraction
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor


@dataclass(frozen=True)
class Params:
    alpha: float = 0.2  # AR-Lopti scripts/train_kklogic_AR_4x80GB.sh: REWEIGHT_K=0.2 (α; 0.3 with Lopti)
    tau: float | None = None  # None: 1 − α (the paper; the scripts' REWEIGHT_TAU=0.8)
    neg_weight: float = 1.0  # AR-Lopti scripts: NEG_ADV_WEIGHT=1.0 (config default 0.8)
    scope: str = "token"  # [ours] in the loss from TRL's own π_old; "batch": at generation (note 6)

    def __post_init__(self) -> None:
        check_fraction("alpha", self.alpha, open_low=False)
        tau = 1.0 - self.alpha if self.tau is None else self.tau
        object.__setattr__(self, "tau", tau)
        if not tau >= 0.0:
            raise ValueError(f"tau={tau} is out of range (tau ≥ 0)")
        if not self.neg_weight >= 0.0:
            raise ValueError(f"neg_weight={self.neg_weight} is out of range (neg_weight ≥ 0)")
        check_choice("scope", self.scope, SCOPES)


SCOPES = ("token", "batch")


def advantage_weights(old_logp: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> Tensor:
    """w [B, T] = (α·π_old + τ)·(neg_weight where A ≤ 0); 0 on padding. A′ = w·A."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    assert p.tau is not None  # set in __post_init__
    w = p.alpha * torch.exp(old_logp.detach()) + p.tau
    A = token_advantages(advantages, old_logp)
    w = torch.where(A > 0, w, w * p.neg_weight)
    return torch.where(mask > 0, w, torch.zeros_like(w))  # whatever sits on padding (NaN too)


def per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    p: Params,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    *,
    rollout_logp: Tensor | None = None,
) -> Tensor:
    """ℓ [B, T]: PPO's clipped surrogate (verl's, dual clip optional) of A′ = w·A.

    w is read from `rollout_logp` (the rollout policy's log-probs) when given, else from `old_logp`.
    """
    base = old_logp if rollout_logp is None else rollout_logp
    A = token_advantages(advantages, logp) * advantage_weights(base, advantages, mask, p)
    return clipped_surrogate(logp, old_logp, A, eps_low, eps_high, dual_clip)


def metrics(weights: Tensor, mask: Tensor) -> dict[str, float]:
    """rule/weight_mean over valid tokens (summed in row-major order: the same for any input strides)."""
    n = float(mask.sum())
    return {"rule/weight_mean": float((weights * mask).contiguous().sum()) / n if n else 0.0}


def check(p: Params, trainer: TrainerValues) -> None:
    refuse_own_surrogate(trainer, "a weight on A is a weight on PPO's surrogate only")


@register("adv_reweight", Params, needs={"logp", "old_logp"}, check=check)
def adv_reweight(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    w = advantage_weights(stats.need("old_logp", rule="adv_reweight"), stats.advantages, stats.mask, p).float()
    return RuleOutput(weights=w, normalize="valid", metrics=metrics(w, stats.mask))
