"""The statistics pass: the statistics a rule declares, for one generation batch, in one no-grad forward.

`token_statistics` is driven by the table `stare_lab.stats.STATISTICS`: each declared name is
computed from its source.
- "batch": read from TRL's generation batch (`old_per_token_logps`, `ref_per_token_logps`).
- "vocab": from the next-token distribution `softmax(head(h)/τ)` at each completion position,
  `signals/vocab.py`, chunked over positions.
- "group": JS to the group's mean distribution, `signals/js.py`, chunked over positions.
- "attention": attention entropy at the declared layers, `signals/attention.py`.
Every statistic that needs logits goes through ONE projection, `lm_head_of(model)`: the head
module itself (bias, LoRA or any adapter included), Granite's `logits_scaling` and the text
config's `final_logit_softcapping`, so it equals `model(...).logits` (tests/test_lm_head.py).
A batch whose rule declares nothing that needs the model runs no forward at all; a rule that reads
only attention entropy stops the forward after its last layer and builds no logits.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from stare_lab.stats import STATISTICS

from .attention import attention_entropy, forward_with_stats, resolve_layers
from .js import chunked_js_to_group_mean
from .vocab import WANTS, chunked_vocab_stats, lm_head_of

# Computed whenever logits are built anyway (for the trainer's entropy metric), declared or not.
FREE_WITH_LOGITS = ("logp", "entropy")


def check_needs(needs: Iterable[str]) -> frozenset[str]:
    needs = frozenset(needs)
    unknown = needs - set(STATISTICS)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}; known: {', '.join(STATISTICS)}")
    vocab = {n for n in needs if STATISTICS[n].source == "vocab"} - {"logp"}
    if vocab - set(WANTS):  # a statistic in the table whose computation signals/vocab.py lacks
        raise NotImplementedError(f"no computation for vocab statistics {sorted(vocab - set(WANTS))} in signals/vocab.py")
    return needs


@torch.no_grad()
def token_statistics(
    model,
    batch: Mapping[str, Tensor],     # TRL's generation batch: prompt_ids/mask [B, P], completion_ids/mask [B, T], ...
    needs: Iterable[str],
    *,
    num_generations: int,            # G: rows of one prompt are contiguous groups of G
    temperature: float = 1.0,
    attn_layers: int | Iterable[int] | None = None,  # the rule's layers (None = the middle layer)
    rows_per_forward: int | None = None,             # whole groups per forward (None: the whole batch)
    chunk_tokens: int = 1024,
    chunk_queries: int = 128,
    chunk_positions: int = 64,
) -> dict[str, Tensor]:
    """{name: [B, T] float32} for every declared statistic, plus `FREE_WITH_LOGITS` when logits were built.

    Position alignment: completion token t is described by input position P + t - 1, the step that
    generated it (docs/pitfalls_signals.md).
    """
    needs = check_needs(needs)
    sources = {STATISTICS[n].source for n in needs}
    out: dict[str, Tensor] = {}
    if sources & {"vocab", "group", "attention"} or ("old_logp" in needs and _missing(batch, "old_logp")):
        out = _forward_statistics(model, batch, needs, num_generations, temperature, attn_layers,
                                  rows_per_forward, chunk_tokens, chunk_queries, chunk_positions)
    for name in needs:
        stat = STATISTICS[name]
        if stat.source != "batch":
            continue
        value = batch.get(stat.key)
        if value is None and name == "old_logp":
            value = out["logp"]  # on-policy: TRL computed no old log-probs, π_old is the rollout policy
        if value is None:
            raise ValueError(f"statistic {name!r} needs {stat.key!r} in the generation batch, which TRL did not "
                             f"compute ({stat.meaning})")
        out[name] = value.float()
    return out


def _missing(batch: Mapping[str, Tensor], name: str) -> bool:
    return batch.get(STATISTICS[name].key) is None


def _forward_statistics(model, batch, needs, G, temperature, attn_layers, rows, chunk_tokens, chunk_queries,
                        chunk_positions) -> dict[str, Tensor]:
    prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
    completion_ids, mask = batch["completion_ids"], batch["completion_mask"]
    P, T, B = prompt_ids.size(1), completion_ids.size(1), completion_ids.size(0)
    rows = rows or B
    if rows % G:
        raise ValueError(f"rows_per_forward={rows} must be a multiple of num_generations={G} (whole groups)")
    layers = resolve_layers(model, attn_layers) if "attn_entropy" in needs else None
    build_logits = any(STATISTICS[n].source in ("vocab", "group") for n in needs) or "old_logp" in needs
    want = tuple(w for w in WANTS if w in needs or w in FREE_WITH_LOGITS)
    head, cap = lm_head_of(model) if build_logits else (None, None)
    chunks: dict[str, list[Tensor]] = {}
    for start in range(0, B, rows):
        sl = slice(start, start + rows)
        input_ids = torch.cat([prompt_ids[sl], completion_ids[sl]], dim=1)
        attention_mask = torch.cat([prompt_mask[sl], mask[sl]], dim=1)
        if not build_logits:  # attention entropy only: stop after the last chosen layer
            ae = attention_entropy(model, input_ids, attention_mask, layers, chunk_queries, first_position=P - 1)
            chunks.setdefault("attn_entropy", []).append(ae[:, P - 1 : P + T - 1])
            continue
        hidden, ae = forward_with_stats(model, input_ids, attention_mask, ae_layers=layers,
                                        chunk_queries=chunk_queries, first_position=P - 1)
        h = hidden[:, P - 1 : P + T - 1]  # the position that generates completion token t
        vs = chunked_vocab_stats(h, head, completion_ids[sl], temperature=temperature, want=want,
                                 chunk_tokens=chunk_tokens, final_logit_softcapping=cap)
        for k, v in vs.items():
            chunks.setdefault(k, []).append(v)
        if ae is not None:
            chunks.setdefault("attn_entropy", []).append(ae[:, P - 1 : P + T - 1])
        if "js" in needs:
            group = torch.arange(h.size(0), device=h.device) // G
            chunks.setdefault("js", []).append(chunked_js_to_group_mean(
                h, head, group, mask[sl], temperature=temperature, chunk_positions=chunk_positions,
                final_logit_softcapping=cap))
    return {k: torch.cat(v, dim=0).float() for k, v in chunks.items()}
