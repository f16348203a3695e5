"""n completions per prompt, sampled with exactly the evaluation's temperature and top-p, with
transformers' `generate` or a `vllm.LLM`; seeded per unit of prompts so that the samples do not
depend on how many processes draw them (`eval_shard`: this process's share of a multi-process run)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm


def sample_units(num_prompts: int, n: int, batch_size: int) -> list[list[list[tuple[int, int]]]]:
    """The (prompt, sample) jobs in seeded units, each a list of generate batches. A unit is
    ⌊batch_size / n⌋ whole prompts in one batch, or, when n > batch_size, one prompt in batches of
    batch_size. Samples depend only on (seed, unit), never on which process draws the unit."""
    if n <= batch_size:
        per = batch_size // n
        return [
            [[(i, j) for i in range(a, min(a + per, num_prompts)) for j in range(n)]]
            for a in range(0, num_prompts, per)
        ]
    return [
        [[(i, j) for j in range(b, min(b + batch_size, n))] for b in range(0, n, batch_size)]
        for i in range(num_prompts)
    ]


def unit_seed(seed: int, unit: int) -> int:
    """The torch seed of one unit of samples (a fixed mix of the run's seed and the unit index)."""
    return (int(seed) * 1_000_003 + unit) % (2**63 - 1)


def generate_samples(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    n: int,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_tokens: int = 1024,
    batch_size: int = 32,
    seed: int = 0,
    shard: tuple[int, int] = (0, 1),
) -> list[list[tuple[str, int]] | None]:
    """n completions per prompt as `(text, length)`: length counts generated tokens up to and
    including the first EOS. A prompt is text, or a message list rendered by the chat template.

    transformers path: `generate` over left-padded batches (`sample_units`: whole prompts with
    all their n samples, each unit seeded by `unit_seed(seed, unit)`), sampling with exactly T and
    top-p (top-k and repetition penalty from a model's generation_config are switched off so every
    table's T/top-p is the whole story). `shard = (rank, processes)`: this process draws units
    rank, rank + processes, ...; prompts of other units are None. Any sharding gives the samples
    of one process. A `vllm.LLM` model uses vLLM's sampler instead (`_generate_vllm`: the same T, top-p,
    seeds per prompt and sharding by prompt).
    """
    if _is_vllm_model(model):
        return _generate_vllm(model, prompts, n, temperature, top_p, max_tokens, seed, shard)
    chat = bool(prompts) and not isinstance(prompts[0], str)
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if chat else p for p in prompts
    ]
    eos = _eos_ids(model, tokenizer)
    saved = (tokenizer.padding_side, tokenizer.pad_token)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    sampling = (
        dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        if temperature > 0
        else dict(do_sample=False)
    )
    rank, processes = shard
    units = list(enumerate(sample_units(len(texts), n, batch_size)))[rank::processes]
    out: list[list[Any] | None] = [None] * len(texts)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for u, batches in tqdm(units, desc="sampling", unit="unit", leave=False):
            torch.manual_seed(unit_seed(seed, u))
            for batch in batches:
                enc = tokenizer(
                    [texts[i] for i, _ in batch], return_tensors="pt", padding=True, add_special_tokens=not chat
                ).to(device)
                with torch.no_grad():
                    ids = model.generate(
                        **enc,
                        max_new_tokens=max_tokens,
                        pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=sorted(eos),
                        repetition_penalty=1.0,
                        **sampling,
                    )
                for row, (i, j) in zip(ids[:, enc["input_ids"].shape[1] :].tolist(), batch, strict=True):
                    length = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
                    out[i] = out[i] or [None] * n
                    out[i][j] = (tokenizer.decode(row[:length], skip_special_tokens=True), length)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
        model.train(was_training)
    return out


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if source is not None:
            ids.update(source if isinstance(source, (list, tuple)) else [source])
    if not ids:
        raise ValueError(
            "generate_samples: neither the model's generation_config nor the tokenizer defines an EOS token"
        )
    return {int(i) for i in ids}


def _is_vllm_model(model: Any) -> bool:
    """A `vllm.LLM`; read from sys.modules: an engine exists only once vLLM is imported, and importing it
    here would cost seconds on every evaluation with transformers."""
    vllm = sys.modules.get("vllm")
    return vllm is not None and isinstance(model, vllm.LLM)


def engine_name(model: Any) -> str:
    """The sampler an evaluation result records in its settings: "vllm" or "transformers"."""
    return "vllm" if _is_vllm_model(model) else "transformers"


def _generate_vllm(
    llm: Any,
    prompts: Sequence[Any],
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int,
    shard: tuple[int, int] = (0, 1),
) -> list[list[tuple[str, int]] | None]:
    """vLLM's sampler with exactly T and top-p (top-k off, no penalties), prompt i seeded by
    `unit_seed(seed, i)` (the same samples however the prompts are sharded); this shard's prompts
    are rank, rank + processes, ...; the others are None. Lengths count tokens up to and including
    EOS, as the transformers path does."""
    from vllm import SamplingParams  # deferred: vLLM is optional (its own environment, docs/vllm.md)

    rank, processes = shard
    mine = list(range(len(prompts)))[rank::processes]
    params = [
        SamplingParams(
            n=n, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_tokens, seed=unit_seed(seed, i)
        )
        for i in mine
    ]
    out: list[list[tuple[str, int]] | None] = [None] * len(prompts)
    if not mine:
        return out
    chosen = [prompts[i] for i in mine]
    chat = not isinstance(chosen[0], str)
    results = llm.chat(chosen, params, use_tqdm=False) if chat else llm.generate(chosen, params, use_tqdm=False)
    for i, r in zip(mine, results, strict=True):
        out[i] = [(o.text, len(o.token_ids)) for o in r.outputs]
    return out


def eval_shard() -> tuple[int, int]:
    """(rank, processes) of a multi-process run's evaluation: torch.distributed's when it is
    running with several processes, else (0, 1)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's per-sample rows, on every rank (one all_gather_object)."""
    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, rows)
    return [r for share in shares for r in share]
