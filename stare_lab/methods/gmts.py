"""gmts: Gradient-Magnitude Token Selection (arXiv 2608.30632).

Per token, with r = π_θ/π_old, the magnitude of its contribution to the policy gradient is scored

    ω = r·A·I_clip  (+ β·π_ref/π − β with a KL term),   I_clip = 0 if (A > 0 and r > 1+ε_high)
                                                                   or (A < 0 and r < 1−ε_low), else 1
    δ = |H·ω|                       (score="token", the default)
    δ = |H·ω| / (G·|o_i|)           (score="sequence_mean": the token's share of a per-sequence mean loss)

and the top ⌈ρ·n⌉ (count="ceil", the default; ⌊ρ·n⌋ with count="floor") of the n valid tokens of
each group (the G rollouts of one prompt) by δ keep weight 1, the rest 0; ρ = 0.2.

Deviations and decisions:
1. [paper] mode "renorm": the loss is divided by the number selected (normalize="selected").
2. [code] mode "zero_advantage": outongyiLv/GMTS (verl `dp_actor.update_policy`) zeroes the
   advantage of unselected tokens and keeps the all-token denominator (normalize="valid"). The
   two modes give the same weights; they differ only in normalisation. An explicit `normalize`
   that contradicts `mode` is an error.
3. [ours] stare_lab scores once per generation batch from the rollout policy, before any update.
   r = exp(logp − old_logp) when `stats.old_logp` is given, else 1. With one update per rollout
   batch both are the same policy, so r = 1, I_clip = 1 and δ = |H·A| (+ the KL term): GMTS then
   mostly moves the token budget toward high-|A| rollouts. The official code recomputes r per
   mini-batch with the current policy, so r ≠ 1 only from the second mini-batch on.
4. [ours] eps_low, eps_high and beta are the trainer's clip ε and KL coefficient: left unset
   (None) they are read from `RuleState.trainer`; set explicitly they must agree with the
   trainer, which `Rule.check_trainer` enforces when the config is resolved. With the effective
   beta > 0 the rule reads ref_logp, which TRL computes only when its own beta > 0.
5. [ours] Candidates are all valid tokens of the group, δ = 0 included, ties broken at random
   (ties="topk"), ⌈ρ·n⌉ kept. A group with A = 0 everywhere keeps ⌈ρ·n⌉ tokens at random: they
   carry no policy gradient but count in the "selected" denominator. Metric rule/clipped_frac:
   the fraction of valid tokens with I_clip = 0.
6. [code] The official GRPO-Zero variant (outongyiLv/GMTS) keeps ⌊ρ·n⌋ tokens per group (it drops
   the ⌈(1−ρ)·n⌉ smallest δ): `count="floor"`. Under loss type "grpo" it scores ω/(G·|o_i|), the
   token's weight in the per-sequence mean loss (|o_i| = valid tokens of rollout i), which favours
   the tokens of short rollouts and so reorders rows: `score="sequence_mean"` (G here is the
   number of rows of the token's group). Neither is the default, so default numbers are
   unchanged; set both to reproduce GRPO-Zero with loss_type=grpo.
7. [code] The official verl variant (`dp_actor.update_policy`) drops δ = 0 tokens from the count,
   keeps the tokens strictly above the ⌊(1−ρ)·n⌋-th smallest δ, and assumes groups of exactly 16
   rows. Its group loop is `range(0, rows // 16, 16)`: it steps by 16 over rows // 16 block
   indices, so a mini-batch of fewer than 256 rows (in fact up to 256: range(0, k, 16) = [0] for
   k ≤ 16) runs the loop once and only its first block of 16 rows goes through the selection.
   With the paper's own Qwen3-8B script (64 rows per GPU) only one group in four is selected; the
   other three never go through GMTS's selection. Anyone comparing with the paper's numbers needs
   this: stare_lab selects in every group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import COUNTS, check_choice, check_common, check_fraction, select_top
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    from torch import Tensor

MODES = {"renorm": "selected", "zero_advantage": "valid"}
SCORES = ("token", "sequence_mean")


@dataclass(frozen=True)
class Params:
    rho: float = 0.2  # GMTS: keep the top 20% per group
    # None = the trainer's value (note 4)
    eps_low: float | None = field(default=None, metadata={"trainer": "epsilon_low"})  # clip ε_low
    eps_high: float | None = field(default=None, metadata={"trainer": "epsilon_high"})  # clip ε_high
    beta: float | None = field(default=None, metadata={"trainer": "beta"})  # KL coefficient β (0: no KL term)
    mode: str = "renorm"  # GMTS paper: "renorm"; official verl code: "zero_advantage"
    scope: str = "group"  # GMTS: per group
    ties: str = "topk"
    count: str = "ceil"  # [ours] ⌈ρ·n⌉; official GRPO-Zero: "floor" (note 6)
    score: str = "token"  # |H·ω|; official GRPO-Zero with loss_type grpo: "sequence_mean" (note 6)
    normalize: str | None = None  # None: the mode's normalisation (note 2)

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, tuple(MODES))
        if self.normalize is None:
            object.__setattr__(self, "normalize", MODES[self.mode])
        check_common(self)
        if self.normalize != MODES[self.mode]:
            raise ValueError(
                f"normalize={self.normalize!r} contradicts mode={self.mode!r} "
                f"(which normalises by {MODES[self.mode]!r})"
            )
        check_fraction("rho", self.rho)
        check_choice("count", self.count, COUNTS)
        check_choice("score", self.score, SCORES)
        if self.count == "floor" and self.ties != "topk":
            raise ValueError(f"count='floor' counts tokens, which needs ties='topk' (got ties={self.ties!r})")
        if self.eps_low is not None and not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low={self.eps_low} is out of range (0 ≤ eps_low < 1)")
        if self.eps_high is not None and not self.eps_high >= 0.0:
            raise ValueError(f"eps_high={self.eps_high} is out of range (eps_high ≥ 0)")
        if self.beta is not None and not self.beta >= 0.0:
            raise ValueError(f"beta={self.beta} is out of range (beta ≥ 0)")


def needs(p: Params, trainer=None) -> set[str]:
    # p.beta is the effective β; None only while the trainer is unknown (then no KL term is assumed)
    return {"logp", "entropy", "old_logp"} | ({"ref_logp"} if (p.beta or 0.0) > 0 else set())


def gradient_score(stats: TokenStats, p: Params) -> tuple[Tensor, Tensor]:
    """δ [B, T] (|H·ω|, or its per-sequence-mean share, note 6) and the clipped-side indicator [B, T] bool."""
    # the trainer's values are filled in before a rule runs (registry: fields with metadata "trainer")
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    assert p.eps_low is not None and p.eps_high is not None and p.beta is not None, "gmts: trainer values unset"
    A = stats.token_advantages.float()
    ratio = torch.exp(stats.logp - stats.old_logp).float() if stats.old_logp is not None else torch.ones_like(A)
    clipped = ((A > 0) & (ratio > 1 + p.eps_high)) | ((A < 0) & (ratio < 1 - p.eps_low))
    omega = torch.where(clipped, torch.zeros_like(A), ratio * A)
    if p.beta > 0:
        omega = omega + p.beta * torch.exp(stats.need("ref_logp", rule="gmts") - stats.logp).float() - p.beta
    delta = (stats.need("entropy", rule="gmts").float() * omega).abs()
    if p.score == "sequence_mean":
        length = stats.mask.sum(-1, keepdim=True)  # [B, 1] |o_i|
        rows = (stats.group[:, None] == stats.group[None, :]).sum(-1, keepdim=True)  # [B, 1] G of the group
        delta = delta / (rows * length.clamp(min=1)).to(delta.dtype)
    return torch.where(stats.valid, delta, torch.zeros_like(delta)), clipped & stats.valid


@register("gmts", Params, needs=needs)
def gmts(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    stats.require("entropy", *(["ref_logp"] if (p.beta or 0.0) > 0 else []), rule="gmts")
    delta, clipped = gradient_score(stats, p)
    keep = select_top(
        delta,
        stats.valid,
        stats.group,
        p.rho,
        scope=p.scope,
        ties=p.ties,
        generator=state.generator("gmts"),
        count=p.count,
    )
    n_valid = float(stats.valid.sum())
    metrics = {"rule/clipped_frac": float(clipped.sum()) / n_valid if n_valid else 0.0}
    return RuleOutput(
        weights=keep.float() * stats.mask, normalize=p.normalize or MODES[p.mode], metrics=metrics, selected=keep
    )
