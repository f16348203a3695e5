"""Statistics recorded while transformers generates: no forward beyond the generation's own.

Each decoding step computes the logits of the next token anyway. `record_generation` hooks
- the output embedding (LM head) module: its logits of the newest position go through
  `vocab.reduce_logits` (the statistics pass's own reduction: soft-cap, Granite's logit scale, the
  sampling temperature τ, then entropy, p², p²·log p of `p = softmax(z/τ)`), and the step's log p
  vector is kept until the sampled token is known;
- the input embedding module: its input at the next step is the sampled token, whose log p is then read;
- for attention entropy, the model's attention implementation is switched to the AE function
  (signals/attention.py) for the generation, and each step's newest query row is reduced at the
  chosen layers, over the keys it attends to (the KV cache, padding excluded);
- for ICT's JS (signals/js.py), every rollout of a group is sampled in the same generate call, so
  at each step the step's log p vectors of a group's live rows give the group mean and each row's
  JS to it (`js._js_chunk`, the pass's own function). A row is live at step t when none of its
  tokens before t is an end-of-sequence token, TRL's completion mask; `result` drops JS when the
  final mask says otherwise (`mask_truncated_completions`). Only with whole groups in one process
  (`js_group`): with several processes a group can span ranks, and the pass's JS is a collective
  every rank must join, so every rank takes the pass.

The distribution is the temperature-scaled policy `softmax(z/τ)` the rules mean (docs/pitfalls.md),
from the raw logits: TRL's repetition penalty, top-k/top-p/min-p and suppressed tokens act later,
in generate's logits processors, and are not in these numbers (the statistics pass does not see
them either). Values equal the statistics pass on the same rollouts to float tolerance: the
cached step-by-step forward and the full forward add in other orders (tests/test_stats_paths.py).

`GenerationRecord.result` refuses (returns None) when the recording does not line up with the
completions TRL returns (several generate calls, a rollout_func, tool turns, paged generation):
the caller then falls back to the statistics pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor

from .attention import _RECORDER, _ae_implementation, _Recorder, resolve_layers, unwrap_model
from .js import _js_chunk
from .vocab import WANTS, reduce_logits

# What generation can give (JS only with whole groups in one process); the rest (TRL's batch
# statistics) come from elsewhere.
GENERATION_STATISTICS = frozenset({"logp", "entropy", "p2", "p2logp", "attn_entropy", "old_logp", "js"})


@dataclass
class GenerationRecord:
    want: tuple[str, ...]                                    # vocab statistics to keep per step
    temperature: float
    cap: float | None
    scale: float | None
    ae: _Recorder | None = None
    steps: dict[str, list[Tensor]] = field(default_factory=dict)   # name -> per step [B]
    tokens: list[Tensor] = field(default_factory=list)             # sampled token of steps 0..n-2, [B]
    prev_logp: Tensor | None = None                                # [B, V] log p of the last step
    calls: int = 0                                                 # prefill steps seen (generate calls)
    js_group: int | None = None                                    # G: record JS over groups of G rows
    eos_ids: tuple[int, ...] = ()                                  # tokens that end a row (TRL's eos_token_ids)
    live: Tensor | None = None                                     # [B] bool: no end token sampled yet

    def on_logits(self, logits: Tensor) -> None:
        z = logits[:, -1]                                            # [B, V] the newest position
        if self.scale not in (None, 1, 1.0):
            z = z / self.scale
        red = reduce_logits(z, None, temperature=self.temperature, want=self.want, final_logit_softcapping=self.cap,
                            return_log_p=True)
        self.prev_logp = red.pop("log_p")
        for k, v in red.items():
            self.steps.setdefault(k, []).append(v)
        if self.js_group:
            self._record_js(self.prev_logp)
        if self.ae is not None:
            total = self.ae.total
            self.steps.setdefault("attn_entropy", []).append(
                total[:, -1] / len(self.ae.layers) if total is not None else torch.zeros(z.size(0), device=z.device))
            self.ae.total, self.ae.seen = None, set()

    def _record_js(self, log_p: Tensor) -> None:
        """This step's JS of each live row to its group's live mean (0 where fewer than two rows are live)."""
        B, V = log_p.shape
        G = self.js_group
        if B % G:                                                    # not whole groups: the pass computes JS
            self.js_group = None
            self.steps.pop("js", None)
            self.steps.pop("_live", None)
            return
        live = self.live if self.live is not None else torch.ones(B, dtype=torch.bool, device=log_p.device)
        by_member = live.view(B // G, G).t()                         # [G, groups]
        u = _js_chunk(log_p.view(B // G, G, V).transpose(0, 1), by_member)   # groups play the positions
        keep = by_member & (by_member.sum(0) >= 2)
        js = torch.where(keep, u, torch.zeros_like(u)).t().reshape(B)
        self.steps.setdefault("js", []).append(js)
        self.steps.setdefault("_live", []).append(live)

    def on_input(self, input_ids: Tensor) -> None:
        if input_ids.size(1) != 1:                                   # a prefill: a new generate call
            self.calls += 1
            self.live = None
            return
        if self.prev_logp is not None:
            tok = input_ids[:, 0]
            self.tokens.append(tok)
            self.steps.setdefault("logp", []).append(self.prev_logp.gather(-1, tok[:, None]).squeeze(-1))
            if self.js_group:
                ended = torch.isin(tok, torch.tensor(self.eos_ids, device=tok.device))
                self.live = ~ended if self.live is None else self.live & ~ended

    def result(self, completion_ids: Tensor, mask: Tensor) -> dict[str, Tensor] | None:
        """{name: [B, T] float32} aligned with TRL's completions, or None when the record does not line up."""
        B, T = completion_ids.shape
        n = len(self.steps.get("entropy", self.steps.get("attn_entropy", [])))
        if self.calls != 1 or n < T or self.prev_logp is None or self.prev_logp.size(0) != B:
            return None
        if self.tokens:
            sampled = torch.stack(self.tokens, 1)[:, : T]                      # [B, n-1]
            m = mask[:, : sampled.size(1)].bool()
            if sampled.size(1) < T - 1 or not torch.equal(sampled[m], completion_ids[:, : sampled.size(1)][m]):
                return None
        last = self.prev_logp.gather(-1, completion_ids[:, n - 1 : n].clamp(min=0)).squeeze(-1) if n == T else None
        out = {}
        steps = dict(self.steps)
        live = steps.pop("_live", None)
        if live is not None and not torch.equal(torch.stack(live, 1)[:, :T], mask.bool()):
            steps.pop("js", None)                    # the final mask is not the live mask (e.g. truncated rows)
        for k, v in steps.items():
            cols = list(v)
            if k == "logp" and last is not None:
                cols = cols + [last]
            x = torch.stack(cols, 1)[:, :T].float()
            out[k] = torch.where(mask.bool(), x, torch.zeros_like(x))
        if "logp" in out and out["logp"].size(1) != T:
            return None
        return out


@contextmanager
def record_generation(model, needs, *, temperature: float = 1.0, attn_layers=None, chunk_queries: int = 128,
                      js_group: int | None = None, eos_ids=()) -> Iterator[GenerationRecord | None]:
    """Record the statistics in `needs` ∩ GENERATION_STATISTICS during the `generate` calls inside the block.

    JS is recorded only with `js_group` (G: each run of G rows in the generate batch is one group, all in
    this process) and `eos_ids` (the tokens that end a row). Yields None (records nothing) when none of
    the statistics is needed.
    """
    needs = set(needs)
    if "js" in needs and not (js_group and js_group > 1 and eos_ids):
        needs.discard("js")                         # the pass computes it
    if not needs & GENERATION_STATISTICS:
        yield None
        return
    base = unwrap_model(model)
    text = base.config.get_text_config()
    want = tuple(w for w in WANTS if w in needs or w == "entropy")
    rec = GenerationRecord(want=want, temperature=temperature, cap=getattr(text, "final_logit_softcapping", None),
                           scale=getattr(text, "logits_scaling", None),
                           js_group=js_group if "js" in needs else None, eos_ids=tuple(eos_ids))
    handles = [base.get_output_embeddings().register_forward_hook(lambda m, i, o: rec.on_logits(o)),
               base.get_input_embeddings().register_forward_pre_hook(lambda m, i: rec.on_input(i[0]))]
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
