"""Rollouts whose next-token distributions nearly agree (JS of 1e-10..1e-6 nats, as on the built-in
model): the input of the selection-rounding tests (tests/methods/test_selection_rounding.py), imported by
that file and by the child processes it runs under another CPU vector width."""

from __future__ import annotations

import torch


def agreeing_group(seed: int = 0, B: int = 16, T: int = 40, H: int = 32, V: int = 200):
    """Rollouts of a prompt whose hidden states agree up to 1e-4: JS of 1e-10..1e-6 nats, as on the
    built-in model. Two prompts of 8 rollouts, every position live."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(2, 1, T, H, generator=g) * 3
    hidden = (base + 1e-4 * torch.randn(2, B // 2, T, H, generator=g)).reshape(B, T, H)
    weight = torch.randn(V, H, generator=g)
    group = torch.arange(B) // (B // 2)
    return hidden, weight, group, torch.ones(B, T)
