"""kl_cov: KL-Cov, a KL penalty on the highest-covariance tokens, no ratio clipping (Cui et al., arXiv 2505.22617).

With r = π_θ/π_old (current policy), A the advantage, Cov as in Clip-Cov (means over the N valid tokens
of the batch the loss sees, plain means here) and k = max(1, ⌊ρ·N⌋):

    S   = the k valid tokens with the largest Cov_t              (log π current, detached)
    ℓ_t = −A·r + β_kl·|log π − log π_old|·[t ∈ S]                 (no clipping on any token)

ℓ is the per-token loss before aggregation; it replaces TRL's clipped surrogate.

Differences from the official code (PRIME-RL/Entropy-Mechanism-of-RL `verl/trainer/ppo/core_algos.py`
`compute_policy_loss_kl_cov` @8850579; verl's port `core_algos.py` `compute_policy_loss_kl_cov` @1dda039):
1. [code] ρ: the official function takes a percentage, `k_percent`, and its 7B script
   (`recipe/dapo/7b_kl_cov.sh`) sets k_percent = 0.2, i.e. ρ = 0.2/100 = 2e-3; its 32B script sets
   0.02 (ρ = 2e-4), and verl's port takes a fraction with default 2e-4. Our default follows the
   official 7B script, ρ = 2e-3; ρ = 2e-4 (verl, the official 32B script) is `ratio=2e-4`.
2. [ours] k = `int(N·ρ)` as verl's port; the official code computes `int(N·k_percent/100)`, which can
   differ by one in floating point where N·ρ is within rounding of an integer.
3. [code] Ties at the k-th Cov are broken as `torch.topk` breaks them (we call it on the same
   row-major vector of valid tokens, so the selection equals the official one; topk's tie order is
   not documented).
4. [code] Scope: the official codes select per micro-batch, so the floor max(1, ·) keeps one token per
   micro-batch (8 instead of 1 for 8192 tokens in 8 micro-batches at ρ = 2e-4). verl's newest code
   precomputes the mask over the whole batch (`compute_kl_cov_mask`, read here only through its test
   `tests/trainer/ppo/test_kl_cov_mask_on_cpu.py` @568072e: top max(1, int(N·ρ)) valid tokens by Cov,
   none when N = 0; which log-probs verl's caller passes was not read). `scope="microbatch"`
   (default, official) computes S inside the loss from the
   current log-probs; `scope="batch"` computes it once with `selected_tokens` over the generation
   batch (rollout log-probs) and passes it to `per_token_loss`.
5. [code] No clipping and no dual clip, although the official scripts set clip_ratio 0.2 and
   clip_ratio_c = 10: `compute_policy_loss_kl_cov` reads neither. The ratio is exp(log π − log π_old)
   without verl's ±20 clamp of the log-ratio (neither KL-Cov code clamps it).
6. [ours] A micro-batch without valid tokens selects nothing (the official code: `k = min(ρ, 0) = 0`).
7. [ours] The official PRIME code computes `k = min(k_percent, N)` and then `int(N·k/100)`, so where
   the percentage exceeds the number of valid tokens N it uses N as the percentage (100·ρ > N: only
   with ρ ≥ 1% on tiny batches; never at the scripts' 0.2%). We take ⌊ρ·N⌋ always, as verl's port.
8. [code] On-policy (π_old = π_θ, TRL's default of one update per generation) the penalty and its
   gradient are 0 (d|x|/dx = 0 at x = 0 in torch) and −A·r is GRPO's loss: KL-Cov then equals `full`.
   It acts only from the second update on a batch (TRL's steps_per_generation or num_iterations > 1),
   as the authors answer in PRIME-RL/Entropy-Mechanism-of-RL issue #1.
9. [ours] As a registered rule: the weights step picks S (`selected`, scope "microbatch" from the
   training forward's detached log-probs, scope "batch" once from the rollout policy's) and the loss
   (`loss`) replaces TRL's clipped surrogate by ℓ per token, under TRL's loss-type denominator, vLLM IS
   ratio, β·KL and entropy bonus. Loss types with a surrogate of their own and TRL's `delta` (a dual
   clip the official loss does not have) are refused. tokens/selected_frac is rule/penalised_frac;
   KL-Cov trains on every valid token (tokens/trained_frac = 1) and touches the penalised ones
   (tokens/touched_frac = rule/penalised_frac; docs/run_record.md, "Token fractions").
10. [code] β_kl (`kl_coef`) defaults differ between the two codes. The paper's own code and scripts use 1:
   PRIME-RL/Entropy-Mechanism-of-RL @8850579 sets ppo_kl_coef=1 in `recipe/dapo/7b_kl_cov.sh` and
   `32b_kl_cov.sh`, in its `verl/trainer/config/ppo_trainer.yaml` and as the function's default. verl's
   port defaults to 0.1 (`verl/workers/config/actor.py` `PolicyLossConfig.ppo_kl_coef = 0.1`, read
   @011f972); the 1.0 in verl's `compute_policy_loss_kl_cov` (@1dda039) is only the fallback when the
   config holds None. Our default is the paper scripts' 1, as ρ follows the official 7B script (note 1):
   the method as its authors ran it; `kl_coef=0.1` is verl's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import refuse_delta, replaces_surrogate, token_advantages
from stare_lab.methods.registry import LossBatch, LossTerms, RuleOutput, RuleState, TrainerValues, register
from stare_lab.methods.select import check_choice, check_fraction
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

SCOPES = ("microbatch", "batch")


@dataclass(frozen=True)
class Params:
    ratio: float = 2e-3  # official 7b_kl_cov.sh: k_percent=0.2 (%); verl core_algos.py: kl_cov_ratio = 0.0002 (note 1)
    kl_coef: float = 1.0  # β_kl: official 7b/32b_kl_cov.sh ppo_kl_coef=1; verl's PolicyLossConfig: 0.1 (note 10)
    scope: str = "microbatch"  # official codes: per loss call (note 4)

    def __post_init__(self) -> None:
        check_fraction("ratio", self.ratio)
        if not self.kl_coef >= 0.0:
            raise ValueError(f"kl_coef={self.kl_coef} is out of range (kl_coef ≥ 0)")
        check_choice("scope", self.scope, SCOPES)


def selected_tokens(logp: Tensor, advantages: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """S [B, T] bool: the max(1, ⌊ρ·N⌋) valid tokens of largest Cov (plain means over valid tokens)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = mask > 0
    out = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # row-major, whatever the input strides
    A = token_advantages(advantages, logp).detach()[valid]  # [N] row-major, as the official code
    lp = logp.detach()[valid]
    if A.numel() == 0:
        return out
    cov = (A - A.mean()) * (lp - lp.mean())
    k = max(1, int(A.numel() * ratio))
    top = torch.topk(cov, k, largest=True).indices
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][top]
    out.view(-1)[flat] = True
    return out


def per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    p: Params,
    *,
    selected: Tensor | None = None,
) -> Tensor:
    """ℓ [B, T] = −A·r + β_kl·|log π − log π_old| on S (computed here, micro-batch scope, unless given)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    if selected is None:
        selected = selected_tokens(logp, advantages, mask, p.ratio)
    A = token_advantages(advantages, logp)
    log_ratio = logp - old_logp
    return -A * torch.exp(log_ratio) + penalty_coefficient(selected, p) * log_ratio.abs()


def penalty_coefficient(selected: Tensor, p: Params) -> Tensor:
    """[B, T] the coefficient of |log π − log π_old| per token: β_kl on S, 0 elsewhere."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    return selected.to(torch.get_default_dtype()) * p.kl_coef


def metrics(selected: Tensor, mask: Tensor) -> dict[str, float]:
    """rule/penalised_frac: |S| / N."""
    n = float(mask.sum())
    return {"rule/penalised_frac": float(selected.sum()) / n if n else 0.0}


def check(p: Params, trainer: TrainerValues) -> None:
    replaces_surrogate(trainer)
    refuse_delta(trainer, "the official loss has no clip at all")


def loss(batch: LossBatch, p: Params) -> LossTerms:
    """ℓ on this micro-batch with S from the weights step (`batch.selected`)."""
    selected = batch.selected & (batch.mask > 0)
    policy = per_token_loss(batch.logp, batch.old_logp, batch.advantages, batch.mask, p, selected=selected)
    return LossTerms(policy=policy, touched={"KL-penalised (top Cov)": selected})


@register("kl_cov", Params, needs={"logp"}, loss=loss, check=check)
def kl_cov(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    selected = selected_tokens(stats.logp, stats.advantages, stats.mask, p.ratio)
    return RuleOutput(
        weights=stats.mask.clone(), normalize="valid", metrics=metrics(selected, stats.mask), selected=selected
    )
