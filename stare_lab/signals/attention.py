"""Attention entropy AE (arXiv 2605.07660 [secondary]; methods/anchor.py), computed inside the attention call.

At query position t of layer ℓ: `ā_t = mean_h softmax_j(q_h,t·k_h,j · scaling)` over the keys the
query attends to (j ≤ t, not padding), `AE_t = -Σ_j ā_tj log ā_tj / log n_t` with n_t the number
of attended keys; 0 where n_t ≤ 1 and at padding queries; averaged over the chosen layers.

How: a custom attention function is registered with transformers' `AttentionInterface` under
`AE_IMPLEMENTATION`, together with sdpa's mask builder under the same name in
`AttentionMaskInterface` (without it, transformers 5 passes `attention_mask=None` to unknown
implementations and padding would be lost). The function returns sdpa's output unchanged and, for
the chosen layers, reduces the attention rows to entropies `chunk_queries` queries at a time
(memory O(B·heads·chunk·T), never heads·T² for the whole sequence). The model is switched to it
for one no-grad forward and switched back afterwards. Alignment and masks: docs/pitfalls_signals.md.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

AE_IMPLEMENTATION = "stare_lab_ae"
CHUNK_QUERIES = 128  # query rows of one attention map scored at once: bounds the [B, heads, chunk, T] kept


@dataclass
class _Recorder:
    layers: frozenset[int]
    chunk_queries: int
    first_position: int
    stop_after_last: bool  # raise _StopForward once every chosen layer was seen
    last_query_only: bool = False  # generation: only each call's newest query row (signals/generation.py)
    total: Tensor | None = None  # [B, T] float32: sum of AE over the layers seen
    seen: set[int] = field(default_factory=set)
    rows: list[Tensor] = field(default_factory=list)  # last_query_only: each chosen layer's [B, Hq, Tk] scores


class _StopForward(Exception):
    """Raised after the last chosen layer when the rest of the forward is not needed."""


_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("stare_lab_ae", default=None)


def _allowed_keys(mask: Tensor | None, s: int, e: int, Tk: int, offset: int, device) -> Tensor:
    """[B or 1, c, Tk] bool: which keys queries s..e-1 attend to, from the mask transformers built."""
    if mask is None:  # sdpa's causal skip: no padding, plain causal
        q = torch.arange(s, e, device=device)[:, None] + offset
        return (torch.arange(Tk, device=device)[None, :] <= q)[None]
    rows = mask[:, 0, s:e, :Tk]  # heads share the mask in every transformers mask builder
    if rows.dtype == torch.bool:
        return rows
    return rows > torch.finfo(rows.dtype).min / 2  # additive (eager-style) mask: 0 or dtype min


def chunked_attention_entropy(
    query: Tensor,  # [B, Hq, Tq, D]
    key: Tensor,  # [B, Hkv, Tk, D]
    mask: Tensor | None,  # [B, 1, Tq, Tk] bool (True = attend) or additive float, or None = causal
    scaling: float,
    *,
    chunk_queries: int = CHUNK_QUERIES,
    first_position: int = 0,
    softcap: float | None = None,
) -> Tensor:
    """[B, Tq] float32 normalised entropy of the head-averaged attention row of each query."""
    B, Hq, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    groups = Hq // Hkv  # query head h reads kv head h // groups (transformers' repeat_kv)
    offset = Tk - Tq  # query i sits at key position i + offset (0 without a cache)
    k_t = key.float().transpose(-1, -2)  # [B, Hkv, D, Tk]
    out = torch.zeros(B, Tq, dtype=torch.float32, device=query.device)
    for s in range(max(first_position, 0), Tq, chunk_queries):
        e = min(s + chunk_queries, Tq)
        # the group's query heads stacked as rows: a plain batched matmul, keys are never repeated
        q = query[:, :, s:e].float().reshape(B, Hkv, groups * (e - s), D)
        scores = torch.matmul(q, k_t).reshape(B, Hq, e - s, Tk).mul_(scaling)
        if softcap is not None:
            scores = torch.tanh(scores / softcap).mul_(softcap)
        if mask is not None and mask.dtype != torch.bool:
            scores = scores + mask[:, :, s:e, :Tk].float()
        allowed = _allowed_keys(mask, s, e, Tk, offset, query.device)  # [B|1, c, Tk]
        scores.masked_fill_(~allowed[:, None], float("-inf"))
        out[:, s:e] = score_rows_entropy(scores.transpose(1, 2))  # [B, c, Hq, Tk] -> [B, c]
    return out


@torch.no_grad()
def last_query_scores(
    query: Tensor,  # [B, Hq, Tq, D]: only the last query row is read
    key: Tensor,  # [B, Hkv, Tk, D]
    mask: Tensor | None,  # as chunked_attention_entropy
    scaling: float,
    *,
    softcap: float | None = None,
) -> Tensor:
    """[B, Hq, Tk] float32 attention scores of the newest query, -inf at the keys it does not attend to.
    Generation keeps these per decoding step and reduces many steps at once (`score_rows_entropy`)."""
    B, Hq, _, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    q = query[:, :, -1].float().view(B, Hkv, Hq // Hkv, D)  # query heads of a kv head as rows
    scores = torch.matmul(q, key.float().transpose(-1, -2)).view(B, Hq, Tk).mul_(scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    if mask is not None:  # None: sdpa's causal skip, the newest query attends to every cached key
        row = mask[:, 0, -1, :Tk]  # [B|1, Tk]
        if row.dtype != torch.bool:
            scores = scores + row[:, None].float()
            row = row > torch.finfo(row.dtype).min / 2
        scores.masked_fill_(~row[:, None], float("-inf"))
    return scores


@torch.no_grad()
def score_rows_entropy(scores: Tensor) -> Tensor:
    """[..., Hq, Tk] scores (-inf = not attended) -> [...] float32 normalised entropy of the head-averaged row."""
    n = torch.isfinite(scores[..., 0, :]).sum(-1)  # attended keys (heads share the mask)
    mean_row = scores.softmax(-1).mean(-2)  # ā
    entropy = -torch.special.xlogy(mean_row, mean_row).sum(-1)
    return torch.where(n > 1, entropy / n.clamp(min=2).float().log(), torch.zeros_like(entropy))


def _ae_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    rec = _RECORDER.get()
    layer = getattr(module, "layer_idx", None)
    if rec is not None and layer in rec.layers and layer not in rec.seen:
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        if rec.last_query_only:  # generation: the newest query's scores, reduced later (generation.py)
            rec.rows.append(
                last_query_scores(query.detach(), key.detach(), attention_mask, scale, softcap=kwargs.get("softcap"))
            )
            rec.seen.add(layer)
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        ae = chunked_attention_entropy(
            query.detach(),
            key.detach(),
            attention_mask,
            scale,
            chunk_queries=rec.chunk_queries,
            first_position=rec.first_position,
            softcap=kwargs.get("softcap"),
        )
        rec.total = ae if rec.total is None else rec.total + ae
        rec.seen.add(layer)
        if rec.stop_after_last and rec.seen == rec.layers:
            raise _StopForward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _register() -> None:
    AttentionInterface.register(AE_IMPLEMENTATION, _ae_attention)
    AttentionMaskInterface.register(AE_IMPLEMENTATION, sdpa_mask)


def unwrap_model(model):
    """The transformers model under DDP/DeepSpeed (`.module`) and PEFT (`get_base_model`) wrappers.

    PEFT's base model keeps its injected adapter layers, so the forward still includes them.
    """
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def resolve_layers(model, layers: int | Iterable[int] | None) -> tuple[int, ...]:
    """Layer indices; None = num_hidden_layers // 2 (the middle layer, [ours]: methods/anchor.py); <0: from the end."""
    n = unwrap_model(model).config.get_text_config().num_hidden_layers
    if layers is None:
        layers = (n // 2,)
    elif isinstance(layers, int):
        layers = (layers,)
    out = tuple(sorted({layer + n if layer < 0 else layer for layer in layers}))
    bad = [layer for layer in out if not 0 <= layer < n]
    if not out or bad:
        raise ValueError(f"attention entropy layers {list(layers)} out of range for a model with {n} layers")
    return out


@contextmanager
def _ae_implementation(base):
    """Switch `base` to the AE attention function for the duration of the block, then restore it."""
    _register()
    previous = base.config._attn_implementation
    base.set_attn_implementation(AE_IMPLEMENTATION)
    try:
        yield
    finally:
        base.set_attn_implementation(previous)


@torch.no_grad()
def _run(model, input_ids, attention_mask, layers, chunk_queries, first_position, stop_early, model_kwargs):
    base = unwrap_model(model)
    # images reach the language model through the multimodal model (vision tower, merged embeddings,
    # M-RoPE positions), which returns the language model's last hidden states; text: the decoder itself
    decoder = base.model if model_kwargs and hasattr(base, "model") else base.get_decoder()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
    kwargs.update(model_kwargs)
    if layers is None:
        return decoder(**kwargs).last_hidden_state, None
    if chunk_queries < 1:
        raise ValueError(f"chunk_queries must be >= 1, got {chunk_queries}")
    rec = _Recorder(frozenset(layers), chunk_queries, first_position, stop_early)
    token = _RECORDER.set(rec)
    hidden = None
    try:
        with _ae_implementation(base):
            try:
                hidden = decoder(**kwargs).last_hidden_state
            except _StopForward:
                pass
    finally:
        _RECORDER.reset(token)
    if rec.seen != rec.layers:
        raise RuntimeError(
            f"attention layers {sorted(rec.layers - rec.seen)} never called the registered "
            f"attention function: {type(base).__name__} may not use transformers' AttentionInterface"
        )
    ae = rec.total / len(layers)
    if attention_mask is not None:  # where, not a product: hidden states of padding queries may be NaN
        ae = torch.where(attention_mask.bool(), ae, torch.zeros_like(ae))
    return hidden, ae


def attention_entropy(
    model,
    input_ids: Tensor,  # [B, T]
    attention_mask: Tensor,  # [B, T] 1 = token, 0 = padding (left or right)
    layers: int | Iterable[int] | None = (6,),
    chunk_queries: int = CHUNK_QUERIES,
    *,
    first_position: int = 0,
    **model_kwargs,
) -> Tensor:
    """[B, T] float32 AE ∈ [0, 1] at each input position (query), averaged over `layers`.

    `layers`: an index, a list, or None for num_hidden_layers // 2. The forward stops after the
    last chosen layer. Positions before `first_position` are not computed (0), e.g. the prompt.
    """
    layers = resolve_layers(model, layers)
    _, ae = _run(model, input_ids, attention_mask, layers, chunk_queries, first_position, True, model_kwargs)
    return ae


def forward_with_stats(
    model,
    input_ids: Tensor,  # [B, T]
    attention_mask: Tensor,  # [B, T]
    ae_layers: int | Iterable[int] | None = None,
    *,
    chunk_queries: int = CHUNK_QUERIES,
    first_position: int = 0,
    **model_kwargs,
) -> tuple[Tensor, Tensor | None]:
    """One no-grad decoder forward: (last hidden states [B, T, H], AE [B, T] float32 or None).

    `ae_layers=None` computes no AE and leaves the model's own attention implementation alone.
    Feed the hidden states to `vocab_stats` / `js_to_group_mean` for logp, entropy and JS.
    """
    layers = None if ae_layers is None else resolve_layers(model, ae_layers)
    return _run(model, input_ids, attention_mask, layers, chunk_queries, first_position, False, model_kwargs)
