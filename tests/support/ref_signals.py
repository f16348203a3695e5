"""Slow, obviously correct float64 references for the statistics of stare_lab/signals: attention entropy
from eager attention maps, the vocabulary statistics from a full softmax, and JS to the group mean from
explicit probability vectors. tests/signals/test_signals.py checks the built-in shapes against them and
tests/signals/test_signals_smollm2.py a real LM's (49,152 tokens, grouped-query heads 9/3).
"""

from __future__ import annotations

import math

import torch


def eager_attentions(model, ids, mask):
    """The model's attention maps [B, heads, T, T] per layer from its eager implementation, which
    materialises them (sdpa does not); the model's own implementation is restored after."""
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(prev)


def reference_ae(attentions, mask, layers):
    """Loop over rows and queries of eager attention maps: signals/attention.py's AE (the entropy of the
    head-mean row over the n_t keys a query sees, over log n_t), averaged over layers."""
    B, T = mask.shape
    ref = torch.zeros(B, T, dtype=torch.float64)
    for layer in layers:
        mean_row = attentions[layer].double().mean(1)  # [B, T, T] ā
        for b in range(B):
            for t in range(T):
                keys = [j for j in range(t + 1) if mask[b, j] == 1]
                if mask[b, t] == 0 or len(keys) < 2:
                    continue
                row = mean_row[b, t, keys]
                ref[b, t] += -(row * row.log()).sum() / math.log(len(keys)) / len(layers)
    return ref.float()


def reference_ae_fast(att, mask):
    """Vectorised `reference_ae` for one layer's maps (the loop is too slow at T = 300)."""
    mean_row = att.double().mean(1)
    n = mask.cumsum(-1).double()
    h = -torch.special.xlogy(mean_row, mean_row).sum(-1) / n.clamp(min=2).log()
    return torch.where((mask == 1) & (n > 1), h, torch.zeros_like(h)).float()


def naive_vocab(hidden, W, b, targets, tau, cap=None):
    """logp of the targets, entropy, Σp² and Σp²·log p of softmax(z/τ), z = h·Wᵀ + b, all in float64."""
    z = hidden.double() @ W.double().T + (b.double() if b is not None else 0)
    if cap is not None:
        z = torch.tanh(z / cap) * cap
    logp = torch.log_softmax(z / tau, -1)
    p = logp.exp()
    return {
        "logp": logp.gather(-1, targets[..., None])[..., 0],
        "entropy": -(p * logp).sum(-1),
        "p2": (p * p).sum(-1),
        "p2logp": (p * p * logp).sum(-1),
    }


def naive_js(hidden, W, group, live, tau):
    """Loop over groups, positions and rows with explicit probability vectors: JS(p_i ‖ mean of the live
    rows of i's group at that position), 0 where fewer than two rows are live."""
    B, T, _ = hidden.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for gid in group.unique().tolist():
        rows = [i for i in range(B) if group[i] == gid]
        for t in range(T):
            alive = [i for i in rows if live[i, t]]
            if len(alive) < 2:
                continue
            probs = {i: torch.softmax(hidden[i, t].double() @ W.double().T / tau, -1) for i in alive}
            mean = sum(probs.values()) / len(alive)
            for i in alive:
                m = (probs[i] + mean) / 2
                kl = lambda a, b: (a * (a / b).log()).sum()  # noqa: E731
                out[i, t] = 0.5 * kl(probs[i], m) + 0.5 * kl(mean, m)
    return out.float()
