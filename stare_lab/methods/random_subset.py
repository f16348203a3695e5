"""random: keep a seeded random subset of tokens (the control every selection rule needs).

Papers: the random-ρ control of the 80/20 study (arXiv 2506.01939) and of the anchor/explorer
study (arXiv 2605.07660), which reports random 20% at 42.60 vs full 43.55 [secondary].

Equation implemented:
    match="none":     w_t = 1 on ⌈ρ·n⌉ valid tokens drawn uniformly per scope unit, 0 elsewhere;
    match="position": for every (scope unit, completion position t), w = 1 on c(unit, t) valid
                      tokens drawn uniformly among that cell's valid tokens, where c(unit, t) is
                      how many tokens the reference rule selected there on the same batch.
The loss is divided by Σ w (normalize="selected").

Deviations and decisions:
1. [paper] ρ = 0.2 uniform; [ours] per scope unit, exact count (ties="topk" on uniform keys).
2. [ours] match="position" reproduces the reference rule's positional histogram exactly in
   every scope unit, so "anchors are early tokens" cannot explain an anchor-vs-random gap
   (the anchor/explorer study's controls). ρ is then ignored: the count comes from the reference.
3. [ours] The reference runs with the same RuleState (trainer values included), so it selects
   exactly what its own arm would on this batch; its `needs` (and attention layers) become this
   rule's. A trainer value set explicitly in `reference_params` is not checked against the trainer.
4. [ours] A reference with no `selected` subset (a soft rule) counts as selecting every valid
   token, so matching it selects every valid token.
5. [ours] Random keys are drawn once over the whole [B, T] batch from state.generator("random"),
   so the subset does not depend on how the batch is later split.
6. [ours] The reference's own scope is set in `reference_params`; this rule's `scope` sets the
   matching cells. At scope "batch" random matches only the batch-wide positional histogram.
   `reference_params` is a dict, so a random Params is not hashable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stare_lab.methods.registry import RuleOutput, RuleState, get_method, register
from stare_lab.methods.select import (
    check_choice,
    check_common,
    check_fraction,
    scope_ids,
    select_top,
    selection_metrics,
)
from stare_lab.stats import TokenStats, positions

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    import torch
    from torch import Tensor

MATCH = ("none", "position")


@dataclass(frozen=True)
class Params:
    rho: float = 0.2  # [paper] the random-20% control
    scope: str = "batch"  # [ours] docs/pitfalls.md, Selection
    ties: str = "topk"  # exact ⌈ρ·n⌉ (keys are continuous, so ties do not occur)
    normalize: str = "selected"  # as the rules it controls for
    match: str = "none"  # "position": copy the reference rule's positional histogram
    reference: str = "anchor"  # [ours] the rule matched with match="position" (the paper's arm)
    reference_params: dict[str, Any] = field(default_factory=dict)  # the reference rule's params

    def __post_init__(self) -> None:
        check_fraction("rho", self.rho)
        check_common(self)
        check_choice("match", self.match, MATCH)
        object.__setattr__(self, "reference_params", dict(self.reference_params or {}))
        if self.match == "position":
            if self.reference == "random":
                raise ValueError("reference='random' can not be matched by random itself")
            self.reference_rule()  # fails now, naming the bad rule or parameter, not mid-training

    def reference_rule(self):
        return get_method(self.reference, **self.reference_params)


def _needs(p: Params, trainer) -> frozenset[str]:
    return p.reference_rule().needs_for(trainer) if p.match == "position" else frozenset()


def _attn_layers(p: Params):
    return p.reference_rule().attn_layers if p.match == "position" else None


def match_positions(ref_selected: Tensor, valid: Tensor, unit: Tensor, generator: torch.Generator) -> Tensor:
    """[B, T] bool: in each (scope unit, position) cell, as many uniform valid tokens as `ref_selected` has."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    B, T = valid.shape
    cell = unit * T + positions(valid)  # [B, T] id of (unit, t)
    key = torch.rand((B, T), generator=generator).to(valid.device)  # one draw for the whole batch
    # unit < B, so every cell id is < B·T
    need = torch.bincount(cell[ref_selected & valid], minlength=B * T)  # [B·T] reference count per cell
    c, k = cell[valid], key[valid]  # [N] valid tokens, row-major
    order = torch.argsort(k)
    order = order[torch.argsort(c[order], stable=True)]  # by cell, random within a cell
    sorted_c = c[order]
    _, counts = torch.unique_consecutive(sorted_c, return_counts=True)
    start = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    rank = torch.arange(sorted_c.numel(), device=valid.device) - start  # rank within the cell
    keep = torch.zeros_like(c, dtype=torch.bool)
    keep[order] = rank < need[sorted_c]
    out = torch.zeros_like(valid)
    out[valid] = keep
    return out


@register("random", Params, needs=_needs, attn_layers=_attn_layers)
def random_subset(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = stats.valid
    g = state.generator("random")
    if p.match == "none":
        score = torch.rand(stats.shape, generator=g).to(valid.device)
        sel = select_top(score, valid, stats.group, p.rho, scope=p.scope, ties=p.ties, generator=g)
        metrics = selection_metrics("rule/", sel, valid)
    else:
        ref = p.reference_rule()(stats, state)
        ref_sel = (ref.selected if ref.selected is not None else valid).bool() & valid
        sel = match_positions(ref_sel, valid, scope_ids(valid, stats.group, p.scope), g)
        metrics = selection_metrics("rule/", sel, valid)
        metrics["rule/ref_selected_frac"] = selection_metrics("", ref_sel, valid)["selected_frac"]
    return RuleOutput(weights=sel.float(), normalize=p.normalize, metrics=metrics, selected=sel)
