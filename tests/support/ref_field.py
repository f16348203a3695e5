"""Slow, obviously correct loop references for the field rules (stare_lab/methods: clip_cov, kl_cov, dppo,
adv_reweight, lopti, archer, entropy_adv, ce_gppo). Plain Python floats and loops over tokens; no torch.

Inputs are nested lists: logp[b][t], old[b][t] (log π_old), A[b][t] (advantage per token), valid[b][t]
(bool), H[b][t] (entropy). Each reference returns, per token, the loss value and its derivative d ℓ_t/d
log π_t (every rule's ℓ_t depends on log π_t alone once the selections are fixed), 0.0 on padding.
Random test inputs have no exact ties, so a `max` with two equal branches only occurs where clip(r) = r,
where both branches have the same derivative.
"""

from __future__ import annotations

import math


def cells(valid):
    """Valid (b, t) in row-major order."""
    return [(b, t) for b, row in enumerate(valid) for t, v in enumerate(row) if v]


def zeros(valid):
    return [[0.0] * len(row) for row in valid]


def ppo(lp, old, a, eps_low, eps_high, dual=None, clamp=False):
    """(value, d/d log π) of max(−A·r, −A·clip(r)), then min(·, −A·c) for A < 0."""
    x = lp - old
    if clamp:
        x = min(max(x, -20.0), 20.0)
    r = math.exp(x)
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    v1, v2 = -a * r, -a * clipped
    inside = 1 - eps_low <= r <= 1 + eps_high
    if v1 >= v2:
        value, grad = v1, -a * r
    else:
        value, grad = v2, (-a * r if inside else 0.0)
    if dual is not None and a < 0 and -a * dual < value:
        value, grad = -a * dual, 0.0
    return value, grad


def mean(xs):
    return sum(xs) / len(xs)


def covariances(logp, A, valid, eps=0.0):
    """{(b, t): Cov} with means over valid tokens (Σ/(N + eps))."""
    cs = cells(valid)
    if not cs:
        return {}
    n = len(cs) + eps
    ma = sum(A[b][t] for b, t in cs) / n
    ml = sum(logp[b][t] for b, t in cs) / n
    return {(b, t): (A[b][t] - ma) * (logp[b][t] - ml) for b, t in cs}


def ref_clip_cov_candidates(logp, old, A, valid, lb, ub, eps_low, eps_high):
    """The tokens Clip-Cov may detach: lb < Cov < ub and PPO's clip not active."""
    cov = covariances(logp, A, valid, eps=1e-8)
    out = set()
    for (b, t), c in cov.items():
        r = math.exp(logp[b][t] - old[b][t])
        a = A[b][t]
        active = -a * min(max(r, 1 - eps_low), 1 + eps_high) > -a * r
        if lb < c < ub and not active:
            out.add((b, t))
    return out


def ref_clip_cov(logp, old, A, valid, detached, eps_low, eps_high):
    """ℓ and dℓ/dlog π of Clip-Cov given the detached set."""
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        if (b, t) in detached:
            continue
        val[b][t], grad[b][t] = ppo(logp[b][t], old[b][t], A[b][t], eps_low, eps_high)
    return val, grad


def ref_kl_cov_selected(logp, A, valid, ratio):
    cov = covariances(logp, A, valid)
    if not cov:
        return set()
    k = max(1, int(len(cov) * ratio))
    return set(sorted(cov, key=lambda bt: -cov[bt])[:k])


def ref_kl_cov(logp, old, A, valid, selected, kl_coef):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        x = logp[b][t] - old[b][t]
        r, a = math.exp(x), A[b][t]
        val[b][t], grad[b][t] = -a * r, -a * r
        if (b, t) in selected:
            val[b][t] += kl_coef * abs(x)
            grad[b][t] += kl_coef * (1.0 if x > 0 else -1.0)
    return val, grad


def ref_dppo(logp, old, A, valid, variant, d_low, d_high, cap):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        lp, lo, a = logp[b][t], old[b][t], A[b][t]
        p, po = math.exp(lp), math.exp(lo)
        if variant == "tv":
            keep = (p - po <= d_high) if a > 0 else (p - po >= -d_low)
        else:
            d = po * (lo - lp) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
            keep = (d <= d_high or p <= po) if a > 0 else (d <= d_low or p >= po)
        if keep:
            w = min(math.exp(min(max(lp - lo, -20.0), 20.0)), cap)
            val[b][t], grad[b][t] = -a * w * lp, -a * w
    return val, grad


def ref_adv_reweight(logp, old, A, valid, alpha, tau, neg_weight, eps_low, eps_high, dual):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        w = alpha * math.exp(old[b][t]) + tau
        if A[b][t] <= 0:
            w *= neg_weight
        val[b][t], grad[b][t] = ppo(logp[b][t], old[b][t], w * A[b][t], eps_low, eps_high, dual)
    return val, grad


def ref_lopti(logp, old, A, valid, eta, phase, eps_low, eps_high, dual):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        first = math.exp(old[b][t]) < eta
        if first == (phase == 0):
            val[b][t], grad[b][t] = ppo(logp[b][t], old[b][t], A[b][t], eps_low, eps_high, dual)
    return val, grad


def quantile(xs, q):
    """Linear interpolation between order statistics (torch.quantile's definition)."""
    v = sorted(xs)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def k3(lp, ref):
    """verl's low_var_kl and its derivative in log π."""
    x = min(max(ref - lp, -20.0), 20.0)
    raw = math.exp(x) - x - 1
    value = min(max(raw, -10.0), 10.0)
    inside_x = -20.0 < ref - lp < 20.0
    dx = -1.0 if inside_x else 0.0  # dx/dlog π
    d = (math.exp(x) - 1) * dx if -10.0 < raw < 10.0 else 0.0
    return value, d


def ref_archer(logp, old, ref, A, valid, H, q, tight, wide, dual, beta, beta_high):
    """Archer's micro-batch loss written per token: ℓ_t = pg_t + κ_t·k3_t (κ: each set's own mean).

    tight, wide: (ε_low, ε_high) of the low- and high-entropy tokens.
    """
    B = len(valid)
    high = set()
    for b in range(B):
        hs = [H[b][t] for t in range(len(valid[b])) if valid[b][t]]
        if hs:
            qb = quantile(hs, q)
            high |= {(b, t) for t in range(len(valid[b])) if valid[b][t] and H[b][t] > qb}
    cs = cells(valid)
    low = [bt for bt in cs if bt not in high]
    n = len(cs)
    kappa_low = beta * n / (len(low) + 1e-8)
    kappa_high = beta_high * n / (len(high) + 1e-8)
    val, grad = zeros(valid), zeros(valid)
    for b, t in cs:
        eps_low, eps_high = wide if (b, t) in high else tight
        pv, pg = ppo(logp[b][t], old[b][t], A[b][t], eps_low, eps_high, dual, clamp=True)
        kv, kg = k3(logp[b][t], ref[b][t])
        kappa = kappa_high if (b, t) in high else kappa_low
        val[b][t], grad[b][t] = pv + kappa * kv, pg + kappa * kg
    return val, grad, high


def ref_entropy_adv(logp, old, A, valid, H, alpha, kappa, eps_low, eps_high):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        a = A[b][t]
        shaped = a + min(alpha * H[b][t], abs(a) / kappa)
        val[b][t], grad[b][t] = ppo(logp[b][t], old[b][t], shaped, eps_low, eps_high)
    return val, grad


def ref_ce_gppo(logp, old, A, valid, beta_low, beta_high, eps_low, eps_high, dual):
    val, grad = zeros(valid), zeros(valid)
    for b, t in cells(valid):
        r, a = math.exp(logp[b][t] - old[b][t]), A[b][t]
        if a < 0 and r < 1 - eps_low:
            v, g = -beta_low * (1 - eps_low) * a, -beta_low * (1 - eps_low) * a  # d(r/sg r)/dlog π = 1
        elif a > 0 and r > 1 + eps_high:
            v, g = -beta_high * (1 + eps_high) * a, -beta_high * (1 + eps_high) * a
        else:
            v, g = -r * a, -r * a
        if dual is not None and a < 0 and -a * dual < v:
            v, g = -a * dual, 0.0
        val[b][t], grad[b][t] = v, g
    return val, grad


# ---- random torch inputs and comparison helpers (the references above use no torch) ----


def batches(scale: float = 1.0, token_adv: bool = False):
    """Small random float64 batches: a fully masked row, a one-token row, an all-equal-reward group.

    Yields dicts of logp (requires grad), old, ref, adv ([B] group-normalised, or [B, T] when
    token_adv), mask, entropy; rows of one prompt contiguous, G = 2.
    """
    import torch

    for (B, T), seed in [((4, 6), 0), ((6, 5), 1), ((8, 7), 2), ((6, 1), 3), ((4, 9), 4)]:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        lengths[0] = 0  # fully masked row
        lengths[1] = 1  # one-token row
        mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
        probs = 0.02 + 0.96 * torch.rand(B, T, generator=g, dtype=torch.float64)
        logp = probs.log()
        cap = math.log(0.995)
        old = torch.clamp(logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64), max=cap)
        ref = torch.clamp(logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64), max=cap)
        rewards = torch.randint(0, 2, (B,), generator=g).double()
        rewards[0], rewards[1] = 1.0, 0.0
        rewards[2:4] = 1.0  # an all-equal group: zero advantage
        grouped = rewards.view(-1, 2)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        if token_adv:
            adv = adv[:, None] + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
        entropy = 3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
        yield {
            "logp": logp.clone().requires_grad_(True),
            "old": old,
            "ref": ref,
            "adv": adv * scale,
            "mask": mask,
            "entropy": entropy,
            "seed": seed,
        }


def lists(x):
    """A [B, T] tensor (or [B] advantages broadcast to `like`) as nested Python floats."""
    return x.detach().tolist()


def token_lists(adv, like):
    a = adv[:, None].expand_as(like) if adv.dim() == 1 else adv
    return a.detach().tolist()


def valid_lists(mask):
    return (mask > 0).tolist()


def value_and_grad(loss, logp, mask):
    """(ℓ on valid tokens, 0 elsewhere; d Σ_valid ℓ / d log π)."""
    import torch

    valid = mask > 0
    total = torch.where(valid, loss, torch.zeros_like(loss)).sum()
    (grad,) = torch.autograd.grad(total, logp, retain_graph=True, allow_unused=True)
    grad = torch.zeros_like(logp) if grad is None else grad
    return torch.where(valid, loss, torch.zeros_like(loss)).detach(), grad


def capture_loss_mat(module):
    """Wrap `module.agg_loss` so the official function's per-token loss matrix is recorded (list of calls)."""
    seen = []
    original = module.agg_loss

    def agg_loss(*args, **kwargs):
        seen.append(kwargs.get("loss_mat", args[0] if args else None))
        return original(*args, **kwargs)

    return seen, agg_loss
