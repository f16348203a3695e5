"""TokenStats: every per-token tensor one generation batch yields.

B = prompts × G (rows of one prompt are contiguous), T = completion length (right-padded).
All tensors are detached statistics of the rollout policy, computed once per generation batch
before TRL shuffles and splits it into micro-batches (METHODS.md §1).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass
class TokenStats:
    logp: Tensor                      # [B, T] log π(a_t) of the sampled token, at the sampling temperature
    mask: Tensor                      # [B, T] 1 on valid completion tokens, 0 on padding
    advantages: Tensor                # [B] or [B, T] group-normalised advantage
    group: Tensor                     # [B] int: prompt index of each row
    entropy: Tensor | None = None     # [B, T] predictive entropy H = -Σ_v p_v log p_v
    attn_entropy: Tensor | None = None  # [B, T] normalised attention entropy AE ∈ [0, 1]
    js: Tensor | None = None          # [B, T] JS(p_i,t ‖ P̄_t) to the group mean over live rollouts
    old_logp: Tensor | None = None    # [B, T] log π_old(a_t) (equals logp when on-policy)
    ref_logp: Tensor | None = None    # [B, T] log π_ref(a_t) (only with a KL term)
    p2: Tensor | None = None          # [B, T] Σ_v p_v²  (collision probability)
    p2logp: Tensor | None = None      # [B, T] Σ_v p_v² log p_v  (OPEFO's full flow, METHODS.md §0)

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"TokenStats.logp must be [B, T], got shape {tuple(self.logp.shape)}")
        B, T = self.logp.shape
        self.mask = self.mask.to(self.logp.dtype)
        if self.mask.shape != (B, T):
            raise ValueError(f"TokenStats.mask must be {(B, T)}, got {tuple(self.mask.shape)}")
        if self.group.shape != (B,):
            raise ValueError(f"TokenStats.group must be [{B}], got {tuple(self.group.shape)}")
        if self.advantages.shape not in {(B,), (B, T)}:
            raise ValueError(f"TokenStats.advantages must be [B] or [B, T], got {tuple(self.advantages.shape)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in {"logp", "mask", "advantages", "group"} and v is not None and v.shape != (B, T):
                raise ValueError(f"TokenStats.{f.name} must be {(B, T)}, got {tuple(v.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.logp.shape)

    @property
    def token_advantages(self) -> Tensor:
        """[B, T] advantage of every token (a [B] advantage broadcast along the row)."""
        a = self.advantages
        return a[:, None].expand(self.shape) if a.dim() == 1 else a

    @property
    def valid(self) -> Tensor:
        """[B, T] bool mask of valid completion tokens."""
        return self.mask > 0

    @property
    def surprisal(self) -> Tensor:
        """[B, T] s = -log π."""
        return -self.logp

    def require(self, *names: str, rule: str = "") -> None:
        """Fail with a clear message when a statistic a rule needs was not computed."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"rule {rule!r} needs TokenStats fields {missing}, which were not computed")


def positions(mask: Tensor) -> Tensor:
    """[B, T] long: index of each token within its completion (0-based)."""
    B, T = mask.shape
    return torch.arange(T, device=mask.device).expand(B, T)
