"""Shared selection and validation helpers for token rules (docs/pitfalls.md, Selection).

Selection happens within a scope (`batch`, `group`, `sequence`) over valid tokens only.
`ties="topk"` keeps exactly ⌈ρ·n⌉ tokens per scope unit, ties broken by a seeded random order;
`ties="quantile"` keeps every token at or above the (1-ρ) quantile (TRL's behaviour, linear
interpolation as `torch.quantile`), so ties at the threshold are all kept.

`resolution` (ties="topk"): scores are compared on a grid of this step, round(score / resolution),
so that values closer than the precision they were computed at are ties, broken by the seeded
order, instead of by the last bits of a float reduction. Without it a selection whose cut falls
among values at the noise floor of float32 arithmetic (ICT's JS to the group mean on a model with
peaked distributions: most of a batch at 1e-10..1e-7 nats, the cut among them) is decided by the
order of the reductions that computed the scores, which changes with the CPU's vector width and
with the chunking of the computation. A rule passes its score's resolution explicitly (ict.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from stare_lab.methods.rule_types import NORMALIZE

if TYPE_CHECKING:  # annotations only: rules load without torch (docs/design.md, "Fast refusals")
    import torch
    from torch import Tensor


# The units a selection runs within (`scope_ids`): the generation batch, a prompt's group, a row, or the
# micro-batch a rule of scope "microbatch" is handed inside the loss (stare_lab/training/token_weights.py).
SELECTION_SCOPES = ("batch", "group", "sequence", "microbatch")
# Every `scope` a rule may name: the selection scopes, and "token", a per-token rule computed inside the
# loss with no selection unit (adv_reweight, entropy_adv, lopti; stare_lab/training/token_weights.py). Each rule
# accepts the subset it implements.
SCOPES = (*SELECTION_SCOPES, "token")
TIES = ("topk", "quantile")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """`value`, or a one-line ValueError naming `name` and the choices (every option check of the package)."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def check_fraction(name: str, value: float, *, open_low: bool = True) -> None:
    ok = (0.0 < value <= 1.0) if open_low else (0.0 <= value <= 1.0)
    if not ok:
        raise ValueError(f"{name}={value} is out of range ({'0 < ' if open_low else '0 ≤ '}{name} ≤ 1)")


def check_common(params) -> None:
    """Validate the scope / normalize / ties fields a rule's Params may carry."""
    if hasattr(params, "scope"):
        check_choice("scope", params.scope, SELECTION_SCOPES)
    if hasattr(params, "normalize"):
        check_choice("normalize", params.normalize, NORMALIZE)
    if hasattr(params, "ties"):
        check_choice("ties", params.ties, TIES)


def scope_ids(valid: Tensor, group: Tensor, scope: str) -> Tensor:
    """[B, T] long id of each token's scope unit (batch → 0, group → prompt index, sequence → row)."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    B, T = valid.shape
    if scope in (
        "batch",
        "microbatch",
    ):  # microbatch: the rule is handed one micro-batch (stare_lab/training/token_weights.py)
        ids = torch.zeros(B, dtype=torch.long, device=valid.device)
    elif scope == "group":
        ids = torch.unique(group, return_inverse=True)[1].to(valid.device)
    elif scope == "sequence":
        ids = torch.arange(B, device=valid.device)
    else:
        raise ValueError(f"scope={scope!r} is not one of {', '.join(SELECTION_SCOPES)}")
    return ids[:, None].expand(B, T)


COUNTS = ("ceil", "floor")


def select_top(
    score: Tensor,
    valid: Tensor,
    group: Tensor,
    rho: float,
    *,
    scope: str = "batch",
    ties: str = "topk",
    largest: bool = True,
    generator: torch.Generator | None = None,
    count: str = "ceil",
    resolution: float | None = None,
) -> Tensor:
    """[B, T] bool: the top (largest=True) or bottom fraction ρ of `score` among valid tokens, per scope unit.

    count (ties="topk" only): keep ⌈ρ·n⌉ ("ceil") or ⌊ρ·n⌋ ("floor") tokens of a unit of n.
    resolution (ties="topk" only): compare round(score / resolution), see the module docstring.
    """
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    check_choice("count", count, COUNTS)
    if resolution is not None and not (resolution > 0 and ties == "topk"):
        raise ValueError(f"resolution={resolution!r} needs ties='topk' and a value > 0")
    valid = valid.bool()
    out = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # contiguous: flat_out is a view
    flat_score, flat_valid = score.reshape(-1).float(), valid.reshape(-1)
    if resolution is not None:  # grid indices, exact in float64 for any score of a float32 range
        flat_score = torch.round(score.reshape(-1).double() / resolution)
    flat_out = out.reshape(-1)
    # Random tie-break keys, drawn once for the whole batch so the result does not depend on how
    # the batch is later split.
    tie_key = torch.rand(flat_score.shape, generator=generator).to(score.device)
    for idx in _unit_indices(flat_valid, group, scope):
        s = flat_score[idx] if largest else -flat_score[idx]
        n = idx.numel()
        if ties == "topk":
            # ±1e-9: ρ·n in floating point (0.3·10 = 3.0000000000000004) must round as the exact product
            k = min(n, math.ceil(rho * n - 1e-9) if count == "ceil" else math.floor(rho * n + 1e-9))
            # order by score descending, ties by the random key: stable sort on key, then on score
            order = torch.argsort(tie_key[idx], stable=True)
            order = order[torch.argsort(s[order], descending=True, stable=True)]
            flat_out[idx[order[:k]]] = True
        elif ties == "quantile":
            thr = quantile(s, 1.0 - rho)
            flat_out[idx[s >= thr]] = True
        else:
            raise ValueError(f"ties={ties!r} is not one of {', '.join(TIES)}")
    return out


def _unit_indices(flat_valid: Tensor, group: Tensor, scope: str) -> list[Tensor]:
    """Flat indices of the valid tokens of each scope unit, in unit order (units without one are left out).
    One unit (scope batch, microbatch) skips the id tensor: the loss calls this per micro-batch."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    if scope in ("batch", "microbatch"):
        idx = torch.nonzero(flat_valid).squeeze(1)
        return [idx] if idx.numel() else []
    B = group.shape[0]
    flat_ids = scope_ids(flat_valid.view(B, -1), group, scope).reshape(-1)
    return [torch.nonzero(flat_valid & (flat_ids == u)).squeeze(1) for u in torch.unique(flat_ids[flat_valid]).tolist()]


def quantile(x: Tensor, q: float) -> Tensor:
    """`torch.quantile(x, q)` (linear interpolation) by sorting: torch.quantile refuses > 2^24 elements."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    v = torch.sort(x.flatten().double()).values
    pos = q * (v.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, v.numel() - 1)
    return (v[lo] + (pos - lo) * (v[hi] - v[lo])).to(x.dtype)


def rank_normalise(score: Tensor, valid: Tensor, group: Tensor, scope: str = "batch") -> Tensor:
    """[B, T] u ∈ [0, 1]: rank of each valid token's score in its scope unit, rank/(n-1); ties share the mean rank."""
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    valid = valid.bool()
    ids = scope_ids(valid, group, scope)
    u = torch.zeros(score.shape, dtype=torch.float32, device=score.device)  # contiguous: reshape below is a view
    flat_s, flat_v, flat_ids, flat_u = score.reshape(-1).float(), valid.reshape(-1), ids.reshape(-1), u.reshape(-1)
    for unit in torch.unique(flat_ids[flat_v]).tolist():
        idx = torch.nonzero(flat_v & (flat_ids == unit)).squeeze(1)
        s = flat_s[idx]
        n = s.numel()
        if n == 1:
            flat_u[idx] = 0.5
            continue
        sorted_s, order = torch.sort(s)
        _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
        start = torch.cumsum(counts, 0) - counts
        mean_rank = start.float() + (counts.float() - 1) / 2
        rank = torch.empty_like(s)
        rank[order] = mean_rank[inverse]
        flat_u[idx] = rank / (n - 1)
    return u


def selection_metrics(prefix: str, selected: Tensor, valid: Tensor) -> dict[str, float]:
    n = float(valid.sum())
    return {f"{prefix}selected_frac": float((selected & valid.bool()).sum()) / n if n else 0.0}
