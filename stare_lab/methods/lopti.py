"""lopti: Low-Probability Token Isolation, two updates per generation batch (arXiv 2505.12929).

With π_old the rollout policy's probability of the sampled token and η the threshold, one generation
batch is trained twice, one full optimizer pass (all its mini-batches) after the other:

    phase 1: ω_t = 1 if π_old(a_t) < η else 0        (low-probability tokens first)
    phase 2: ω_t = 1 if π_old(a_t) ≥ η else 0        (then the rest)

ω multiplies each token's whole loss (surrogate, KL and entropy terms); the denominator still counts
every valid token. Old log-probs are not recomputed between the phases. Composes with adv_reweight.

Differences from the official code (zhyang2226/AR-Lopti `verl/trainer/ppo/ray_trainer.py`
`RayPPOTrainer.fit`, the `seperate_updating` block, @cbeb333):
1. [code] The official code zeroes the advantage of the other phase's tokens (`torch.where(indication,
   A, 0)`) and multiplies the KL and entropy terms by `kl_entropy_mask`, keeping `response_mask` as the
   denominator. A 0/1 weight on the token's whole loss is the same: the clipped surrogate (and dual
   clip) of A = 0 is 0 with zero gradient.
2. [code] A negative threshold in the official code (`seperate_prob < 0`) updates the high-probability
   tokens first: `order="high_first"`. Its "portion" mode (`seperate_prob = 0`, a quantile of π_old)
   is not offered.
3. [code] η = 0.5 (`SEPERATE_PROB=0.5` in the AR and AR+Lopti scripts; the Lopti-only script uses 0.4).
4. [code] Scope: the generation batch; π_old from the old log-probs computed once after rollout.
   The two phases are two optimizer passes: the trainer must run them (a trainer change).
5. [ours] The official metrics of the two updates are averaged; ours report each phase's token
   fraction (rule/phase1_frac, rule/phase2_frac) over the valid tokens. The official
   `actor/sep_portion` counts padding positions in its numerator (the threshold is applied to the
   whole old-log-prob tensor, padding included, and divided by the valid count), so it can exceed 1;
   its weights are right all the same, since padding is masked out of every loss.
6. [ours] As a registered rule (`iterations=2`): the trainer's num_iterations is 2 (null resolves to it),
   so TRL trains every generation batch twice without recomputing the old log-probs, and
   `RuleState.iteration` is the phase. The weights are computed inside the loss (scope "token") from
   TRL's own π_old (`old_per_token_logps`, which TRL computes with two iterations): no extra forward.
   `trainer.max_steps` counts optimizer steps, so a Lopti run sees half the generation batches of a
   one-update rule at the same max_steps (the packaged `field` sweep doubles its max_steps).
7. [ours] ω multiplies TRL's surrogate (the weight slot), not TRL's β·KL, which TRL adds after it:
   β > 0 is refused. TRL's entropy bonus averages over each phase's tokens (the official code divides
   by every valid token), a difference only with entropy_coef > 0.
8. [code] With adv_reweight (AR+Lopti, the official `compute_reweight_advantage` before the phase
   split): `alpha` > 0 multiplies ω by adv_reweight's w (α = 0.3 in the AR+Lopti script; 0: Lopti alone),
   τ = 1 − α and neg_weight 1 as adv_reweight's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.adv_reweight import Params as AdvReweightParams
from stare_lab.methods.adv_reweight import advantage_weights
from stare_lab.methods.ppo import clipped_surrogate, refuse_own_surrogate
from stare_lab.methods.registry import RuleOutput, RuleState, TrainerValues, register
from stare_lab.methods.select import check_choice, check_fraction
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

ORDERS = ("low_first", "high_first")
PHASES = 2


@dataclass(frozen=True)
class Params:
    eta: float = 0.5  # AR-Lopti scripts/train_kklogic_AR-Lopti_4x80GB.sh: SEPERATE_PROB=0.5 (η)
    order: str = "low_first"  # official: a positive SEPERATE_PROB updates the low-probability tokens first
    alpha: float = 0.0  # adv_reweight's α composed in (note 8); train_kklogic_AR-Lopti_4x80GB.sh: REWEIGHT_K=0.3
    scope: str = "token"  # [ours] in the loss from TRL's π_old (note 6)

    def __post_init__(self) -> None:
        if not 0.0 < self.eta < 1.0:
            raise ValueError(f"eta={self.eta} is out of range (0 < eta < 1)")
        check_choice("order", self.order, ORDERS)
        check_fraction("alpha", self.alpha, open_low=False)
        check_choice("scope", self.scope, ("token",))


def first_phase_tokens(old_logp: Tensor, p: Params) -> Tensor:
    """[B, T] bool: the official `indication`, π_old < η (low_first) or π_old ≥ η (high_first)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    prob = torch.exp(old_logp.detach())  # compared in probability, as the official code
    return prob < p.eta if p.order == "low_first" else prob >= p.eta


def phase_weights(old_logp: Tensor, mask: Tensor, p: Params, phase: int) -> Tensor:
    """ω [B, T] for phase 0 or 1: 1 on that phase's valid tokens, 0 elsewhere."""
    if phase not in (0, 1):
        raise ValueError(f"phase={phase} is out of range (0 or 1)")
    first = first_phase_tokens(old_logp, p)
    chosen = first if phase == 0 else ~first
    return (chosen & (mask > 0)).to(old_logp.dtype)


def per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    p: Params,
    phase: int,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    *,
    rollout_logp: Tensor | None = None,
) -> Tensor:
    """ℓ [B, T] of one phase: ω·(PPO's clipped surrogate); ω from `rollout_logp` when given, else `old_logp`."""
    base = old_logp if rollout_logp is None else rollout_logp
    return phase_weights(base, mask, p, phase) * clipped_surrogate(
        logp, old_logp, advantages, eps_low, eps_high, dual_clip
    )


def metrics(old_logp: Tensor, mask: Tensor, p: Params) -> dict[str, float]:
    """rule/phase1_frac and rule/phase2_frac: each phase's share of the valid tokens."""
    n = float(mask.sum())
    if not n:
        return {"rule/phase1_frac": 0.0, "rule/phase2_frac": 0.0}
    return {f"rule/phase{k + 1}_frac": float(phase_weights(old_logp, mask, p, k).sum()) / n for k in range(PHASES)}


def check(p: Params, trainer: TrainerValues) -> None:
    refuse_own_surrogate(trainer, "its phase weights zero A in PPO's surrogate")
    if trainer.beta != 0.0:
        raise ValueError(
            f"the official phases also mask the KL term, which TRL adds after the weights: trainer.beta={trainer.beta} "
            "(use beta 0)"
        )


@register("lopti", Params, needs={"logp", "old_logp"}, iterations=PHASES, check=check)
def lopti(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    old = stats.need("old_logp", rule="lopti")
    w = phase_weights(old, stats.mask, p, state.iteration).float()
    if p.alpha > 0:
        w = w * advantage_weights(old, stats.advantages, stats.mask, AdvReweightParams(alpha=p.alpha))
    out = metrics(old, stats.mask, p)
    out["rule/phase"] = float(state.iteration + 1)
    return RuleOutput(weights=w.float(), normalize="valid", metrics=out, selected=(w > 0) & stats.valid)
