"""The rule registry: a dict and a decorator (verl's `register_policy_loss` is the right size).

A rule is a frozen `Params` dataclass plus one function `fn(stats, state, params) -> RuleOutput`,
registered with what it reads: `needs` (names from `stare_lab.stats.STATISTICS`) and, when it
reads attention entropy, `attn_layers` (which layers). Nothing outside `stare_lab/methods/`
knows a rule's name: the trainer asks `get_method` and the rule's declarations.

A Params field may stand for a trainer value (GMTS's clip ε and β): declare it
`field(default=None, metadata={"trainer": "<TrainerValues field>"})`. None means "the trainer's
value", filled in from `RuleState.trainer` before the rule runs; an explicit value must agree
with the trainer (`Rule.check_trainer`, called when the config is resolved and by the trainer).

A rule may change the loss, not only weight it (the field's methods, docs/field.md): `register(...,
loss=fn)` with `fn(batch: LossBatch, params) -> LossTerms` gives a per-token policy term that
replaces PPO's clipped surrogate (KL-Cov's −A·r plus its penalty, DPPO, CE-GPPO, Archer's
per-token clip), optionally a term with its own denominator (Archer's KL) in place of TRL's β·KL.
It is evaluated inside the loss with the current log-probs (with grad); the rule's weights still
multiply it, and everything else stays TRL's (trl_loss.surrogate_change). `iterations=k`: the rule
trains each generation batch k times with different weights (Lopti's two phases): its weights are
computed once per iteration (`RuleState.iteration`) and the trainer's `num_iterations` is k.
`check=fn(params, trainer)` refuses, with one line, a trainer setting the rule does not compose with.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stare_lab.stats import TokenStats, check_known

if TYPE_CHECKING:  # annotations only: the command line checks rules before torch is imported
    from torch import Tensor

# the normalisations a rule may return; the trainer passes one to the loss as its index here
NORMALIZE = ("valid", "selected", "loss_type")
SCOPES = ("batch", "group", "sequence", "microbatch")  # microbatch: stare_lab/microbatch.py
TIES = ("topk", "quantile")


# TRL 1.16's loss types whose policy term is PPO's clipped surrogate (the others have their own)
PPO_SURROGATE_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


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


# A declaration is a constant or a function. `needs` functions get (params, trainer): the Params
# with trainer-valued fields filled in where the trainer is known (None where it is not), and the
# TrainerValues or None (a rule that delegates to another rule passes it on).
NeedsSpec = Iterable[str] | Callable[[Any, "TrainerValues | None"], Iterable[str]]
LayersSpec = Callable[[Any], int | Iterable[int] | None] | None


@dataclass(frozen=True)
class _Entry:
    name: str
    params_cls: type
    fn: Callable[[TokenStats, RuleState, Any], RuleOutput]
    needs: NeedsSpec
    attn_layers: LayersSpec
    step_needs: NeedsSpec = ()
    loss: Callable[[LossBatch, Any], LossTerms] | None = None
    iterations: int = 1
    check: Callable[[Any, TrainerValues], None] | None = None


_REGISTRY: dict[str, _Entry] = {}


def register(
    name: str,
    params_cls: type,
    needs: NeedsSpec = (),
    attn_layers: LayersSpec = None,
    step_needs: NeedsSpec = (),
    *,
    loss: Callable[[LossBatch, Any], LossTerms] | None = None,
    iterations: int = 1,
    check: Callable[[Any, TrainerValues], None] | None = None,
):
    """Decorator: register `fn(stats, state, params) -> RuleOutput` under `name`.

    needs: the statistics the rule reads (names of `STATISTICS`, `logp` included), or a function
        `needs(params, trainer)` returning them.
    attn_layers: for a rule that reads `attn_entropy`, a function of its Params returning the
        layer index or indices (None = the middle layer); the statistics pass averages over them.
    step_needs: scope "microbatch": the statistics of the whole generation batch the rule reads once per
        step (`RuleState.step_stats`), as `needs` (a constant or a function); the trainer computes them at
        generation time from the cheapest source.
    loss: `loss(batch, params) -> LossTerms`, for a rule that changes the per-token objective (module docstring).
    iterations: passes over each generation batch, each with its own weights (`RuleState.iteration`).
    check: `check(params, trainer)` raising a one-line ValueError for a trainer setting it does not compose with.
    """
    if not dataclasses.is_dataclass(params_cls):
        raise TypeError(f"Params of rule {name!r} must be a dataclass")
    trainer_keys = {f.name for f in dataclasses.fields(TrainerValues)}
    for f in dataclasses.fields(params_cls):
        key = f.metadata.get("trainer")
        if key is not None and key not in trainer_keys:
            raise ValueError(
                f"rule {name!r}: parameter {f.name!r} names unknown trainer value {key!r}; "
                f"known: {', '.join(sorted(trainer_keys))}"
            )
    if not callable(needs):
        needs = frozenset(needs)
        _check_needs(name, needs)
    if not callable(step_needs):
        step_needs = frozenset(step_needs)
        _check_needs(name, step_needs)

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"token rule {name!r} is registered twice")
        if iterations < 1:
            raise ValueError(f"rule {name!r}: iterations={iterations} (at least 1)")
        _REGISTRY[name] = _Entry(name, params_cls, fn, needs, attn_layers, step_needs, loss, iterations, check)
        return fn

    return deco


def _check_needs(name: str, needs: frozenset[str]) -> None:
    check_known(needs, f"rule {name!r} declares ")


def trainer_params(params_cls: type) -> dict[str, str]:
    """{param name: TrainerValues field} of the Params fields that stand for trainer values."""
    return {f.name: f.metadata["trainer"] for f in dataclasses.fields(params_cls) if "trainer" in f.metadata}


class Rule:
    """A configured rule: `rule(stats, state) -> RuleOutput`."""

    def __init__(self, entry: _Entry, params: Any):
        self.name = entry.name
        self.params = params
        self._entry = entry

    def effective_params(self, trainer: TrainerValues | None, *, strict: bool = True) -> Any:
        """Params with every unset trainer-valued field set to the trainer's value.

        strict: an unset field with no trainer to fill it is a ValueError (else it stays None).
        """
        fill = {}
        for name, key in trainer_params(type(self.params)).items():
            if getattr(self.params, name) is not None:
                continue
            if trainer is not None:
                fill[name] = getattr(trainer, key)
            elif strict:
                raise ValueError(
                    f"rule {self.name!r}: {name} is unset (= the trainer's {key}) and no trainer "
                    f"values were given (RuleState.trainer is None)"
                )
        return dataclasses.replace(self.params, **fill) if fill else self.params

    def check_trainer(self, values: TrainerValues) -> None:
        """ValueError (one line) when an explicitly set trainer-valued parameter disagrees with the trainer,
        or the trainer's settings do not compose with what the rule changes in the loss."""
        for name, key in trainer_params(type(self.params)).items():
            mine, theirs = getattr(self.params, name), getattr(values, key)
            if mine is not None and mine != theirs:
                raise ValueError(
                    f"rule {self.name!r}: {name}={mine} but trainer.{key}={theirs} "
                    f"(leave it unset to use the trainer's)"
                )
        if self.changes_loss:
            if values.loss_type not in PPO_SURROGATE_LOSS_TYPES:
                raise ValueError(
                    f"rule {self.name!r} replaces PPO's clipped surrogate, but trainer.loss_type={values.loss_type} "
                    f"has a surrogate of its own (use one of {', '.join(PPO_SURROGATE_LOSS_TYPES)})"
                )
            if values.importance_sampling_level != "token":
                raise ValueError(
                    f"rule {self.name!r} has a per-token ratio, but importance_sampling_level="
                    f"{values.importance_sampling_level} makes TRL's ratio per sequence (use 'token')"
                )
        if self.iterations > 1 and values.num_iterations not in (None, self.iterations):
            raise ValueError(
                f"rule {self.name!r} trains each generation batch {self.iterations} times with different "
                f"weights, but trainer.num_iterations={values.num_iterations} (set it to {self.iterations}, or null)"
            )
        check = self._entry.check
        if check is not None:
            try:
                check(self.effective_params(values), values)
            except ValueError as e:
                raise ValueError(f"rule {self.name!r}: {e}") from None

    @property
    def changes_loss(self) -> bool:
        """The rule changes the per-token objective (`loss_terms`), not only weights it."""
        return self._entry.loss is not None

    @property
    def iterations(self) -> int:
        """Passes over each generation batch with weights of their own (Lopti: 2); 1 for most rules."""
        return self._entry.iterations

    def loss_terms(self, batch: LossBatch) -> LossTerms:
        """The rule's change to one micro-batch's per-token objective (only for `changes_loss`)."""
        if self._entry.loss is None:
            raise LookupError(f"rule {self.name!r} does not change the loss (it only weights it)")
        terms = self._entry.loss(batch, self.effective_params(batch.trainer))
        if terms.policy.shape != batch.mask.shape:
            raise RuntimeError(
                f"rule {self.name!r} returned a policy term of shape {tuple(terms.policy.shape)}, "
                f"expected {tuple(batch.mask.shape)}"
            )
        return terms

    def needs_for(self, trainer: TrainerValues | None = None) -> frozenset[str]:
        """The statistics this rule reads with these trainer values (None: trainer unknown)."""
        return self._declared(self._entry.needs, trainer)

    def step_needs_for(self, trainer: TrainerValues | None = None) -> frozenset[str]:
        """Scope "microbatch": the statistics of the whole generation batch it reads once per step (`step_stats`)."""
        return self._declared(self._entry.step_needs, trainer)

    def _declared(self, n: NeedsSpec, trainer: TrainerValues | None) -> frozenset[str]:
        if not callable(n):
            return frozenset(n)  # register made it one already
        names = frozenset(n(self.effective_params(trainer, strict=False), trainer))
        _check_needs(self.name, names)
        return names

    @property
    def needs(self) -> frozenset[str]:
        """The statistics this rule reads, trainer values unknown (see `needs_for`)."""
        return self.needs_for(None)

    @property
    def attn_layers(self) -> tuple[int, ...] | None:
        """Layers whose attention entropy the rule reads, as the rule declared them (None = the middle layer)."""
        spec = self._entry.attn_layers
        layers = spec(self.params) if spec is not None else None
        if layers is None:
            return None
        return (layers,) if isinstance(layers, int) else tuple(layers)

    def __call__(self, stats: TokenStats, state: RuleState) -> RuleOutput:
        out = self._entry.fn(stats, state, self.effective_params(state.trainer))
        w = out.weights
        if w.shape != stats.shape:
            raise RuntimeError(f"rule {self.name!r} returned weights of shape {tuple(w.shape)}, expected {stats.shape}")
        out.weights = torch.where(stats.valid, w, torch.zeros_like(w)).float()
        if out.normalize not in NORMALIZE:
            raise RuntimeError(f"rule {self.name!r} returned normalize={out.normalize!r}")
        return out

    def __repr__(self) -> str:
        return f"Rule({self.name}, {self.params})"


def list_methods() -> list[str]:
    """Registered rule names in registration order: the order of `stare_lab/methods/__init__.py`,
    then rules registered from outside the package (entry points of `stare_lab.rules` in package
    order, modules imported by `imports:` / `--import` in import order; stare_lab.rule_imports)."""
    _load_entry_points()
    return list(_REGISTRY)


def method_params(name: str) -> type:
    return _lookup(name).params_cls


def method_iterations(name: str) -> int:
    """Passes over each generation batch the rule trains (`register(iterations=...)`): what a null
    `trainer.num_iterations` resolves to."""
    return _lookup(name).iterations


def is_registered(name: str) -> bool:
    """Whether a rule of that name is registered (loading the entry points, except in a reading command)."""
    if name not in _REGISTRY:
        _load_entry_points()
    return name in _REGISTRY


def rule_module(name: str | None) -> str | None:
    """The module that registered rule `name`, when it is not part of stare_lab; None for a rule of
    stare_lab's or a name the registry does not know."""
    if name is None or not is_registered(name):
        return None
    module = _REGISTRY[name].fn.__module__
    return None if module == "stare_lab" or module.startswith("stare_lab.") else module


def _load_entry_points() -> None:
    from stare_lab.rule_imports import load_entry_points_once

    load_entry_points_once()


OUTSIDE_HINT = (
    "a rule kept outside the package is registered by importing its module: the sweep's imports:, "
    "--import MODULE, or an entry point of group stare_lab.rules (docs/rules_outside.md)"
)


def _lookup(name: str) -> _Entry:
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(f"unknown token rule {name!r}; valid rules: {', '.join(_REGISTRY)}; {OUTSIDE_HINT}")
    return _REGISTRY[name]


def get_method(name: str, **params: Any) -> Rule:
    """Build a configured rule. Unknown rule or parameter, a value not of its declared type
    (stare_lab.methods.param_types), or a value the rule refuses: ValueError naming it."""
    from stare_lab.methods.param_types import conform_params

    entry = _lookup(name)
    valid = [f.name for f in dataclasses.fields(entry.params_cls)]
    for key in params:
        if key not in valid:
            raise ValueError(f"unknown parameter {key!r} for rule {name!r}; valid parameters: {', '.join(valid)}")
    params = conform_params(name, entry.params_cls, params)
    try:
        p = entry.params_cls(**params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"rule {name!r}: {e}") from None
    return Rule(entry, p)
