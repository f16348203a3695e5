"""A real 2-process TRL 1.16 GRPOTrainer step on CPU, to check the row layout global statistics rely on.

The processes rendezvous the way the recommended launcher path does (docs/distributed.md §5):
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK in the environment, as
`submitit.helpers.TorchDistributedEnvironment().export()` sets them; accelerate's PartialState,
created by GRPOConfig, initialises torch.distributed (gloo on CPU). Each rank records what its
`_generate_and_score_completions` received and returned.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

G, B_LOCAL = 4, 6  # 12 rows per generation batch: group 1 has rows 4-5 on rank 0 and 6-7 on rank 1


def spawn_env(fn, world_size: int, out_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _entry, args=(fn, world_size, port, str(out_dir)), nprocs=world_size, join=True, start_method="spawn"
    )


def _entry(rank: int, fn, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    torch.set_num_threads(1)
    fn(rank, world_size, Path(out_dir))


def completion_reward(completions, **kwargs):
    """Deterministic in the completion text, varied within a group."""
    return [float(sum(map(ord, c)) % 5) for c in completions]


def trl_layout_worker(rank: int, world_size: int, out_dir: Path) -> None:
    import torch.distributed as dist
    from fixtures_trainer import TRL_DEFAULT, grpo_config, tiny_lm, trainer_kwargs
    from trl import GRPOTrainer

    from stare_lab.signals.distributed import global_token_stats
    from stare_lab.stats import TokenStats
    from stare_lab.tasks.arithmetic import ArithmeticTask

    records = []

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            texts = self.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
            B, T = out["completion_ids"].shape
            group = (self.accelerator.process_index * B + torch.arange(B)) // self.num_generations
            local = TokenStats(
                logp=torch.full((B, T), float("nan")),
                mask=out["completion_mask"],
                advantages=out["advantages"],
                group=group,
            )
            gathered, rows = global_token_stats(local, self.accelerator)
            records.append(
                {
                    "prompts": [x["prompt"] for x in inputs],
                    "completions": texts,
                    "advantages": out["advantages"].clone(),
                    "process_index": self.accelerator.process_index,
                    "num_processes": self.accelerator.num_processes,
                    "global_group": gathered.group,
                    "global_advantages": gathered.advantages,
                    "rows": rows,
                }
            )
            return out

    args = grpo_config(
        out_dir / "trl",
        per_device_train_batch_size=B_LOCAL,
        num_generations=G,
        max_completion_length=6,
        epsilon_high=TRL_DEFAULT,
    )
    tok, model = tiny_lm()
    dataset = ArithmeticTask(train_size=48, heldout_size=4).train_dataset()
    trainer = Recording(**trainer_kwargs(tok, model, args, dataset, completion_reward))
    trainer.train()
    torch.save(records, out_dir / f"trl_rank{rank}.pt")
    dist.barrier()
