"""Vocabulary statistics of the next-token distribution, chunked over positions.

`p = softmax(z / τ)` (docs/pitfalls.md, Notation). A batch of B×T positions over a vocabulary V never holds
B×T×V float32: positions are flattened and projected to logits `chunk_tokens` at a time, each
chunk reduced at once to per-position scalars. Everything here is a detached statistic.

Alignment: the value at input position t describes the distribution that generates token t+1,
exactly like `logits[:, t]` of a forward pass (docs/pitfalls_signals.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import forward_with_stats, unwrap_model

WANTS = ("entropy", "p2", "p2logp")
CHUNK_TOKENS = 1024  # positions projected to logits at once: bounds the [chunk, V] float32 kept in memory


def _check_want(want: Iterable[str]) -> tuple[str, ...]:
    want = tuple(want)
    unknown = [w for w in want if w not in WANTS]
    if unknown:
        raise ValueError(f"vocab_stats: unknown statistic(s) {unknown}; known: {list(WANTS)}")
    return want


@torch.no_grad()
def reduce_logits(
    z: Tensor,
    targets: Tensor | None,
    *,
    temperature: float = 1.0,
    want: tuple[str, ...] = ("entropy",),
    final_logit_softcapping: float | None = None,
    inplace: bool = False,
    return_log_p: bool = False,
) -> dict[str, Tensor]:
    """{name: [n] float32} of `p = softmax(cap(z)/τ)` for logits z [n, V] (any dtype): "logp" of `targets`
    (0 outside [0, V)) when given, and the `want` statistics. The one reduction the statistics pass and
    generation-time recording (signals/generation.py) share, so both give the same numbers.
    inplace: z may be overwritten (a fresh projection), saving one [n, V] buffer. return_log_p: also
    "log_p", the [n, V] float32 log p itself."""
    fresh = inplace or z.dtype != torch.float32
    z = z.float()
    if final_logit_softcapping is not None:
        z, fresh = torch.tanh(z / final_logit_softcapping).mul_(final_logit_softcapping), True
    if temperature != 1.0:
        z, fresh = z / temperature, True
    if not fresh:
        z = z.clone()  # the caller's logits stay as they are
    V = z.shape[-1]
    z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))  # z is now log p, in place
    out: dict[str, Tensor] = {}
    if targets is not None:
        ok = (targets >= 0) & (targets < V)  # e.g. -100 labels: logp 0
        lp = z.gather(-1, targets.clamp(0, V - 1).unsqueeze(-1)).squeeze(-1)
        out["logp"] = torch.where(ok, lp, torch.zeros_like(lp))
    if want:
        p = z.exp()  # [n, V]
        if "entropy" in want:
            out["entropy"] = -torch.linalg.vecdot(p, z)
        if "p2" in want or "p2logp" in want:
            p.mul_(p)  # p is now p², in place
            if "p2" in want:
                out["p2"] = p.sum(-1)
            if "p2logp" in want:
                out["p2logp"] = torch.linalg.vecdot(p, z)
    if return_log_p:
        out["log_p"] = z
    return out


@torch.no_grad()
def chunked_vocab_stats(
    hidden: Tensor,  # [B, T, H]
    project: Callable[[Tensor], Tensor],  # [N, H] -> [N, V] logits (any dtype)
    targets: Tensor | None,  # [B, T] long, or None (no logp)
    *,
    temperature: float = 1.0,
    want: Iterable[str] = ("entropy",),
    chunk_tokens: int = CHUNK_TOKENS,
    final_logit_softcapping: float | None = None,
) -> dict[str, Tensor]:
    """Core of `vocab_stats` with an arbitrary projection (a weight, or the model's LM head module)."""
    want = _check_want(want)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, H = hidden.shape
    flat = hidden.reshape(B * T, H)
    names = (("logp",) if targets is not None else ()) + want
    out = {k: torch.zeros(B * T, dtype=torch.float32, device=hidden.device) for k in names}
    flat_targets = targets.reshape(B * T) if targets is not None else None
    for s in range(0, B * T, chunk_tokens):
        e = min(s + chunk_tokens, B * T)
        reduced = reduce_logits(
            project(flat[s:e]),
            flat_targets[s:e] if flat_targets is not None else None,
            temperature=temperature,
            want=want,
            final_logit_softcapping=final_logit_softcapping,
            inplace=True,
        )
        for k, v in reduced.items():
            out[k][s:e] = v
    return {k: v.view(B, T) for k, v in out.items()}


@torch.no_grad()
def vocab_stats(
    hidden: Tensor,  # [B, T, H] last hidden states (after the final norm)
    lm_head_weight: Tensor,  # [V, H]
    targets: Tensor,  # [B, T] long: the sampled token each position generates
    *,
    temperature: float = 1.0,
    want: Iterable[str] = ("entropy",),
    chunk_tokens: int = CHUNK_TOKENS,
    lm_head_bias: Tensor | None = None,
    final_logit_softcapping: float | None = None,
) -> dict[str, Tensor]:
    """Per-position statistics of `p = softmax(z/τ)`, `z = hidden @ W.T + b`, as [B, T] float32.

    Always "logp" (log p of `targets`; 0 where a target is outside [0, V)), plus any of
    "entropy" (−Σ p log p), "p2" (Σ p²), "p2logp" (Σ p² log p) listed in `want`.
    Logits are computed in the weight's dtype (as a forward pass would), then reduced in float32;
    at most a few `chunk_tokens`×V float32 buffers are alive at once.
    """

    def project(h: Tensor) -> Tensor:
        return F.linear(h.to(lm_head_weight.dtype), lm_head_weight, lm_head_bias)

    return chunked_vocab_stats(
        hidden,
        project,
        targets,
        temperature=temperature,
        want=want,
        chunk_tokens=chunk_tokens,
        final_logit_softcapping=final_logit_softcapping,
    )


def lm_head_of(model) -> tuple[Callable[[Tensor], Tensor], float | None]:
    """The model's output projection as a function [N, H] -> [N, V], and its logit soft-cap.

    Uses the module itself (not only its weight), so a bias or an adapter on the head is kept.
    """
    base = unwrap_model(model)
    head = base.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(base).__name__} has no output embeddings (not a causal LM?)")
    cap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)
    scale = getattr(base.config.get_text_config(), "logits_scaling", None)  # Granite divides by it
    if scale not in (None, 1, 1.0):
        return (lambda h: head(h) / scale), cap
    return head, cap


@torch.no_grad()
def predictive_entropy(
    model,
    input_ids: Tensor,  # [B, T]
    attention_mask: Tensor,  # [B, T] 1 = token, 0 = padding (left or right)
    temperature: float = 1.0,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
) -> Tensor:
    """[B, T] float32: entropy of softmax(logits/τ) at every input position; 0 at padding.

    Position t is the distribution that generates token t+1. Runs the decoder once and projects
    the last hidden states `chunk_tokens` positions at a time, never building [B, T, V] logits.
    """
    hidden, _ = forward_with_stats(model, input_ids, attention_mask)
    head, cap = lm_head_of(model)
    stats = chunked_vocab_stats(
        hidden,
        head,
        None,
        temperature=temperature,
        want=("entropy",),
        chunk_tokens=chunk_tokens,
        final_logit_softcapping=cap,
    )
    entropy = stats["entropy"]
    return torch.where(attention_mask.bool(), entropy, torch.zeros_like(entropy))
