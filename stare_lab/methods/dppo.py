"""dppo: Divergence PPO, a trust region on the policy divergence instead of the ratio (arXiv 2602.04879).

With p = π_θ(a_t), p_old = π_old(a_t), r = p/p_old (log-ratio clamped to ±20), sg the stop-gradient:

    tv: keep_t = (p − p_old ≤ δ_high)                if A > 0,   (p − p_old ≥ −δ_low)               otherwise
    kl: D_t    = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8))   (Bernoulli KL)
        keep_t = (D_t ≤ δ_high or p ≤ p_old)       if A > 0,   (D_t ≤ δ_low or p ≥ p_old)       otherwise
    ℓ_t = −A·sg(min(r, C))·log π_θ(a_t)·keep_t                  (no ratio clipping; C = the IS cap)

ℓ is the per-token loss before aggregation; it replaces TRL's clipped surrogate (its gradient is
−A·min(r, C)·∇log π on the kept tokens, a truncated-IS policy gradient).

Differences from the official code (verl `verl/trainer/ppo/core_algos.py` `compute_policy_loss_dppo_tv`,
`compute_policy_loss_dppo_kl` @1dda039; the paper's own code is sail-sg/Stable-RL, not read here):
1. [code] δ: verl reads the divergence threshold from the PPO clip fields (`clip_ratio_low/high`);
   its example `examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh` sets 0.15 (tv) and 0.05 (kl).
   `delta=None` takes the variant's value; `delta_low`/`delta_high` set the two sides apart.
2. [code] IS cap C: the function's fallback is `config.get("clip_ratio_c", 20.0)`, but verl's
   `ActorConfig` always carries clip_ratio_c (default 3.0), so a verl run without an explicit value
   truncates at 3, and the example script sets 10000 (no truncation in practice). Our default is
   the code's 20 (the paper, §5.4, recommends a large cap); set `is_cap`.
3. [code] A = 0 takes the A ≤ 0 branch of keep (torch.where(A > 0, ...)); its loss is 0 either way.
4. [code] The loss is the log π form verl writes (−A·sg(r)·log π); its value is not the paper's
   surrogate −r·A, only its gradient is, so loss values are not comparable to PPO's.
5. [code] Scope: per token; nothing depends on the batch, so micro-batch and global give the same.
6. [ours] As a registered rule: weights 1 (the loss type's own denominator); the loss replaces TRL's
   clipped surrogate, so TRL's ε do not act (δ is the rule's) and TRL's `delta` and loss types with a
   surrogate of their own are refused. The vLLM IS ratio multiplies ℓ (verl's `rollout_is_weights`).
   Metrics per micro-batch: rule/dropped_frac, rule/capped_frac. It trains on every valid token
   (weight 1: tokens/trained_frac = 1) and touches those outside its trust region, which keep their
   weight but get no gradient (tokens/touched_frac = rule/dropped_frac with one process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import refuse_delta, replaces_surrogate, token_advantages
from stare_lab.methods.registry import LossBatch, LossTerms, TrainerValues, register_loss
from stare_lab.methods.select import check_choice

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

# verl examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh: CLIP_DEFAULT=0.15 (dppo_tv), 0.05 (dppo_kl)
DELTAS = {"tv": 0.15, "kl": 0.05}


@dataclass(frozen=True)
class Params:
    variant: str = "tv"  # verl: loss_mode dppo_tv (its example's default) or dppo_kl
    delta: float | None = None  # None: the variant's δ (DELTAS)
    delta_low: float | None = None  # None: delta
    delta_high: float | None = None  # None: delta
    is_cap: float = 20.0  # verl core_algos.py: config.get("clip_ratio_c", 20.0) (note 2)

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, tuple(DELTAS))
        if self.delta is None:
            object.__setattr__(self, "delta", DELTAS[self.variant])
        for name in ("delta_low", "delta_high"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.delta)
        for name in ("delta", "delta_low", "delta_high"):
            value = getattr(self, name)
            if not value > 0.0:
                raise ValueError(f"{name}={value} is out of range ({name} > 0)")
        if not self.is_cap > 0.0:
            raise ValueError(f"is_cap={self.is_cap} is out of range (is_cap > 0)")


def bernoulli_kl(logp: Tensor, old_logp: Tensor) -> Tensor:
    """D [B, T]: KL(Bern(p_old) ‖ Bern(p)) of the sampled token, with verl's 1e-8 in the second term."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    p, p_old = torch.exp(logp), torch.exp(old_logp)
    return p_old * (old_logp - logp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


def kept_tokens(logp: Tensor, old_logp: Tensor, advantages: Tensor, p: Params) -> Tensor:
    """keep [B, T] bool: the tokens inside DPPO's trust region (the others get no gradient)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    logp, old_logp = logp.detach(), old_logp.detach()
    A = token_advantages(advantages, logp)
    prob, old_prob = torch.exp(logp), torch.exp(old_logp)
    assert p.delta_low is not None and p.delta_high is not None  # set in __post_init__
    if p.variant == "tv":
        positive = (prob - old_prob) <= p.delta_high
        negative = (prob - old_prob) >= -p.delta_low
    else:
        d = bernoulli_kl(logp, old_logp)
        positive = (d <= p.delta_high) | (prob <= old_prob)
        negative = (d <= p.delta_low) | (prob >= old_prob)
    return torch.where(A > 0, positive, negative)


def per_token_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> Tensor:
    """ℓ [B, T] = −A·sg(min(r, C))·log π·keep."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, logp)
    ratio = torch.exp(torch.clamp(logp - old_logp, min=-20.0, max=20.0))
    weight = torch.clamp(ratio, max=p.is_cap).detach()
    keep = kept_tokens(logp, old_logp, advantages, p).to(logp.dtype)
    return -A * weight * logp * keep


def metrics(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, p: Params) -> dict[str, float]:
    """rule/dropped_frac: valid tokens outside the trust region; rule/capped_frac: kept tokens with r > C."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = mask > 0
    n = float(valid.sum())
    if not n:
        return {"rule/dropped_frac": 0.0, "rule/capped_frac": 0.0}
    keep = kept_tokens(logp, old_logp, advantages, p)
    capped = keep & (torch.exp(logp.detach() - old_logp) > p.is_cap)
    return {
        "rule/dropped_frac": float((valid & ~keep).sum()) / n,
        "rule/capped_frac": float((valid & capped).sum()) / n,
    }


def check(p: Params, trainer: TrainerValues) -> None:
    replaces_surrogate(trainer)
    refuse_delta(trainer, "its trust region replaces the ratio clip")


@register_loss("dppo", Params, check=check)
def loss(batch: LossBatch, p: Params) -> LossTerms:
    policy = per_token_loss(batch.logp, batch.old_logp, batch.advantages, batch.mask, p)
    valid = batch.mask > 0
    keep = kept_tokens(batch.logp, batch.old_logp, batch.advantages, p)
    touched = {"outside the trust region (no gradient)": valid & ~keep}
    return LossTerms(
        policy=policy, metrics=metrics(batch.logp, batch.old_logp, batch.advantages, batch.mask, p), touched=touched
    )
