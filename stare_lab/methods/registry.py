"""The rule registry: a dict and a decorator (verl's `register_policy_loss` is the right size).

A rule is a frozen `Params` dataclass plus one function `fn(stats, state, params) -> RuleOutput`.
Nothing outside `stare_lab/methods/` knows a rule's name: the trainer asks `get_method`.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from stare_lab.stats import TokenStats

NORMALIZE = ("valid", "selected", "loss_type")
SCOPES = ("batch", "group", "sequence")
TIES = ("topk", "quantile")
# Statistics a rule may declare in `needs`; the stats pass computes only these.
STAT_NAMES = ("entropy", "attn_entropy", "js", "old_logp", "ref_logp", "p2")


@dataclass
class RuleState:
    """Explicit, small rule state; saved in and restored from the trainer checkpoint.

    step: optimizer step at which this generation batch was produced (0-based).
    total_steps: planned optimizer steps (schedules use step / total_steps).
    seed: run seed; with `step` it seeds the generator of random selections and tie breaks.
    memory: the rule's own JSON-serialisable memory (e.g. STARE's adaptive W, M); a rule updates
        it in place and the trainer saves it.
    rng: optional generator; when None, `generator()` derives one from (seed, step).
    """

    step: int = 0
    total_steps: int = 1
    seed: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    rng: torch.Generator | None = None

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
    def from_dict(cls, d: dict[str, Any]) -> "RuleState":
        return cls(step=int(d["step"]), total_steps=int(d["total_steps"]), seed=int(d["seed"]), memory=dict(d["memory"]))


@dataclass
class RuleOutput:
    weights: Tensor                    # [B, T] float, 0 where mask is 0
    normalize: str                     # "valid" | "selected" | "loss_type"
    metrics: dict[str, float] = field(default_factory=dict)
    selected: Tensor | None = None     # [B, T] bool: the rule's selected subset (for metrics); None = all valid


NeedsSpec = Iterable[str] | Callable[[Any], Iterable[str]]


@dataclass(frozen=True)
class _Entry:
    name: str
    params_cls: type
    fn: Callable[[TokenStats, RuleState, Any], RuleOutput]
    needs: NeedsSpec
    doc: str


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, params_cls: type, needs: NeedsSpec = ()):
    """Decorator: register `fn(stats, state, params) -> RuleOutput` under `name`."""
    if not dataclasses.is_dataclass(params_cls):
        raise TypeError(f"Params of rule {name!r} must be a dataclass")

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"token rule {name!r} is registered twice")
        _REGISTRY[name] = _Entry(name, params_cls, fn, needs, (fn.__module__ and __import__(fn.__module__, fromlist=["_"]).__doc__) or "")
        return fn

    return deco


class Rule:
    """A configured rule: `rule(stats, state) -> RuleOutput`."""

    def __init__(self, entry: _Entry, params: Any):
        self.name = entry.name
        self.params = params
        self._entry = entry

    @property
    def needs(self) -> frozenset[str]:
        n = self._entry.needs
        names = frozenset(n(self.params) if callable(n) else n)
        unknown = names - set(STAT_NAMES)
        if unknown:
            raise ValueError(f"rule {self.name!r} declares unknown statistics {sorted(unknown)}")
        return names

    @property
    def attn_layers(self) -> tuple[int, ...] | None:
        """Layers whose attention entropy the rule needs (None = the middle layer)."""
        layers = getattr(self.params, "layers", None)
        if layers is None:
            ref = getattr(self.params, "reference", None)
            if ref:
                # the reference rule's own params carry its layers (e.g. random matched to anchor)
                ref_params = getattr(self.params, "reference_params", None) or {}
                return get_method(ref, **ref_params).attn_layers
            return None
        return (layers,) if isinstance(layers, int) else tuple(layers)

    def __call__(self, stats: TokenStats, state: RuleState) -> RuleOutput:
        out = self._entry.fn(stats, state, self.params)
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
    _load_all()
    return sorted(_REGISTRY)


def method_params(name: str) -> type:
    _load_all()
    return _lookup(name).params_cls


def _lookup(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise ValueError(f"unknown token rule {name!r}; valid rules: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def get_method(name: str, **params: Any) -> Rule:
    """Build a configured rule. Unknown rule or parameter, or a bad value: ValueError naming it."""
    _load_all()
    entry = _lookup(name)
    valid = [f.name for f in dataclasses.fields(entry.params_cls)]
    for key in params:
        if key not in valid:
            raise ValueError(f"unknown parameter {key!r} for rule {name!r}; valid parameters: {', '.join(valid)}")
    try:
        p = entry.params_cls(**params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"rule {name!r}: {e}") from None
    return Rule(entry, p)


def _load_all() -> None:
    # Explicit imports: one module per rule registers itself on import.
    from stare_lab.methods import _all  # noqa: F401
