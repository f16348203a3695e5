"""Keeping generation batches during training: the statistics every rule reads, and the trainer hook.

The trainer's own stats pass computes only what its rule needs (docs/design.md, "Statistics"). A kept batch must
let *every* registered rule run, so on a kept step `stats_for_all_rules` adds the missing
statistics with one more no-grad pass (only on kept steps: a run that keeps no batch pays nothing).
Statistics the trainer already computed are kept as they are, so the run's own rule reproduces
its training weights exactly on the saved batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from stare_lab.methods import NORMALIZE, get_method, list_methods
from stare_lab.record.kept_batch import ATTN, STAT_FIELDS, attn_key, batch_path, save_batch
from stare_lab.signals import distributed, resolve_layers, token_statistics
from stare_lab.signals.attention import CHUNK_QUERIES, unwrap_model
from stare_lab.signals.js import CHUNK_POSITIONS
from stare_lab.signals.vocab import CHUNK_TOKENS
from stare_lab.stats import TokenStats


def needed_statistics(run_rule=None, trainer=None) -> tuple[set[str], list[tuple[int, ...] | None]]:
    """(union of the statistics every registered rule with default params and `run_rule` read with
    these trainer values, the attention layer sets they read; None = the middle layer)."""
    rules = [get_method(name) for name in list_methods()] + ([run_rule] if run_rule is not None else [])
    needs: set[str] = set()
    layers: list[tuple[int, ...] | None] = []
    for rule in rules:
        n = set(rule.needs_for(trainer))
        needs |= n
        if "attn_entropy" in n and rule.attn_layers not in layers:
            layers.append(rule.attn_layers)
    return needs, layers


@torch.no_grad()
def stats_for_all_rules(
    model,
    out: dict[str, Tensor],
    stats: TokenStats | None = None,
    *,
    num_generations: int,
    temperature: float = 1.0,
    run_rule=None,
    trainer=None,
    rows_per_forward: int | None = None,
    **chunks: Any,  # token_statistics' chunk sizes, and group and accelerator with several processes
) -> dict[str, Tensor]:
    """Every statistic any registered rule (and `run_rule`) reads, for TRL's generation batch `out`.

    Returns name -> [B, T] float32 ("logp", "entropy", "p2", "p2logp", "js", "old_logp", ... as the
    rules declare them), "attn_entropy" for the middle layer and "attn_entropy@<layers>" for any
    other layer set a rule reads. Statistics already in `stats` (the trainer's) are kept unchanged;
    the rest come from `signals.token_statistics`, one call per attention layer set. `trainer` is the
    run's `TrainerValues`; `chunks` are token_statistics' chunk_tokens / chunk_queries / chunk_positions
    (and group / accelerator with several processes).
    """
    needs, layer_sets = needed_statistics(run_rule, trainer)
    base = unwrap_model(model)
    have: dict[str, Tensor] = {}
    if stats is not None:
        for name in ("logp", *STAT_FIELDS):
            value = getattr(stats, name, None)
            if value is not None and bool(torch.isfinite(value).all()):  # NaN logp: not declared by the rule
                have[name] = value.float()
        if stats.attn_entropy is not None and run_rule is not None:
            have[attn_key(resolve_layers(base, run_rule.attn_layers))] = stats.attn_entropy.float()
    kw: dict[str, Any] = dict(  # token_statistics' keyword arguments, the same for every call
        num_generations=num_generations, temperature=temperature, rows_per_forward=rows_per_forward, **chunks
    )
    plain = (needs - {"attn_entropy"}) | {"logp"}
    wanted = dict.fromkeys(resolve_layers(base, lay) for lay in layer_sets)  # resolved, in order
    missing_attn = [lay for lay in wanted if attn_key(lay) not in have]
    result = dict(have)
    todo = plain - set(have)
    if todo:  # one forward gives the vocabulary and group statistics and one attention layer set
        first = missing_attn.pop(0) if missing_attn else None
        computed = token_statistics(
            model, out, todo | ({"attn_entropy"} if first is not None else set()), attn_layers=first, **kw
        )
        if first is not None:
            result[attn_key(first)] = computed.pop("attn_entropy")
        result.update({k: v for k, v in computed.items() if k not in have})
    for lay in missing_attn:
        result[attn_key(lay)] = token_statistics(model, out, {"attn_entropy"}, attn_layers=lay, **kw)["attn_entropy"]
    # the middle layer's attention entropy is stored under the plain key (meta["attn_layers"] names it)
    mid = attn_key(resolve_layers(base, None))
    if mid in result:
        result[ATTN] = result.pop(mid)
    return {k: v.float() for k, v in result.items()}


def token_pieces(tokenizer, ids: Tensor) -> tuple[dict[int, str], dict[int, tuple[str, bytes]]]:
    """(id -> decoded text of that single token, for every id in `ids`; id -> (raw piece, bytes) of
    the tokens that are part of a character: a byte-level BPE splits a multi-byte UTF-8 character over
    tokens, and each alone decodes to U+FFFD. The page decodes a row's bytes in order (batch.row_texts)
    and shows the raw piece on hover."""
    unique = sorted(set(ids.reshape(-1).tolist()))
    texts = tokenizer.batch_decode([[i] for i in unique], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    pieces = dict(zip(unique, texts, strict=True))
    partial = [i for i, text in pieces.items() if "\ufffd" in text]
    raws = tokenizer.convert_ids_to_tokens(partial) if partial else []
    byte_pieces = {}
    for i, raw in zip(partial, raws, strict=True):
        data = piece_bytes(str(raw))
        if data is not None:
            byte_pieces[i] = (str(raw), data)
    return pieces, byte_pieces


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet (used by Qwen2, Llama 3, ...): the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_ALPHABET = _byte_alphabet()


def piece_bytes(raw: str) -> bytes | None:
    """The bytes a raw vocabulary piece stands for: byte-level BPE ("Ã©"), SentencePiece byte fallback
    ("<0xE2>"); None for any other kind of piece."""
    if len(raw) == 6 and raw.startswith("<0x") and raw.endswith(">"):
        try:
            return bytes([int(raw[3:5], 16)])
        except ValueError:
            return None
    if raw and all(c in BYTE_ALPHABET for c in raw):
        return bytes(BYTE_ALPHABET[c] for c in raw)
    return None


def rewards_from_trainer(trainer, rows: int, *, global_rows: bool = False) -> Tensor:
    """[rows] total reward of this process's rows of the last generation batch (or, with global_rows, of
    the last `rows` rows over all processes) from TRL's log buffer (`_logs["rewards"]`, gathered over
    processes, weighted by `reward_weights`); NaN when unavailable."""
    logs = getattr(trainer, "_logs", {}).get("rewards", {})
    names = list(getattr(trainer, "reward_func_names", []))
    weights = getattr(trainer, "reward_weights", None)
    world = 1 if global_rows else trainer.accelerator.num_processes
    if not names or any(len(logs.get(n, ())) < rows * world for n in names):
        return torch.full((rows,), float("nan"))
    first = 0 if global_rows else trainer.accelerator.process_index * rows
    per_func = torch.tensor([list(logs[n])[-rows * world :][first : first + rows] for n in names]).T  # [rows, F]
    w = weights.float().cpu() if weights is not None else torch.ones(len(names))
    return (per_func.float() * w).nansum(1)


def keep_due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def collect_for_trainer(
    trainer,
    out: dict[str, Tensor],
    stats: TokenStats | None,
    *,
    run_dir: Path | str,
    every: int,
    rule_state: dict[str, Any],
    trained_weights: Tensor | None = None,
    meta: dict[str, Any] | None = None,
) -> Path | None:
    """The trainer hook: on a kept step (`trainer.state.global_step % every == 0`) write
    `<run_dir>/batches/step-<N>.safetensors` with every statistic any rule reads; else None.

    `out` is this process's dict from `_generate_and_score_completions`; `stats` the TokenStats the rule
    read, the *global* generation batch (distributed.global_token_stats; with one process the local one),
    or None to recompute everything through the same `signals.token_statistics`; `rule_state` the rule
    state as the rule received it, taken *before* the call (the rule updates its memory in place):
    `RuleState.to_dict()` after step and total_steps are set; `trained_weights` the (global) weights it
    returned. The record holds the global batch, so the run's rule on it reproduces `trained_weights`.
    Every process must call it on a kept step (the extra forward is collective under FSDP / ZeRO-3, the
    rows are gathered); only the main process writes.
    """
    step = int(trainer.state.global_step)
    if not keep_due(step, every):
        return None
    fields = kept_batch_fields(trainer, out, stats, rule_state=rule_state, trained_weights=trained_weights, meta=meta)
    return save_batch(batch_path(run_dir, step), step, **fields) if fields is not None else None


def kept_batch_fields(
    trainer,
    out: dict[str, Tensor],
    stats: TokenStats | None,
    *,
    rule_state: dict[str, Any],
    trained_weights: Tensor | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """`save_batch`'s keyword arguments (without path and step) of this generation batch on the main
    process, None on the others (`collect_for_trainer` has the arguments; every process must call it):
    every statistic any rule reads on this process's rows, every process's rows gathered on the main
    process, then the text and the set-up that make the file readable without the run."""
    acc = trainer.accelerator
    B = out["completion_ids"].size(0)
    group = (acc.process_index * B + torch.arange(B, device=out["completion_mask"].device)) // int(
        trainer.num_generations
    )
    all_stats = _statistics_of_every_rule(trainer, out, stats, group)
    rows = distributed.gather_rows(
        {
            "completion_ids": out["completion_ids"],
            "mask": out["completion_mask"],
            "advantages": out["advantages"],
            "group": group,
            "prompt_ids": out["prompt_ids"],
            "prompt_mask": out["prompt_mask"],
            **{f"stat:{k}": v for k, v in all_stats.items()},
        },
        acc,
        left_padded=("prompt_ids", "prompt_mask"),
    )
    if not acc.is_main_process:
        return None
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)  # a processor wraps its tokenizer
    prompt_ids, prompt_mask = rows["prompt_ids"], rows["prompt_mask"]
    pieces, byte_pieces = token_pieces(tok, rows["completion_ids"])
    prompts = tok.batch_decode(
        [row[m > 0].tolist() for row, m in zip(prompt_ids, prompt_mask, strict=True)], skip_special_tokens=True
    )
    n = rows["completion_ids"].size(0)
    return dict(
        completion_ids=rows["completion_ids"],
        mask=rows["mask"],
        rewards=rewards_from_trainer(trainer, n, global_rows=True),
        advantages=rows["advantages"],
        group=rows["group"],
        stats={k[5:]: v for k, v in rows.items() if k.startswith("stat:")},
        token_pieces=pieces,
        byte_pieces=byte_pieces,
        prompts=prompts,
        run_rule={"name": trainer.rule.name, "params": _params_dict(trainer.rule.params)},
        rule_state=rule_state,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        trained_weights=trained_weights,
        meta=_batch_meta(trainer, meta),
    )


def _statistics_of_every_rule(
    trainer, out: dict[str, Tensor], stats: TokenStats | None, group: Tensor
) -> dict[str, Tensor]:
    """`stats_for_all_rules` on this process's rows, with the trainer's own statistics, chunk sizes and
    rows per forward. The model stays in the mode the trainer's own statistics pass ran in, so the values
    agree."""
    acc = trainer.accelerator
    G = int(trainer.num_generations)
    B, T = out["completion_ids"].shape
    return stats_for_all_rules(
        acc.unwrap_model(trainer.model),
        out,
        _local_stats(stats, acc.process_index * B, B, T) if stats is not None else None,
        num_generations=G,
        temperature=float(getattr(trainer, "temperature", 1.0)),
        run_rule=trainer.rule,
        trainer=getattr(trainer, "trainer_values", None),
        rows_per_forward=max(G, trainer.args.per_device_train_batch_size // G * G),
        chunk_tokens=getattr(trainer, "stats_chunk_tokens", CHUNK_TOKENS),
        chunk_queries=getattr(trainer, "attn_chunk_queries", CHUNK_QUERIES),
        chunk_positions=getattr(trainer, "js_chunk_positions", CHUNK_POSITIONS),
        group=group,
        accelerator=acc,
    )


def _batch_meta(trainer, meta: dict[str, Any] | None) -> dict[str, Any]:
    """The set-up a kept batch records: the model's layers (and which is the middle one, whose attention
    entropy is stored under the plain key), G, the temperature, the trainer's values, the processes."""
    values = getattr(trainer, "trainer_values", None)
    base = unwrap_model(trainer.accelerator.unwrap_model(trainer.model))
    return {
        "num_layers": int(base.config.get_text_config().num_hidden_layers),
        "attn_layers": list(resolve_layers(base, None)),
        "num_generations": int(trainer.num_generations),
        "temperature": float(getattr(trainer, "temperature", 1.0)),
        "model": type(base).__name__,
        "trainer": dataclasses.asdict(values) if values is not None else None,
        "num_processes": int(trainer.accelerator.num_processes),
        **(meta or {}),
    }


def _local_stats(stats: TokenStats, first: int, B: int, T: int) -> TokenStats:
    """This process's rows [first, first + B) and own T columns of a global TokenStats (identity for one process)."""
    if stats.mask.size(0) == B and stats.mask.size(1) == T:
        return stats
    rows = (slice(first, first + B), slice(0, T))
    fields = {f.name: getattr(stats, f.name) for f in dataclasses.fields(TokenStats)}
    for name, value in fields.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.size(0) == stats.mask.size(0):
            fields[name] = value[rows[0]] if value.dim() == 1 else value[rows].contiguous()
    return TokenStats(**fields)


def _params_dict(params) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


# The key the trainer adds to a kept generation batch: each row's index in it ([B] long), which TRL
# shuffles and splits with the other tensors, so the loss knows where a micro-batch's rows belong.
KEPT_ROW = "kept_row"


class LossRecord:
    """The training loss's record of one kept generation batch (record/kept_batch.py): for a rule that chooses
    its tokens in the loss (scope "microbatch" or "token") or changes the loss, what it used and did in
    each micro-batch of each pass over the batch: the training forward's log-probs and entropies, its
    weights and selected set, the tokens its loss touched and how, the micro-batch and optimizer step.

    The trainer creates it on a kept step, after `kept_batch_fields`, writes the batch at once (no pass
    yet), marks the rows with `KEPT_ROW` and calls `add` after each training micro-batch that carries
    them. When a pass's `steps_per_generation` micro-batches are in, every process gathers its rows (a
    collective: every rank completes the pass at the same micro-batch) and the main process rewrites the
    file with every completed pass (atomic: the file always holds whole passes; a run that stops in the
    middle of a pass keeps the passes before it).
    """

    def __init__(self, trainer, fields: dict[str, Any] | None, path: Path, step: int, out: dict[str, Tensor]):
        self.fields, self.path, self.step = fields, Path(path), int(step)
        self.accelerator = trainer.accelerator
        self.rows, self.columns = out["completion_ids"].shape
        self.device = out["completion_ids"].device
        self.micro_batches = int(trainer.steps_per_generation)
        self.iterations = int(trainer.num_iterations)
        rule = trainer.rule
        self.meta: dict[str, Any] = {
            "iterations": self.iterations,
            "micro_batches": self.micro_batches,
            "rows_per_micro_batch": int(trainer.args.per_device_train_batch_size),
            "gradient_accumulation_steps": int(trainer.args.gradient_accumulation_steps),
            "num_processes": int(trainer.accelerator.num_processes),
            "selects_in_loss": bool(trainer.selects_in_loss),
            "changes_loss": bool(rule.changes_loss),
            "scope": getattr(rule.params, "scope", None),
            "aggregation": trainer.microbatch_aggregation,
            "ranks": trainer.microbatch_ranks,
            "normalize": NORMALIZE[int(out["token_normalize"])],
            "touched": [],
        }
        self.passes = 0  # completed passes (every rank)
        self.updates: list[dict[str, Any]] = []  # main process: the completed passes, gathered, on the CPU
        self.once: dict[str, Tensor] = {}  # main process: process, old_logp, ref_logp
        self._new_pass()

    @property
    def done(self) -> bool:
        return self.passes >= self.iterations

    def _new_pass(self) -> None:
        B, T, dev = self.rows, self.columns, self.device
        self._buf = {
            "logp": torch.full((B, T), float("nan"), device=dev),
            "entropy": torch.full((B, T), float("nan"), device=dev),
            "weights": torch.full((B, T), float("nan"), device=dev),
            "selected": torch.zeros((B, T), dtype=torch.uint8, device=dev),
            "micro_batch": torch.full((B,), -1, dtype=torch.int32, device=dev),
            "position": torch.full((B,), -1, dtype=torch.int32, device=dev),
        }
        self._touched: dict[str, Tensor] = {}
        self._metrics: list[dict[str, float]] = []
        self._steps: list[int] = []
        self._count = 0
        self._once = {}
        if self.passes == 0:
            self._once = {"process": torch.full((B,), self.accelerator.process_index, dtype=torch.int32, device=dev)}

    def add(
        self,
        inputs: dict[str, Tensor],
        logp: Tensor,
        entropy: Tensor,
        touched: dict[str, Tensor],
        metrics: dict[str, float],
        step: int,
    ) -> None:
        """One training micro-batch of this batch: `inputs` TRL's (with the rule's loss inputs and
        `KEPT_ROW`), `logp`/`entropy` [b, t] its forward's, `touched` the loss-changing rule's sets,
        `metrics` the rule's, `step` the optimizer step it belongs to (1-based, as metrics.jsonl)."""
        rows = inputs[KEPT_ROW].long()
        b, t = logp.shape
        self.meta["normalize"] = NORMALIZE[int(inputs["token_normalize"])]  # a rule in the loss sets it there
        buf = self._buf
        buf["logp"][rows, :t] = logp.detach().float()
        buf["entropy"][rows, :t] = entropy.detach().float()
        buf["weights"][rows, :t] = inputs["token_weights"].detach().float()
        buf["selected"][rows, :t] = (inputs["token_selected"] > 0).to(torch.uint8)
        buf["micro_batch"][rows] = self._count
        buf["position"][rows] = torch.arange(b, dtype=torch.int32, device=rows.device)
        for how, mask in touched.items():
            if how not in self._touched:
                self._touched[how] = torch.zeros((self.rows, self.columns), dtype=torch.uint8, device=self.device)
            self._touched[how][rows, :t] = mask.bool().to(torch.uint8)
        if self.passes == 0:
            for key, name in (("old_per_token_logps", "old_logp"), ("ref_per_token_logps", "ref_logp")):
                value = inputs.get(key)
                if value is not None:
                    if name not in self._once:
                        self._once[name] = torch.full((self.rows, self.columns), float("nan"), device=self.device)
                    self._once[name][rows, :t] = value.detach().float()
        self._metrics.append({k: float(v) for k, v in metrics.items()})
        self._steps.append(int(step))
        self._count += 1
        if self._count == self.micro_batches:
            self._finish_pass()

    def _finish_pass(self) -> None:
        tensors = {**self._buf, **{f"touched:{how}": m for how, m in self._touched.items()}, **self._once}
        rows = distributed.gather_rows(tensors, self.accelerator)
        if self.fields is not None:  # the main process
            rows = {k: v.detach().cpu() for k, v in rows.items()}
            for how in self._touched:
                if how not in self.meta["touched"]:
                    self.meta["touched"].append(how)
            self.updates.append(
                {
                    **{k: rows[k] for k in self._buf},
                    "selected": rows["selected"].bool(),
                    "touched": {how: rows[f"touched:{how}"].bool() for how in self._touched},
                    "metrics": self._metrics,
                    "steps": self._steps,
                }
            )
            self.once.update({k: rows[k] for k in self._once})
        self.passes += 1
        self.save()
        self._new_pass()

    def payload(self) -> dict[str, Any]:
        """`save_batch`'s `loss_record`."""
        return {"meta": {**self.meta, "updates_done": len(self.updates)}, **self.once, "updates": self.updates}

    def save(self) -> Path | None:
        """Write the batch with the passes completed so far (main process; None elsewhere)."""
        if self.fields is None:
            return None
        return save_batch(self.path, self.step, **self.fields, loss_record=self.payload())
