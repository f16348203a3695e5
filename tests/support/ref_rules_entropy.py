"""Slow, obviously correct loop references for random, top_entropy, low_entropy, anchor, explorer,
attn_soft and rsi_band (docs/pitfalls.md and each rule's docstring). Plain Python lists and loops; no torch, no
select.py.

Inputs are nested lists: score[b][t], valid[b][t] (bool), group[b] (int). Outputs likewise.
"""

from __future__ import annotations

import math
from fractions import Fraction


def unit_of(b: int, group: list[int], scope: str):
    """The scope unit of row b: the whole batch, its prompt, or the row itself."""
    if scope == "batch":
        return 0
    if scope == "group":
        return group[b]
    if scope == "sequence":
        return b
    raise ValueError(scope)


def units(valid, group, scope) -> dict:
    """{unit: [(b, t), ...]} over valid tokens, in row-major order."""
    out: dict = {}
    for b, row in enumerate(valid):
        for t, v in enumerate(row):
            if v:
                out.setdefault(unit_of(b, group, scope), []).append((b, t))
    return out


def exact_k(rho: float, n: int) -> int:
    """⌈ρ·n⌉ in exact decimal arithmetic (0.3·10 is 3, not 3.0000000000000004)."""
    return min(n, math.ceil(Fraction(str(rho)) * n))


def ref_select(score, valid, group, rho, scope, ties, largest):
    """Top (largest) or bottom fraction ρ of `score` per scope unit.

    topk: the ⌈ρ·n⌉ best, ties resolved by row-major order (only compare when scores are distinct).
    quantile: every token whose score x (negated when largest=False) is ≥ the linearly
    interpolated (1-ρ) quantile of x in its unit, the definition torch.quantile uses.
    """
    B, T = len(valid), len(valid[0]) if valid else 0
    keep = [[False] * T for _ in range(B)]
    for members in units(valid, group, scope).values():
        x = {bt: (score[bt[0]][bt[1]] if largest else -score[bt[0]][bt[1]]) for bt in members}
        n = len(members)
        if ties == "topk":
            best = sorted(members, key=lambda bt: -x[bt])[: exact_k(rho, n)]
            for b, t in best:
                keep[b][t] = True
        else:
            v = sorted(x.values())
            pos = (1 - Fraction(str(rho))) * (n - 1)
            lo, hi = math.floor(pos), math.ceil(pos)
            thr = v[lo] + float(pos - lo) * (v[hi] - v[lo])
            for (b, t), xv in x.items():
                if xv >= thr:
                    keep[b][t] = True
    return keep


def ref_rank_normalise(score, valid, group, scope):
    """u = (mean rank among equal scores) / (n - 1), 0 = smallest; 0.5 for a unit of one token."""
    B, T = len(valid), len(valid[0]) if valid else 0
    u = [[0.0] * T for _ in range(B)]
    for members in units(valid, group, scope).values():
        n = len(members)
        for b, t in members:
            s = score[b][t]
            below = sum(1 for bb, tt in members if score[bb][tt] < s)
            equal = sum(1 for bb, tt in members if score[bb][tt] == s)
            u[b][t] = 0.5 if n == 1 else (below + (equal - 1) / 2) / (n - 1)
    return u


def ref_attn_soft(ae, valid, group, scope, kappa, progress):
    """w = 1 + κ(2u-1)(2λ-1) on valid tokens, then mean 1 over valid tokens; 0 on padding."""
    u = ref_rank_normalise(ae, valid, group, scope)
    w = [
        [(1 + kappa * (2 * u[b][t] - 1) * (2 * progress - 1)) if valid[b][t] else 0.0 for t in range(len(valid[b]))]
        for b in range(len(valid))
    ]
    n = sum(v for row in valid for v in row)
    total = sum(sum(row) for row in w)
    if n:
        w = [[x * n / total for x in row] for row in w]
    return w


def ref_rsi_band(logp, entropy, valid, low, high):
    """(keep[b][t], kept_frac, low_frac, high_frac) for RSI = -logp / H (0 where H < 1e-6)."""
    keep = [[False] * len(row) for row in valid]
    n = n_keep = n_low = n_high = 0
    for b, row in enumerate(valid):
        for t, v in enumerate(row):
            if not v:
                continue
            H = entropy[b][t]
            rsi = 0.0 if H < 1e-6 else -logp[b][t] / H
            n += 1
            if rsi < low:
                n_low += 1
            elif rsi > high:
                n_high += 1
            else:
                n_keep += 1
                keep[b][t] = True
    frac = (lambda c: c / n) if n else (lambda c: 0.0)
    return keep, frac(n_keep), frac(n_low), frac(n_high)


def ref_unit_counts(sel, valid, group, scope) -> dict:
    """{unit: number of selected valid tokens}, every unit with a valid token listed."""
    return {u: sum(1 for b, t in m if sel[b][t]) for u, m in units(valid, group, scope).items()}


def ref_position_counts(sel, valid, group, scope) -> dict:
    """{(unit, t): number of selected valid tokens at completion position t in that unit}."""
    out: dict = {}
    for u, members in units(valid, group, scope).items():
        for b, t in members:
            out[(u, t)] = out.get((u, t), 0) + (1 if sel[b][t] else 0)
    return out
