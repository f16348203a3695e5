"""archer: dual-token constraints, entropy-dependent clip and KL (Archer, arXiv 2507.15778).

Per response i, q_i = the q-quantile (linear interpolation) of the current policy's entropy H over its
valid tokens; high = {H > q_i}, low = {H ≤ q_i} (valid tokens only). With r = π_θ/π_old (log r
clamped to ±20) and k3_t = clamp(π_ref/π − log(π_ref/π) − 1, −10, 10) (log(π_ref/π) clamped to ±20):

    pg_t = max(−A·r, −A·clip(r, 1 − ε_t^low, 1 + ε_t^high)),  ε_t = 0.5/0.5 on high, 0.2/0.2 on low
    pg_t = min(pg_t, −A·c)  where A < 0                                    (dual clip, c = 10)
    L    = mean_valid(pg) + β·Σ_low k3 / |low| + β_high·Σ_high k3 / |high|    (β_high = 0)

The KL has its own denominators (each token set of the micro-batch). `per_token_loss` writes L as
a per-token loss whose token mean over the micro-batch's valid tokens is L:
ℓ_t = pg_t + κ_t·k3_t with κ_t = β·N/(|low| + 1e-8) on low, β_high·N/(|high| + 1e-8) on high.

Differences from the official code (wizard-III/ArcherCodeR `verl/workers/actor/dp_actor.py`
`DataParallelPPOActor.update_policy` and `verl/trainer/ppo/core_algos.py` `compute_policy_loss`,
`kl_penalty`, @8a1785b):
1. [code] The official masks are named the other way round: `high_entropy_mask` holds the tokens with
   H ≤ q (its comment: "only low entropy token is True") and `low_entropy_mask` those with H > q, and
   `compute_policy_loss` gives `high_entropy_mask` the `low_entropy_clip_ratio_*`. The two swaps
   cancel: high-entropy tokens get the wide clip (0.5) and no KL, low-entropy tokens the tight clip
   (0.2) and the KL, which is also what the paper describes. Our default follows that behaviour;
   `invert=True` is the code read by its names (high-entropy tokens tight and KL-penalised).
2. [code] Scope: the quantile is per response (`torch.nanquantile(..., dim=-1)`); the KL denominators
   are the token sets of one micro-batch, and the official script uses one response per micro-batch
   (`micro_batch_size_per_gpu=1`), so they are per response there. Pass one response's rows to
   `kl_coefficients` to reproduce that; pass a larger micro-batch for verl's behaviour at that size.
3. [code] Entropy is the current policy's, from the training forward, detached (`calculate_entropy =
   True` always in the official actor; TRL 1.16's `_compute_loss` computes it too). A response with
   no valid token has q = NaN and no token in either set.
4. [code] β = `kl_coef`, the script's kl_loss_coef = 0.001 (kl_loss_type low_var_kl = k3), and
   β_high = high_entropy_kl_loss_scale_coef = 0.0. The rule's KL replaces TRL's β·k3 term (the
   integration switches TRL's off); TRL's k3 is not clamped, verl's is (to ±10, with log(π_ref/π)
   clamped to ±20), and `k3` here is verl's.
5. [code] `low_entropy_clip_ratio_high` falls back to clip_ratio_*low* in the official actor when
   unset; the script sets all four widths, which are our defaults.
6. [code] Token-mean aggregation of the surrogate over the micro-batch (the script's
   loss_agg_mode=token-mean); the integration must keep the loss type's denominator for pg only.
7. [ours] As a registered rule: pg replaces TRL's clipped surrogate (under the loss type's denominator,
   the vLLM IS ratio and the entropy bonus), and the KL means, with their own denominators (each token
   set of the micro-batch), replace TRL's β·KL term (`LossTerms.own`, divided only by the gradient
   accumulation). β is the trainer's (`kl_coef` stands for trainer.beta): TRL computes the reference
   log-probs only with β > 0, so with the STARE recipe's β = 0 Archer is its clip part alone, and
   high_kl_coef > 0 needs β > 0 (refused otherwise). β = 0 is accepted, not refused: the official actor
   runs it too (`use_kl_loss=False` skips its whole KL block, reference log-probs included), and the
   paper's method is its clip part plus the low-entropy KL, so β = 0 is an ablation of Archer, which
   `method: all` runs on the default recipe; Archer as published is β = 0.001 (the field sweep's). The
   entropy is TRL's own of the loss's forward (free). TRL's `delta`
   is refused (the rule applies its dual clip), as are loss types with a surrogate of their own.
   `selected` (weights step, rollout policy) is every valid token: the sets are the current policy's,
   per micro-batch; the loss logs rule/widened_frac and rule/penalised_frac.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stare_lab.methods.ppo import clipped_surrogate, refuse_delta, replaces_surrogate
from stare_lab.methods.registry import LossBatch, LossTerms, TrainerValues, register_loss
from stare_lab.methods.select import check_fraction

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor


@dataclass(frozen=True)
class Params:
    q: float = 0.8  # ArcherCodeR run_archer_qwen2.5_1.5b_code.sh: token_entropy_quantile=0.8
    eps_low_tight: float = 0.2  # script: low_entropy_clip_ratio_low=0.2 (low-entropy tokens)
    eps_high_tight: float = 0.2  # script: low_entropy_clip_ratio_high=0.2
    eps_low_wide: float = 0.5  # script: high_entropy_clip_ratio_low=0.5 (high-entropy tokens)
    eps_high_wide: float = 0.5  # script: high_entropy_clip_ratio_high=0.5
    dual_clip: float = 10.0  # script: actor.clip_ratio_c=10.0
    # script: kl_loss_coef=0.001 (β, on low-entropy tokens); None: the trainer's β (note 7)
    kl_coef: float | None = field(default=None, metadata={"trainer": "beta"})
    high_kl_coef: float = 0.0  # script: high_entropy_kl_loss_scale_coef=0.0 (β_high)
    invert: bool = False  # True: the official masks read by their names (note 1)

    def __post_init__(self) -> None:
        if not 0.0 < self.q < 1.0:
            raise ValueError(f"q={self.q} is out of range (0 < q < 1)")
        for name in ("eps_low_tight", "eps_low_wide"):
            check_fraction(name, getattr(self, name), open_low=False)
        for name in ("eps_high_tight", "eps_high_wide", "kl_coef", "high_kl_coef"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0.0:
                raise ValueError(f"{name}={getattr(self, name)} is out of range ({name} ≥ 0)")
        if not self.dual_clip > 1.0:
            raise ValueError(f"dual_clip={self.dual_clip} is out of range (dual_clip > 1)")


def entropy_sets(entropy: Tensor, mask: Tensor, p: Params) -> tuple[Tensor, Tensor]:
    """(widened, penalised) [B, T] bool: valid tokens above / at or below their response's q-quantile of H.

    `invert` swaps the two (note 1).
    """
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = mask > 0
    masked = torch.where(valid, entropy.detach(), torch.full_like(entropy, float("nan")))
    q = torch.nanquantile(masked, q=p.q, dim=-1, keepdim=True)  # [B, 1], NaN for an empty row
    high, low = (masked > q) & valid, (masked <= q) & valid
    return (low, high) if p.invert else (high, low)


def clip_widths(penalised: Tensor, p: Params) -> tuple[Tensor, Tensor]:
    """(ε_low, ε_high) [B, T]: the tight widths on `penalised`, the wide ones elsewhere (padding too, as verl)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    wide = (~penalised).to(torch.float64)
    eps_low = wide * p.eps_low_wide + (1 - wide) * p.eps_low_tight
    eps_high = wide * p.eps_high_wide + (1 - wide) * p.eps_high_tight
    return eps_low, eps_high


def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """verl's low_var_kl [B, T]: clamp(e^x − x − 1, −10, 10), x = clamp(log π_ref − log π, −20, 20)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    x = torch.clamp(ref_logp - logp, min=-20, max=20)
    return torch.clamp(torch.exp(x) - x - 1, min=-10, max=10)


def kl_coefficients(widened: Tensor, penalised: Tensor, mask: Tensor, p: Params) -> Tensor:
    """κ [B, T]: the per-token KL coefficient whose token mean over the valid tokens is Archer's KL term.

    β·N/(|penalised| + 1e-8) on `penalised`, β_high·N/(|widened| + 1e-8) on `widened` (verl's masked_mean).
    """
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    n = float((mask > 0).sum())
    if p.kl_coef is None:
        raise ValueError("kl_coef is unset (= the trainer's β): pass the trainer's value")
    kappa = p.kl_coef * n / (float(penalised.sum()) + 1e-8)
    kappa_widened = p.high_kl_coef * n / (float(widened.sum()) + 1e-8)
    return penalised.to(torch.float64) * kappa + widened.to(torch.float64) * kappa_widened


def per_token_loss(
    logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantages: Tensor, mask: Tensor, entropy: Tensor, p: Params
) -> Tensor:
    """ℓ [B, T] = pg_t + κ_t·k3_t; its mean over the valid tokens of these tensors is the official loss."""
    widened, penalised = entropy_sets(entropy, mask, p)
    eps_low, eps_high = clip_widths(penalised, p)
    pg = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, p.dual_clip, clamp_log_ratio=True)
    return pg + kl_coefficients(widened, penalised, mask, p).to(pg.dtype) * k3(logp, ref_logp)


def metrics(entropy: Tensor, mask: Tensor, p: Params) -> dict[str, float]:
    """rule/widened_frac: valid tokens with the wide clip and no KL; rule/penalised_frac: those with the KL."""
    n = float(mask.sum())
    if not n:
        return {"rule/widened_frac": 0.0, "rule/penalised_frac": 0.0}
    widened, penalised = entropy_sets(entropy, mask, p)
    return {"rule/widened_frac": float(widened.sum()) / n, "rule/penalised_frac": float(penalised.sum()) / n}


def check(p: Params, trainer: TrainerValues) -> None:
    replaces_surrogate(trainer)
    refuse_delta(trainer, "applies its own dual clip (dual_clip)")
    if p.high_kl_coef > 0 and trainer.beta == 0:
        raise ValueError(
            f"high_kl_coef={p.high_kl_coef} needs reference log-probs, which TRL computes only with trainer.beta > 0"
        )


@register_loss("archer", Params, check=check)
def loss(batch: LossBatch, p: Params) -> LossTerms:
    """pg per token; the two KL means over this micro-batch's token sets as `own` (TRL's β·KL dropped)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    widened, penalised = entropy_sets(batch.entropy, batch.mask, p)
    eps_low, eps_high = clip_widths(penalised, p)
    pg = clipped_surrogate(
        batch.logp, batch.old_logp, batch.advantages, eps_low, eps_high, p.dual_clip, clamp_log_ratio=True
    )
    own = None
    if batch.ref_logp is not None:
        kl = k3(batch.logp, batch.ref_logp)
        zero = torch.zeros_like(kl)
        # summed in row-major order (.contiguous()): the same for any input strides
        low = torch.where(penalised, kl, zero).contiguous().sum() / (penalised.sum() + 1e-8)
        high = torch.where(widened, kl, zero).contiguous().sum() / (widened.sum() + 1e-8)
        assert p.kl_coef is not None  # filled from the trainer
        own = p.kl_coef * low + p.high_kl_coef * high
    terms = metrics(batch.entropy, batch.mask, p)
    touched = {"wide clip, no KL (high entropy)": widened, "tight clip + KL (low entropy)": penalised}
    return LossTerms(policy=pg.to(batch.logp.dtype), own=own, drops_kl=True, metrics=terms, touched=touched)
