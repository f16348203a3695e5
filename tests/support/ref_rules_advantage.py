"""Slow, obviously-correct loop references of the rules stare, ict, gmts, opefo and stapo.

Plain Python over tokens: no vectorisation and no stare_lab.methods.select. A reference weight of
None means "either answer is right" (a tie at a top-k boundary, or a score within rounding of a
quantile threshold); the tests compare every other token exactly and check top-k counts apart.
"""

from __future__ import annotations

import math
from fractions import Fraction

TOL = 1e-5  # relative distance to a threshold below which float32 vs float64 may disagree


def lists(stats) -> dict:
    """TokenStats as nested Python lists (floats), advantages broadcast to [B][T]."""
    B, T = stats.shape
    d = {"B": B, "T": T, "group": [int(g) for g in stats.group.tolist()]}
    for name in ("logp", "mask", "entropy", "js", "old_logp", "ref_logp", "p2", "p2logp"):
        v = getattr(stats, name)
        d[name] = None if v is None else v.double().tolist()
    adv = stats.advantages.double().tolist()
    d["A"] = [[adv[b]] * T for b in range(B)] if stats.advantages.dim() == 1 else adv
    d["cells"] = [(b, t) for b in range(B) for t in range(T) if d["mask"][b][t] > 0]
    return d


def unit_of(d: dict, b: int, scope: str):
    return {"batch": 0, "group": d["group"][b], "sequence": b}[scope]


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's and torch's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def near(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def select(d: dict, score: dict, rho: float, scope: str, ties: str, count: str = "ceil") -> tuple[dict, dict]:
    """Top fraction rho of score {cell: s} per scope unit: ({cell: True|False|None}, {unit: k or None})."""
    units: dict = {}
    for cell, s in score.items():
        units.setdefault(unit_of(d, cell[0], scope), []).append((cell, s))
    chosen, counts = {}, {}
    for unit, items in units.items():
        values = [s for _, s in items]
        if ties == "quantile":
            thr = quantile(values, 1.0 - rho)
            counts[unit] = None
            for cell, s in items:
                chosen[cell] = True if s == thr else (None if near(s, thr) else s > thr)
            continue
        n = len(values)
        exact = Fraction(str(rho)) * n  # exact: 0.3·10 is 3.0000000000000004 in floats
        k = min(n, math.ceil(exact) if count == "ceil" else math.floor(exact))
        counts[unit] = k
        if k == 0:
            for cell, _ in items:
                chosen[cell] = False
            continue
        v = sorted(values, reverse=True)[k - 1]
        above = sum(1 for s in values if s > v and not near(s, v))
        at = sum(1 for s in values if near(s, v))
        for cell, s in items:
            if near(s, v):
                chosen[cell] = True if above + at <= k else None
            else:
                chosen[cell] = s > v
    return chosen, counts


def empty_weights(d: dict) -> list[list]:
    return [[1.0 if d["mask"][b][t] > 0 else 0.0 for t in range(d["T"])] for b in range(d["B"])]


def stare_ref(stats, p, memory: dict) -> tuple[list[list], dict]:
    d = lists(stats)
    n = len(d["cells"])
    h_bar = sum(d["entropy"][b][t] for b, t in d["cells"]) / n if n else float("nan")
    W, M = p.W, p.M
    finite = n > 0 and math.isfinite(h_bar)
    if p.adaptive:
        W, M = memory.get("W", p.W), memory.get("M", p.M)
        if finite:
            sign = 1.0 if h_bar < p.H_tgt else (-1.0 if h_bar > p.H_tgt else 0.0)
            W = min(max(W + p.alpha * sign, 1.0), p.W_max)
            M = min(max(M - p.alpha * sign, p.M_min), 1.0)
        memory["W"], memory["M"] = W, M
    # official STAREController: a non-finite H̄ skips the update (gate kept; open before any update)
    gate = h_bar < p.H_tgt if finite else memory.get("gate", True)
    memory["gate"] = gate
    w = empty_weights(d)
    if gate:
        for sign, value in ((1, W), (-1, M)):
            if sign == -1 and p.variant != "C2":
                continue
            score = {(b, t): -d["logp"][b][t] for b, t in d["cells"] if d["A"][b][t] * sign > 0}
            chosen, _ = select(d, score, p.P, p.scope, p.ties)
            for (b, t), c in chosen.items():
                w[b][t] = value if c else (1.0 if c is False else None)
    return w, {"gate": float(gate), "W": W, "M": M, "entropy_mean": h_bar}


def ict_ref(stats, p, step: int) -> list[list]:
    d = lists(stats)
    w = empty_weights(d)
    if step < p.warmup_steps:
        return w
    chosen, _ = select(d, {(b, t): d["js"][b][t] for b, t in d["cells"]}, p.rho, p.scope, p.ties)
    for (b, t), c in chosen.items():
        w[b][t] = None if c is None else float(c)
    return w


def gmts_delta(d: dict, p, b: int, t: int) -> float:
    A, logp = d["A"][b][t], d["logp"][b][t]
    r = math.exp(logp - d["old_logp"][b][t]) if d["old_logp"] is not None else 1.0
    clipped = (A > 0 and r > 1 + p.eps_high) or (A < 0 and r < 1 - p.eps_low)
    omega = 0.0 if clipped else r * A
    if p.beta > 0:
        omega += p.beta * math.exp(d["ref_logp"][b][t] - logp) - p.beta
    delta = abs(d["entropy"][b][t] * omega)
    if p.score == "sequence_mean":  # share of the per-sequence mean loss: / (G · |o_b|)
        length = sum(1 for tt in range(d["T"]) if d["mask"][b][tt] > 0)
        rows = sum(1 for g in d["group"] if g == d["group"][b])
        delta /= rows * length
    return delta


def gmts_ref(stats, p) -> tuple[list[list], dict]:
    d = lists(stats)
    score = {(b, t): gmts_delta(d, p, b, t) for b, t in d["cells"]}
    chosen, counts = select(d, score, p.rho, p.scope, p.ties, p.count)
    w = empty_weights(d)
    for (b, t), c in chosen.items():
        w[b][t] = None if c is None else float(c)
    return w, counts


def opefo_flow(d: dict, flow: str, b: int, t: int) -> float:
    logp, H, A = d["logp"][b][t], d["entropy"][b][t], d["A"][b][t]
    term = math.exp(logp) * (logp + H)
    if flow == "full":
        term -= d["p2logp"][b][t] + H * d["p2"][b][t]
    return -A * term


def opefo_ref(stats, p) -> tuple[list[list], dict]:
    d = lists(stats)
    flows = {(b, t): opefo_flow(d, p.flow, b, t) for b, t in d["cells"]}
    f_pos, f_neg = {}, {}
    for (b, _t), f in flows.items():
        u = unit_of(d, b, p.scope)
        f_pos[u] = f_pos.get(u, 0.0) + (f if f > 0 else 0.0)
        f_neg[u] = f_neg.get(u, 0.0) + (-f if f < 0 else 0.0)
    lam = {
        u: (max(-1.0, min(1.0, (f_neg[u] - f_pos[u]) / (f_neg[u] + f_pos[u]))) if f_neg[u] + f_pos[u] > 0 else 0.0)
        for u in f_pos
    }
    w = empty_weights(d)
    for (b, t), f in flows.items():
        u = unit_of(d, b, p.scope)
        w[b][t] = 1.0 + lam[u] if f > 0 else (1.0 - lam[u] if f < 0 else 1.0)
    net = sum(w[b][t] * f for (b, t), f in flows.items())
    return w, {"lambda": lam, "flow_pos": sum(f_pos.values()), "flow_neg": sum(f_neg.values()), "net": net}


def stapo_ref(stats, p) -> tuple[list[list], int]:
    d = lists(stats)
    w = empty_weights(d)
    if not d["cells"]:
        return w, 0
    q_h = quantile([d["entropy"][b][t] for b, t in d["cells"]], p.tau_h_quantile)
    dropped = 0
    for b, t in d["cells"]:
        if d["A"][b][t] > 0 and math.exp(d["logp"][b][t]) < p.tau_p and d["entropy"][b][t] < q_h:
            w[b][t] = 0.0
            dropped += 1
    return w, dropped
