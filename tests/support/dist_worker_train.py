"""Training on 1 and on 2 processes over the same global generation batches.

Sampling differs between a 1-process and a 2-process run (each rank has its own random stream),
so completions come from a deterministic `rollout_func` (TRL's public hook): rollout j of a
prompt is a pseudo-random token sequence drawn from (prompt, j), where j = global row mod G and
global row = process_index · B_local + local row (docs/distributed.md §1). Both runs then train
on the same global batches; the optimizer is plain SGD (see tests/training/test_distributed_train.py for
why not Adam).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from dist_worker_trl import completion_reward

G, ROWS, STEPS, MAX_LEN, LR = 4, 12, 2, 6, 0.05  # 12 rows per generation batch: 6 per rank on 2 ranks


def rollout_func(prompts: list, trainer) -> dict:
    tok = trainer.processing_class
    first = trainer.accelerator.process_index * len(prompts)
    prompt_ids, completion_ids = [], []
    for i, prompt in enumerate(prompts):
        j = (first + i) % G
        g = torch.Generator().manual_seed(zlib.crc32(prompt.encode()) * 8 + j)
        length = int(torch.randint(2, MAX_LEN + 1, (1,), generator=g))
        ids = torch.randint(3, len(tok), (length,), generator=g).tolist()
        if length < MAX_LEN:
            ids[-1] = tok.eos_token_id
        prompt_ids.append(tok(prompt, add_special_tokens=False)["input_ids"])
        completion_ids.append(ids)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def train(rule: str | None, out_dir: Path, world_size: int, **rule_params) -> list[torch.Tensor]:
    """Parameters after STEPS optimizer steps; rule None = plain TRL GRPOTrainer."""
    import os

    from fixtures_trainer import builtin_lm, grpo_config, trainer_kwargs
    from trl import GRPOTrainer

    from stare_lab.tasks.arithmetic import ArithmeticTask

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = grpo_config(
        out_dir / f"run-{rule}",
        per_device_train_batch_size=ROWS // world_size // 2,
        gradient_accumulation_steps=2,
        num_generations=G,
        max_completion_length=MAX_LEN,
        max_steps=STEPS,
        learning_rate=LR,
        optim="sgd",
        lr_scheduler_type="constant",
    )
    torch.manual_seed(0)
    # the shipped, trained model: its next-token entropies vary from token to token, so a top-k by
    # entropy has no near-ties that float noise between the two layouts could flip
    tok, model = builtin_lm()
    dataset = ArithmeticTask(train_size=48, heldout_size=4).train_dataset()
    kwargs = dict(**trainer_kwargs(tok, model, args, dataset, completion_reward), rollout_func=rollout_func)
    if rule is None:
        trainer = GRPOTrainer(**kwargs)
    else:
        from stare_lab.methods import get_method
        from stare_lab.training.trainer import TokenRuleGRPOTrainer

        keep = dict(keep_batches_every=1, run_dir=out_dir / f"kept-{world_size}") if rule == "ict" else {}
        trainer = TokenRuleGRPOTrainer(rule=get_method(rule, **rule_params), **keep, **kwargs)
    trainer.train()
    return [p.detach().clone() for p in trainer.model.parameters()]


RUNS = [
    (None, {}),
    ("full", {}),
    ("top_entropy", {}),
    ("gmts", {}),
    ("stare", {"H_tgt": 10.0}),
    ("ict", {"warmup_steps": 0, "rho": 0.3}),
]  # ict: JS of group 1, split over the ranks


def train_worker(rank: int, world_size: int, out_dir: Path) -> None:
    import torch.distributed as dist

    results = {}
    for rule, params in RUNS:
        results[(rule, repr(params))] = train(rule, out_dir, world_size, **params)
        dist.barrier()
    torch.save(results, out_dir / f"train_rank{rank}.pt")
