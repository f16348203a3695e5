"""What a rule sees and returns: the types shared by the registry, the rules and the loss.

- `TrainerValues`: the trainer's values a rule may read (clip ε, β, loss type, G, ...).
- `RuleState`: the explicit state a rule runs with (step, seed, its own memory), saved in checkpoints.
- `RuleOutput`: what a rule returns (weights, their normalisation, metrics, the selected tokens).
- `LossBatch` / `LossTerms`: what a rule that changes the per-token objective (`register(..., loss=fn)`)
  sees of one micro-batch inside the loss, and what it returns there (stare_lab.training.trl_loss.surrogate_change).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import Tensor

# the normalisations a rule may return (`RuleOutput.normalize`); the trainer passes one to the loss as its
# index here (docs/pitfalls.md, Normalisation)
NORMALIZE = ("valid", "selected", "loss_type")


@dataclass(frozen=True)
class TrainerValues:
    """The trainer values a rule may read (the values the trainer actually uses)."""

    epsilon_low: float  # clip ε_low of the surrogate (TRL `epsilon`)
    epsilon_high: float  # clip ε_high (TRL `epsilon_high`; TRL uses ε_low when it is None)
    beta: float  # KL coefficient (0: no KL term, TRL computes no ref_logp)
    loss_type: str  # TRL loss type (dapo, grpo, bnpo, dr_grpo)
    num_generations: int  # G, rollouts per prompt
    num_iterations: int | None = 1  # TRL's μ: optimizer passes over each generation batch (None: the rule's)
    delta: float | None = None  # TRL's two-sided clipping (= verl's dual clip c), None: off
    importance_sampling_level: str = "token"  # TRL's ratio per token, or per sequence (GSPO)

    @classmethod
    def from_config(cls, trainer_cfg: Any) -> TrainerValues:
        """From the `trainer` config block (a dataclass, DictConfig or dict with TRL's key names)."""

        def get(key: str):
            return (
                trainer_cfg[key]
                if isinstance(trainer_cfg, Mapping) or hasattr(trainer_cfg, "keys")
                else getattr(trainer_cfg, key)
            )

        def optional(key: str, default: Any, null: Any = None) -> Any:
            """`default` where the block has no such key (TRL's default), `null` where it is null."""
            try:
                value = get(key)
            except (KeyError, AttributeError):
                return default
            return null if value is None else value

        eps = float(get("epsilon"))
        eps_high = get("epsilon_high")
        delta = optional("delta", None)
        return cls(
            epsilon_low=eps,
            epsilon_high=eps if eps_high is None else float(eps_high),
            beta=float(get("beta")),
            loss_type=str(get("loss_type")),
            num_generations=int(get("num_generations")),
            num_iterations=None if (mu := optional("num_iterations", 1)) is None else int(mu),  # null: the rule's
            delta=None if delta is None else float(delta),
            importance_sampling_level=str(optional("importance_sampling_level", "token", "token")),
        )


@dataclass
class RuleState:
    """Explicit, small rule state; saved in and restored from the trainer checkpoint.

    step: optimizer step at which this generation batch was produced (0-based).
    total_steps: planned optimizer steps (schedules use step / total_steps).
    seed: run seed; with `step` it seeds the generator of random selections and tie breaks.
    memory: the rule's own JSON-serialisable memory (e.g. STARE's adaptive W, M); a rule updates
        it in place and the trainer saves it.
    rng: optional generator; when None, `generator()` derives one from (seed, step).
    trainer: the trainer's values (clip ε, β, loss type, G), filled by the trainer; not saved
        (a resumed trainer fills it again from its own arguments).
    step_stats: scope "microbatch" only: the whole generation batch's statistics the rule declared
        in `step_needs` (rollout policy, every rank's rows), set by the trainer once per generation
        batch, for what the official codes compute once per step (STARE's gate entropy H̄); not saved.
    iteration: which of the rule's `iterations` passes over the generation batch the weights are for
        (0 ≤ iteration < iterations; Lopti's phase); the trainer sets it; not saved.
    """

    step: int = 0
    total_steps: int = 1
    seed: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    rng: torch.Generator | None = None
    trainer: TrainerValues | None = None
    step_stats: TokenStats | None = None
    iteration: int = 0

    @property
    def progress(self) -> float:
        """Training progress in [0, 1]."""
        return min(max(self.step / max(self.total_steps - 1, 1), 0.0), 1.0)

    def generator(self, salt: str = "") -> torch.Generator:
        import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

        if self.rng is not None:
            return self.rng
        digest = hashlib.sha256(f"{self.seed}:{self.step}:{salt}".encode()).digest()
        g = torch.Generator()
        g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
        return g

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total_steps": self.total_steps, "seed": self.seed, "memory": dict(self.memory)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuleState:
        return cls(
            step=int(d["step"]), total_steps=int(d["total_steps"]), seed=int(d["seed"]), memory=dict(d["memory"])
        )


@dataclass
class RuleOutput:
    weights: Tensor  # [B, T] float, 0 where mask is 0
    normalize: str  # "valid" | "selected" | "loss_type"
    metrics: dict[str, float] = field(default_factory=dict)
    # [B, T] bool: the rule's selected subset (metrics; a loss-changing rule reads it back in its loss as
    # `LossBatch.selected`, e.g. KL-Cov's penalised tokens); None = all valid
    selected: Tensor | None = None


@dataclass
class LossBatch:
    """What a loss-changing rule's `loss` sees of one micro-batch (one loss call)."""

    logp: Tensor  # [B, T] current policy, with grad
    old_logp: Tensor  # [B, T] π_old (= logp detached on-policy, TRL's choice)
    advantages: Tensor  # [B] or [B, T]
    mask: Tensor  # [B, T] the loss's mask
    entropy: Tensor  # [B, T] the current policy's entropy (detached; TRL's forward computes it)
    selected: Tensor  # [B, T] bool: the rule's `selected` for these rows (its weights' output)
    trainer: TrainerValues
    ref_logp: Tensor | None = None  # [B, T] when β > 0 (TRL computes it then only)


@dataclass
class LossTerms:
    """A rule's change to the per-token objective of one micro-batch.

    policy: [B, T] the per-token policy loss in place of PPO's clipped surrogate; like it, it is
        multiplied by the rule's weights (and TRL's off-policy mask and vLLM IS ratio) and aggregated
        with the loss type's denominator.
    own: 0-dim, a term with a denominator of its own, added once per micro-batch (divided only by the
        gradient accumulation, as TRL's entropy bonus) — Archer's KL means over its token sets.
    drops_kl: TRL's β·KL term is left out (the rule's `own` replaces it).
    metrics: per-micro-batch values to log (averaged over micro-batches and ranks).
    touched: {what the rule does to them: [B, T] bool} — the tokens whose objective differs from PPO's
        and how (Archer's "wide clip, no KL"), for the token viewer.
    """

    policy: Tensor
    own: Tensor | None = None
    drops_kl: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    touched: dict[str, Tensor] = field(default_factory=dict)
