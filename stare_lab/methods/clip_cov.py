"""clip_cov: Clip-Cov, detach the gradient of a few high-covariance tokens (Cui et al., arXiv 2505.22617).

With r = π_θ/π_old (current policy), A the advantage, and means over the valid tokens of the batch the
loss sees (N of them):

    Cov_t = (A_t − mean A)·(log π_t − mean log π)                  (log π current, detached)
    C     = {t valid : lb < Cov_t < ub  and  −A·clip(r, 1−ε_low, 1+ε_high) ≤ −A·r}   (PPO's clip not active)
    D     = max(1, ⌊ρ·N⌋) tokens of C drawn uniformly at random (all of C if fewer)
    ℓ_t   = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) · (0 if t ∈ D else 1)

ℓ is the per-token loss before aggregation; a detached token keeps its place in the denominator.

Differences from the official code (PRIME-RL/Entropy-Mechanism-of-RL `verl/trainer/ppo/core_algos.py`
`compute_policy_loss_clip_cov` @8850579; ported unchanged to verl `core_algos.py`
`compute_policy_loss_clip_cov` @1dda039):
1. [ours] The random draw takes an explicit `torch.Generator`; the official code draws from torch's
   global generator (`torch.randperm`). With a generator seeded like the global one the draw is the
   same (tests/methods/test_field_cov.py checks this).
2. [ours] Cov is computed on detached log-probs; the official `cov_all` keeps the graph but only
   compares it, so values and gradients are the same.
3. [code] ⌊ρ·N⌋ is `int(ρ·N)` in floating point, as the official code (ρ·N = 4.999… floors to 4), and
   the means are `verl_F.masked_mean`'s Σ/(N + 1e-8); Cov is computed in float64 (the official code
   in the log-probs' dtype, float32 in its runs: a token within float32 rounding of lb or ub may fall
   on the other side there).
4. [code] No dual clip: neither code applies `clip_ratio_c` to Clip-Cov (the official scripts set
   clip_ratio_c = 10, but `compute_policy_loss_clip_cov` never reads it). TRL has none either.
5. [code] Scope: the official codes compute means, N and the draw per micro-batch (the tensors of one
   loss call), so the floor max(1, ·) keeps at least one token per micro-batch (issue #20 of the
   official repository: the authors approximate the global selection per GPU, "max cov tokens" on
   each GPU). `scope="microbatch"`
   is that; `scope="batch"` selects once over the generation batch from the rollout policy (r = 1,
   so PPO's clip is inactive there and C reduces to the Cov band), the paper's intent. The functions
   compute over the tensors they are given; `scope` tells the integration which tensors to give.
6. [code] The official scripts (`recipe/dapo/7b_clip_cov.sh`) set clip_ratio_low = clip_ratio_high = 1,
   so PPO's clip only filters extremes (the authors, issue #16 of the official repository): ε is the
   trainer's, and the packaged `field` sweep ships those values.
7. [ours] As a registered rule, D is a weight of 0 on TRL's clipped surrogate (normalize "valid": the
   denominator keeps D), so every TRL loss type with PPO's surrogate composes; loss types with a
   surrogate of their own (cispo, sapo, vespo) and TRL's two-sided clipping `delta` are refused (the
   official loss has no dual clip). `selected` is the trained tokens (valid, not in D), so
   tokens/selected_frac = 1 − rule/detached_frac. It trains on the tokens it does not detach and
   touches the detached ones: tokens/trained_frac = 1 − rule/detached_frac, tokens/touched_frac =
   rule/detached_frac. At scope "microbatch" the draw of every micro-batch of
   a step takes a generator seeded by (run seed, step, iteration): the same stream, other candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import clipped_surrogate, refuse_delta, refuse_own_surrogate, token_advantages
from stare_lab.methods.registry import RuleOutput, RuleState, TrainerValues, register
from stare_lab.methods.select import check_choice, check_fraction
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    import torch
    from torch import Tensor

SCOPES = ("microbatch", "batch")


@dataclass(frozen=True)
class Params:
    ratio: float = 2e-4  # verl core_algos.py: clip_cov_ratio = 0.0002; 7b_clip_cov.sh: clip_cov_ratio=0.0002 (ρ)
    lb: float = 1.0  # verl core_algos.py: clip_cov_lb = 1.0; 7b_clip_cov.sh: clip_cov_lb=1.0
    ub: float = 5.0  # verl core_algos.py: clip_cov_ub = 5.0; 7b_clip_cov.sh: clip_cov_ub=5.0
    scope: str = "microbatch"  # official codes: per loss call (note 5)

    def __post_init__(self) -> None:
        check_fraction("ratio", self.ratio)
        if not self.lb < self.ub:
            raise ValueError(f"lb={self.lb} must be below ub={self.ub} (lb < ub)")
        check_choice("scope", self.scope, SCOPES)


def covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Cov_t [B, T] = (A − mean A)(log π − mean log π), means over valid tokens; 0 on padding."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = mask > 0
    lp = logp.detach().to(torch.float64)
    A = token_advantages(advantages, logp).detach().to(torch.float64)
    zero = torch.zeros_like(lp)
    lp, A = torch.where(valid, lp, zero), torch.where(valid, A, zero)  # whatever sits on padding (NaN too)
    lp, A = lp.contiguous(), A.contiguous()  # sums in row-major order: the same for any input strides
    n = valid.sum() + 1e-8  # verl_F.masked_mean's denominator (note 3)
    cov = (A - A.sum() / n) * (lp - lp.sum() / n)
    return torch.where(valid, cov, torch.zeros_like(cov))


def clip_active(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """[B, T] bool: −A·clip(r) > −A·r, PPO's clip already bites (the official `clip_by_origin`)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    A = token_advantages(advantages, ratio)
    return -A * torch.clamp(ratio, 1 - eps_low, 1 + eps_high) > -A * ratio


def detached_tokens(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    p: Params,
    eps_low: float,
    eps_high: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """D [B, T] bool: the tokens whose gradient Clip-Cov removes, drawn from the band lb < Cov < ub."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = mask > 0
    ratio = torch.exp(logp.detach() - old_logp)
    cov = covariance(logp, advantages, mask)
    candidates = valid & ~clip_active(ratio, advantages, eps_low, eps_high) & (cov > p.lb) & (cov < p.ub)
    idx = torch.nonzero(candidates)  # row-major, as the official torch.nonzero
    out = torch.zeros_like(valid)
    if len(idx) == 0:
        return out
    k = max(int(p.ratio * float(mask.sum())), 1)
    perm = torch.randperm(len(idx), generator=generator)
    chosen = idx[perm[: min(k, len(idx))]]
    out[chosen[:, 0], chosen[:, 1]] = True
    return out


def per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    p: Params,
    eps_low: float,
    eps_high: float,
    *,
    detached: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """ℓ [B, T]: PPO's clipped surrogate times 0 on the detached tokens (drawn here unless `detached` is given)."""
    if detached is None:
        detached = detached_tokens(logp, old_logp, advantages, mask, p, eps_low, eps_high, generator)
    surrogate = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    return surrogate * (~detached).to(surrogate.dtype)


def metrics(detached: Tensor, mask: Tensor) -> dict[str, float]:
    """rule/detached_frac: |D| / N (the official `pg_clipfrac` of Clip-Cov)."""
    n = float(mask.sum())
    return {"rule/detached_frac": float(detached.sum()) / n if n else 0.0}


def check(p: Params, trainer: TrainerValues) -> None:
    """PPO's surrogate without a dual clip (note 7)."""
    refuse_own_surrogate(trainer, "detaches tokens of PPO's clipped surrogate")
    refuse_delta(trainer, "the official loss has no dual clip")


@register("clip_cov", Params, needs={"logp", "old_logp"}, check=check)
def clip_cov(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    t = state.trainer
    if t is None:
        raise ValueError("rule 'clip_cov' reads the trainer's clip ε (RuleState.trainer is None)")
    old = stats.need("old_logp", rule="clip_cov")
    gen = state.generator(f"clip_cov:{state.iteration}")
    detached = detached_tokens(stats.logp, old, stats.advantages, stats.mask, p, t.epsilon_low, t.epsilon_high, gen)
    valid = stats.valid
    kept = valid & ~detached
    return RuleOutput(weights=kept.float(), normalize="valid", metrics=metrics(detached, stats.mask), selected=kept)
