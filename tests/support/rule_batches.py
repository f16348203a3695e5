"""The stats factory and weight assertions shared by the rule tests.

`make_stats` draws every statistic of the table (stare_lab.stats.STATISTICS) from real categorical
distributions (groups of G contiguous rows, a fully masked row, an all-equal-reward group), or only
the ones a rule declares (`needs=`, as the invariant suite does). The assertions compare weights with
the loop references of ref_rules_advantage.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

import pytest
import torch

from stare_lab.methods import TrainerValues
from stare_lab.methods.select import scope_ids
from stare_lab.stats import TokenStats

G = 4
TRAINER = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=G)
SHAPES = [(B, T) for B in (4, 8) for T in (1, 5, 9)]
SEEDS = (0, 1, 2)


def make_stats(
    seed: int,
    B: int,
    T: int,
    *,
    entropy_scale: float | None = None,
    V: int = 6,
    pad_value: float | None = None,
    lengths: list[int] | None = None,
    needs: Iterable[str] | None = None,
) -> TokenStats:
    """Random batch drawn from real categorical distributions: groups of G contiguous rows, row 1
    fully masked, group 1 (B = 8) with all-equal rewards (A = 0), random lengths (or `lengths`),
    finite garbage (or pad_value) on padding. `needs`: only these statistics (logp NaN otherwise)."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.exp(torch.randn(B, T, 1, generator=g))
    probs = torch.softmax(torch.randn(B, T, V, generator=g) * 2 * temp, -1).double()
    a = torch.multinomial(probs.reshape(-1, V), 1, generator=g).reshape(B, T, 1)
    logp = torch.log(probs.gather(-1, a).squeeze(-1))
    entropy = -(probs * probs.log()).sum(-1)
    if entropy_scale is not None:
        entropy = entropy * entropy_scale
    drawn = torch.randint(1, T + 1, (B,), generator=g)
    drawn[1] = 0
    lengths = drawn if lengths is None else torch.tensor(lengths)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    group = torch.arange(B) // G
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[0], rewards[2] = 1.0, 0.0  # group 0 mixed (row 1 of it fully masked)
    rewards[G : 2 * G] = 1.0  # group 1 (when B = 8) all equal: A = 0
    mean = torch.stack([rewards[group == k].mean() for k in group])
    std = torch.stack([rewards[group == k].std() for k in group])
    adv = (rewards - mean) / (std + 1e-4)
    fields = dict(
        logp=logp,
        entropy=entropy,
        js=torch.rand(B, T, generator=g).double() * math.log(2),
        old_logp=logp + 0.3 * torch.randn(B, T, generator=g),
        ref_logp=logp + 0.3 * torch.randn(B, T, generator=g),
        p2=(probs**2).sum(-1),
        p2logp=(probs**2 * probs.log()).sum(-1),
        attn_entropy=torch.rand(B, T, generator=g).double(),
    )  # drawn last: earlier draws unchanged
    fields = {k: v.float() for k, v in fields.items()}
    if pad_value is not None:
        fields = {k: torch.where(mask > 0, v, torch.full_like(v, pad_value)) for k, v in fields.items()}
    if needs is not None:
        fields = {k: v for k, v in fields.items() if k in set(needs)}
        fields.setdefault("logp", torch.full((B, T), float("nan")))  # undeclared: reading it shows
    return TokenStats(mask=mask, advantages=adv.float(), group=group, **fields)


def assert_matches(weights: torch.Tensor, expected: list[list], atol: float = 1e-6) -> list[tuple[int, int]]:
    """Compare where the reference is decided; return the undecided (None) tokens."""
    undecided = []
    for b, row in enumerate(expected):
        for t, e in enumerate(row):
            if e is None:
                undecided.append((b, t))
                continue
            assert weights[b, t].item() == pytest.approx(e, abs=atol), (b, t, weights[b, t].item(), e)
    return undecided


def assert_close(weights: torch.Tensor, expected: list[list]) -> None:
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


def assert_basic(out, stats: TokenStats) -> None:
    assert out.weights.shape == stats.shape and out.weights.dtype == torch.float32
    assert torch.isfinite(out.weights).all()
    assert (out.weights[~stats.valid] == 0).all()


def assert_topk_counts(
    selected: torch.Tensor, stats: TokenStats, candidates: torch.Tensor, rho: float, scope: str, count: str = "ceil"
):
    ids = scope_ids(stats.valid, stats.group, scope)
    for u in ids[candidates].unique().tolist():
        unit = candidates & (ids == u)
        n = int(unit.sum())
        exact = Fraction(str(rho)) * n
        assert int((selected & unit).sum()) == min(n, math.ceil(exact) if count == "ceil" else math.floor(exact))
