"""Statistics recorded while transformers generates: no forward beyond the generation's own.

Each decoding step computes the logits of the next token anyway. `record_generation` hooks
- the output embedding (LM head) module: its logits of the newest position are kept, and every
  `FLUSH_STEPS` steps (and at the end) the kept steps go through `vocab.reduce_logits` at once (the
  statistics pass's own reduction: soft-cap, Granite's logit scale, the sampling temperature τ, then
  entropy, p², p²·log p of `p = softmax(z/τ)`);
- the input embedding module: its input at the next step is the sampled token, whose log p is read
  from its step's log p;
- for attention entropy, the model's attention implementation is switched to the AE function
  (signals/attention.py) for the generation; each step keeps the newest query's scores at the
  chosen layers, over the keys it attends to (the KV cache, padding excluded), reduced with the logits;
- for ICT's JS (signals/js.py), every rollout of a group is sampled in the same generate call, so
  at each step the log p vectors of a group's live rows give the group mean and each row's
  JS to it (`js._js_chunk`, the pass's own function). A row is live at step t when none of its
  tokens before t is an end-of-sequence token, TRL's completion mask; `result` drops JS when the
  final mask says otherwise (`mask_truncated_completions`). Only with whole groups in one process
  (`js_group`): with several processes a group can span ranks, and the pass's JS is a collective
  every rank must join, so every rank takes the pass.

The distribution is the temperature-scaled policy `softmax(z/τ)` the rules mean (docs/pitfalls.md),
from the raw logits: TRL's repetition penalty, top-k/top-p/min-p and suppressed tokens act later,
in generate's logits processors, and are not in these numbers (the statistics pass does not see
them either). Values equal the statistics pass on the same rollouts to float tolerance: the
cached step-by-step forward and the full forward add in other orders (tests/signals/test_stats_paths.py).

`GenerationRecord.result` refuses (returns None) when the recording does not line up with the
completions TRL returns (several generate calls, a rollout_func, tool turns, paged generation):
the caller then falls back to the statistics pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import (
    _RECORDER,
    CHUNK_QUERIES,
    _ae_implementation,
    _Recorder,
    resolve_layers,
    score_rows_entropy,
    unwrap_model,
)
from .js import _js_chunk
from .vocab import WANTS, reduce_logits

# What generation can give (JS only with whole groups in one process); the rest (TRL's batch
# statistics) come from elsewhere.
GENERATION_STATISTICS = frozenset({"logp", "entropy", "p2", "p2logp", "attn_entropy", "old_logp", "js"})


# Decoding steps reduced together: a step only keeps its newest logits (and attention scores); every
# FLUSH_STEPS steps they are reduced in one batch of kernels instead of one small batch per step (the
# per-step launches were most of the recording's cost; each flush costs ~0.3 ms of fixed launches on
# the 2-core CPU, so 64 rather than 16: a ≤ 64-token rollout of a small vocabulary flushes once).
# Sooner once the kept logits reach FLUSH_ELEMENTS values (a few float32 buffers of that size are
# alive while reducing): a 152k vocabulary with 64 rows flushes every 6 steps, with 512 rows every step,
# a 32k vocabulary with 64 rows every 32 steps.
FLUSH_STEPS = 64
FLUSH_ELEMENTS = 2**26


@dataclass
class GenerationRecord:
    want: tuple[str, ...]  # vocab statistics to keep per step
    temperature: float
    cap: float | None
    scale: float | None
    ae: _Recorder | None = None
    js_group: int | None = None  # G: record JS over groups of G rows
    eos_ids: tuple[int, ...] = ()  # tokens that end a row (TRL's eos_token_ids)
    flush_steps: int = FLUSH_STEPS
    chunks: dict[str, list[Tensor]] = field(default_factory=dict)  # name -> [B, m] pieces in step order
    tokens: list[Tensor] = field(default_factory=list)  # sampled token of steps 0..n-2, [B]
    pending: list[Tensor] = field(default_factory=list)  # newest logits [B, V] of unreduced steps
    pending_rows: list[list[Tensor]] = field(default_factory=list)  # AE: per step, each layer's [B, Hq, Tk]
    pending_live: list[Tensor] = field(default_factory=list)  # JS: per step, [B] live rows
    prev_logp: Tensor | None = None  # [B, V] log p of a reduced step whose token
    reduced: int = 0  # is not known yet; steps reduced so far
    calls: int = 0  # prefill steps seen (generate calls)
    live: Tensor | None = None  # [B] bool: no end token sampled yet
    live_chunks: list[Tensor] = field(default_factory=list)  # JS: [B, m] live rows of the reduced steps

    def on_logits(self, logits: Tensor) -> None:
        z = logits[:, -1]  # [B, V] the newest position
        self.pending.append(z.clone() if logits.size(1) > 1 else z)  # a prefill's [B, P, V] is not kept alive
        if self.js_group:
            self.pending_live.append(
                self.live if self.live is not None else torch.ones(z.size(0), dtype=torch.bool, device=z.device)
            )
        if self.ae is not None:
            self.pending_rows.append(self.ae.rows)
            self.ae.rows, self.ae.seen = [], set()
        if len(self.pending) >= self.flush_steps or len(self.pending) * z.numel() >= FLUSH_ELEMENTS:
            self._flush()

    def on_input(self, input_ids: Tensor) -> None:
        if input_ids.size(1) != 1:  # a prefill: a new generate call
            self.calls += 1
            self.live = None
            return
        if len(self.tokens) >= self.reduced + len(self.pending):  # no step's logits yet
            return
        tok = input_ids[:, 0]
        self.tokens.append(tok)
        if self.prev_logp is not None:  # the token of the last reduced step
            self.chunks.setdefault("logp", []).append(self.prev_logp.gather(-1, tok[:, None]))
            self.prev_logp = None
        if self.js_group:
            ended = torch.isin(tok, torch.tensor(self.eos_ids, device=tok.device))
            self.live = ~ended if self.live is None else self.live & ~ended

    def _flush(self) -> None:
        """Reduce the pending steps at once: vocabulary statistics, log p of the tokens already sampled,
        JS and attention entropy."""
        if not self.pending:
            return
        k, B = len(self.pending), self.pending[0].size(0)
        z = torch.stack(self.pending, 1).flatten(0, 1)  # [B·k, V], a fresh buffer
        if self.scale not in (None, 1, 1.0):
            z = z / self.scale
        red = reduce_logits(
            z,
            None,
            temperature=self.temperature,
            want=self.want,
            final_logit_softcapping=self.cap,
            inplace=True,
            return_log_p=True,
        )
        log_p = red.pop("log_p").view(B, k, -1)
        for name, v in red.items():
            self.chunks.setdefault(name, []).append(v.view(B, k))
        known = self.tokens[self.reduced : self.reduced + k - 1]  # every pending step's token but the last's
        if known:
            self.chunks.setdefault("logp", []).append(
                log_p[:, : k - 1].gather(-1, torch.stack(known, 1)[..., None]).squeeze(-1)
            )
        self.prev_logp = log_p[:, -1]
        if self.js_group:
            self._js(log_p, torch.stack(self.pending_live, 1), self.js_group)
        if self.ae is not None:
            self._attention_entropy(self.pending_rows, len(self.ae.layers))
        self.reduced += k
        self.pending, self.pending_rows, self.pending_live = [], [], []

    def _js(self, log_p: Tensor, live: Tensor, G: int) -> None:
        """JS of each live row to its group's live mean at each step (0 where fewer than two rows are live);
        log_p [B, k, V], live [B, k], G the group size. Groups and steps together play the pass's positions."""
        B, k, V = log_p.shape
        if B % G:  # not whole groups: the pass computes JS
            self.js_group = None
            self.chunks.pop("js", None)
            self.live_chunks = []
            return
        by_member = live.view(B // G, G, k).transpose(0, 1).reshape(G, -1)  # [G, groups·k]
        u = _js_chunk(log_p.view(B // G, G, k, V).transpose(0, 1).reshape(G, -1, V), by_member)
        u = torch.where(by_member & (by_member.sum(0) >= 2), u, torch.zeros_like(u))
        self.chunks.setdefault("js", []).append(u.view(G, B // G, k).transpose(0, 1).reshape(B, k))
        self.live_chunks.append(live)

    def _attention_entropy(self, rows: list[list[Tensor]], n_layers: int) -> None:
        """AE of each pending step, averaged over the `n_layers` recorded layers: each step's scores padded
        (-inf) to the longest."""
        per_layer = []  # [B, k] each
        for layer in range(n_layers):
            per_step = [step[layer] for step in rows]
            width = max(r.size(-1) for r in per_step)
            padded = torch.stack([F.pad(r, (0, width - r.size(-1)), value=float("-inf")) for r in per_step], 1)
            per_layer.append(score_rows_entropy(padded))
        total = per_layer[0]
        for ae in per_layer[1:]:  # summed in layer order
            total = total + ae
        self.chunks.setdefault("attn_entropy", []).append(total / n_layers)

    def result(self, completion_ids: Tensor, mask: Tensor) -> dict[str, Tensor] | None:
        """{name: [B, T] float32} aligned with TRL's completions, or None when the record does not line up."""
        self._flush()
        B, T = completion_ids.shape
        n = self.reduced
        if self.calls != 1 or n < T or self.prev_logp is None or self.prev_logp.size(0) != B:
            return None
        if self.tokens:
            sampled = torch.stack(self.tokens, 1)[:, :T]  # [B, n-1]
            m = mask[:, : sampled.size(1)].bool()
            if sampled.size(1) < T - 1 or not torch.equal(sampled[m], completion_ids[:, : sampled.size(1)][m]):
                return None
        chunks = {k: list(v) for k, v in self.chunks.items()}
        if n == T:  # the last step's token: the completion's
            chunks.setdefault("logp", []).append(self.prev_logp.gather(-1, completion_ids[:, n - 1 : n].clamp(min=0)))
        if self.live_chunks and not torch.equal(torch.cat(self.live_chunks, 1)[:, :T], mask.bool()):
            chunks.pop("js", None)  # the final mask is not the live mask (e.g. truncated rows)
        out = {}
        for k, v in chunks.items():
            x = torch.cat(v, 1)[:, :T].float()
            if x.size(1) != T:
                return None
            out[k] = torch.where(mask.bool(), x, torch.zeros_like(x))
        return out


@contextmanager
def record_generation(
    model,
    needs,
    *,
    temperature: float = 1.0,
    attn_layers=None,
    chunk_queries: int = CHUNK_QUERIES,
    js_group: int | None = None,
    eos_ids=(),
) -> Iterator[GenerationRecord | None]:
    """Record the statistics in `needs` ∩ GENERATION_STATISTICS during the `generate` calls inside the block.

    JS is recorded only with `js_group` (G: each run of G rows in the generate batch is one group, all in
    this process) and `eos_ids` (the tokens that end a row). Yields None (records nothing) when none of
    the statistics is needed.
    """
    needs = set(needs)
    if "js" in needs and not (js_group and js_group > 1 and eos_ids):
        needs.discard("js")  # the pass computes it
    if not needs & GENERATION_STATISTICS:
        yield None
        return
    base = unwrap_model(model)
    text = base.config.get_text_config()
    want = tuple(w for w in WANTS if w in needs or w == "entropy")
    rec = GenerationRecord(
        want=want,
        temperature=temperature,
        cap=getattr(text, "final_logit_softcapping", None),
        scale=getattr(text, "logits_scaling", None),
        js_group=js_group if "js" in needs else None,
        eos_ids=tuple(eos_ids),
    )
    handles = [
        base.get_output_embeddings().register_forward_hook(lambda m, i, o: rec.on_logits(o)),
        base.get_input_embeddings().register_forward_pre_hook(lambda m, i: rec.on_input(i[0])),
    ]
    token = None
    try:
        if "attn_entropy" in needs:
            layers = resolve_layers(base, attn_layers)
            rec.ae = _Recorder(frozenset(layers), chunk_queries, 0, False, last_query_only=True)
            token = _RECORDER.set(rec.ae)
            with _ae_implementation(base):
                yield rec
        else:
            yield rec
    finally:
        if token is not None:
            _RECORDER.reset(token)
        for h in handles:
            h.remove()
