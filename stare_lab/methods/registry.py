"""The rule registry: a dict and a decorator (verl's `register_policy_loss` is the right size).

A rule is a frozen `Params` dataclass plus one function, registered under a name with what it reads
(`needs`: names of `stare_lab.stats.STATISTICS`). Nothing outside `stare_lab/methods/` knows a rule's
name: the trainer asks `get_method` and the rule's declarations. Two kinds:
- weights: `@register(name, Params, needs=...)` on `fn(stats, state, params) -> RuleOutput`;
- a per-token policy term in place of PPO's clipped surrogate (the field's methods, docs/field.md):
  `@register_loss(name, Params)` on `loss(batch: LossBatch, params) -> LossTerms`, evaluated inside the
  loss with the current log-probs (stare_lab.training.trl_loss.surrogate_change); its weights are the valid
  tokens. A rule that also selects tokens at generation time (KL-Cov) registers its weights function
  with `loss=`.
The types a rule sees and returns are in `rule_types.py`; what the field's rules share (verl's
surrogate, the refusals of loss types with a surrogate of their own) in `ppo.py`.

A Params field may stand for a trainer value (GMTS's clip ε and β): declare it
`field(default=None, metadata={"trainer": "<TrainerValues field>"})`. None means "the trainer's
value", filled in from `RuleState.trainer` before the rule runs; an explicit value must agree
with the trainer (`Rule.check_trainer`, called when the config is resolved and by the trainer).
`check=fn(params, trainer)` refuses, with one line, a trainer setting the rule does not compose with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stare_lab.methods.outside import load_entry_points_once
from stare_lab.methods.param_types import conform_params
from stare_lab.methods.rule_types import NORMALIZE, LossBatch, LossTerms, RuleOutput, RuleState, TrainerValues
from stare_lab.stats import TokenStats, check_known

__all__ = [
    "NORMALIZE",
    "LossBatch",
    "LossTerms",
    "Rule",
    "RuleOutput",
    "RuleState",
    "TrainerValues",
    "get_method",
    "list_methods",
    "method_iterations",
    "method_params",
    "register",
    "register_loss",
]

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
    loss: `loss(batch, params) -> LossTerms`, for a rule that also changes the per-token objective (KL-Cov;
        `register_loss` for one that only does). Its `check` calls `ppo.replaces_surrogate`.
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


def register_loss(name: str, params_cls: type, *, check: Callable[[Any, TrainerValues], None] | None = None):
    """Decorator: register `loss(batch, params) -> LossTerms` under `name`, a rule whose only change is its
    per-token policy term (DPPO, CE-GPPO, Archer): its weights are 1 on every valid token ("valid")."""

    def deco(loss):
        register(name, params_cls, loss=loss, check=check)(_valid_tokens)
        return loss

    return deco


def _valid_tokens(stats: TokenStats, state: RuleState, params: Any) -> RuleOutput:
    return RuleOutput(weights=stats.mask.clone(), normalize="valid")


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
        the trainer's `num_iterations` with the rule's `iterations`, or the rule's `check` refuses a setting."""
        for name, key in trainer_params(type(self.params)).items():
            mine, theirs = getattr(self.params, name), getattr(values, key)
            if mine is not None and mine != theirs:
                raise ValueError(
                    f"rule {self.name!r}: {name}={mine} but trainer.{key}={theirs} "
                    f"(leave it unset to use the trainer's)"
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
        import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

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
    order, modules imported by `imports:` / `--import` in import order; stare_lab.methods.outside)."""
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
    entry = _REGISTRY[name]
    module = (entry.loss or entry.fn).__module__
    return None if module == "stare_lab" or module.startswith("stare_lab.") else module


def _load_entry_points() -> None:
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
