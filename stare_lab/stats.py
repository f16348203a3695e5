"""TokenStats: every per-token tensor one generation batch yields, and the table of statistics.

B = prompts × G (rows of one prompt are contiguous), T = completion length (right-padded).
All tensors are detached statistics of the rollout policy, computed once per generation batch
before TRL shuffles and splits it into micro-batches (docs/pitfalls.md, "Where weights are computed").

The fields of `TokenStats` declared with `statistic(...)` ARE the table of statistics: a rule
declares the names it reads (`register(..., needs=...)`), the registry validates them against
`STATISTICS`, and the statistics pass (`signals.token_statistics`) computes each declared name
from its `source`. Adding a statistic is one field here plus its computation in `signals/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the command line checks rules, and the viewer refuses, before torch is imported
    from torch import Tensor

# How the statistics pass obtains a statistic (signals/statistics.py dispatches on it):
#   "vocab"     from the next-token distribution p = softmax(z/τ) at each completion position
#   "group"     from the next-token distributions of all rollouts of the same prompt
#   "attention" from the attention rows of the chosen layers (the rule declares the layers)
#   "batch"     read from TRL's generation batch under `key`
SOURCES = ("vocab", "group", "attention", "batch")


@dataclass(frozen=True)
class Statistic:
    name: str
    meaning: str
    source: str  # one of SOURCES
    key: str | None = None  # TRL's batch key, for source "batch"
    shape: str = "[B, T]"


def statistic(meaning: str, source: str, key: str | None = None, *, required: bool = False):
    """A TokenStats field that is a statistic a rule may declare (see the module docstring)."""
    if source not in SOURCES:
        raise ValueError(f"unknown statistic source {source!r}; known: {', '.join(SOURCES)}")
    meta = {"statistic": (meaning, source, key)}
    return field(metadata=meta) if required else field(default=None, metadata=meta)


@dataclass
class TokenStats:
    """One generation batch. Every statistic is a [B, T] float tensor (shape in `STATISTICS`)."""

    # a required field: `field(metadata=...)` itself, so that type checkers see no default
    logp: Tensor = field(
        metadata=statistic(
            "log π(a_t) of the sampled token at the sampling temperature (NaN where the rule did not declare it)",
            "vocab",
            required=True,
        ).metadata
    )
    mask: Tensor  # [B, T] 1 on valid completion tokens, 0 on padding
    advantages: Tensor  # [B] or [B, T] group-normalised advantage
    group: Tensor  # [B] int: prompt index of each row
    entropy: Tensor | None = statistic("predictive entropy H = -Σ_v p_v log p_v", "vocab")
    p2: Tensor | None = statistic("collision probability Σ_v p_v²", "vocab")
    p2logp: Tensor | None = statistic("Σ_v p_v² log p_v (OPEFO's full flow, methods/opefo.py)", "vocab")
    js: Tensor | None = statistic("JS(p_i,t ‖ P̄_t) to the mean over the group's live rollouts", "group")
    attn_entropy: Tensor | None = statistic(
        "normalised attention entropy AE ∈ [0, 1] at the rule's layers", "attention"
    )
    old_logp: Tensor | None = statistic(
        "log π_old(a_t); equals logp when TRL computed none (on-policy)", "batch", "old_per_token_logps"
    )
    ref_logp: Tensor | None = statistic(
        "log π_ref(a_t) (TRL computes it only with a KL term, beta > 0)", "batch", "ref_per_token_logps"
    )

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
        for name in STATISTICS:
            v = getattr(self, name)
            if v is not None and v.shape != (B, T):
                raise ValueError(f"TokenStats.{name} must be {(B, T)}, got {tuple(v.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.logp.shape
        return int(B), int(T)

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

    def need(self, name: str, *, rule: str = "") -> Tensor:
        """The statistic `name`; the ValueError of `require` when it was not computed."""
        self.require(name, rule=rule)
        value = getattr(self, name)
        assert value is not None  # require raised otherwise; the assert narrows the Optional for type checkers
        return value

    def require(self, *names: str, rule: str = "") -> None:
        """Fail with a clear message when a statistic a rule needs was not computed."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"rule {rule!r} needs TokenStats fields {missing}, which were not computed")


STATISTICS: dict[str, Statistic] = {
    f.name: Statistic(f.name, *f.metadata["statistic"]) for f in fields(TokenStats) if "statistic" in f.metadata
}


def check_known(names: frozenset[str] | set[str], who: str = "") -> None:
    """ValueError naming every name in `names` that is not a statistic of `STATISTICS` (the one check)."""
    unknown = set(names) - set(STATISTICS)
    if unknown:
        raise ValueError(f"{who}unknown statistics {sorted(unknown)}; known: {', '.join(STATISTICS)}")


def positions(mask: Tensor) -> Tensor:
    """[B, T] long: index of each token within its completion (0-based)."""
    import torch  # deferred: this module is read by refusals that must not import torch

    B, T = mask.shape
    return torch.arange(T, device=mask.device).expand(B, T)
