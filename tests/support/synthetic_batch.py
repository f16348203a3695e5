"""A random but well-formed kept batch (a test fixture, also used by benchmarks/viewer_speed.py).

Statistics are drawn with the ranges the real ones have (entropy ≥ 0, AE ∈ [0, 1], JS ∈ [0, log 2],
p2 ∈ (0, 1]), completions have random lengths (some rows empty) and rewards vary within groups.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import torch

from stare_lab.record.kept_batch import batch_path, save_batch

PIECES = list(string.ascii_lowercase + string.digits + " +-=*\n") + ["<eos>", "\\boxed{", "}", "</script>"]


def random_batch_tensors(B: int = 16, T: int = 24, G: int = 4, seed: int = 0) -> dict:
    """Keyword arguments of `save_batch` (without path and step) for a random batch."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T  # one full-length row
    if B > 2:
        lengths[1] = 0  # one empty completion
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logits_p = torch.rand(B, T, generator=g)
    logp = torch.log(logits_p.clamp(min=1e-4)) * mask
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    group = torch.arange(B) // G
    r = rewards.view(-1, G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    stats = {
        "logp": logp,
        "old_logp": logp.clone(),
        "entropy": torch.rand(B, T, generator=g).pow(2) * 3 * mask,
        "attn_entropy": torch.rand(B, T, generator=g) * mask,
        "js": torch.rand(B, T, generator=g) * math.log(2) * mask,
        "p2": (0.05 + 0.95 * torch.rand(B, T, generator=g)) * mask,
    }
    stats["p2logp"] = stats["p2"] * torch.log(stats["p2"].clamp(min=1e-6)) * mask
    ids = torch.randint(0, len(PIECES), (B, T), generator=g) * mask.long()
    prompts = [f"What is {3 * int(i) + 7} + {int(i) * 11}?" for i in group]
    return dict(
        completion_ids=ids,
        mask=mask,
        rewards=rewards,
        advantages=adv,
        group=group,
        stats=stats,
        token_pieces=dict(enumerate(PIECES)),
        prompts=prompts,
    )


def write_random_batch(
    run_dir: Path | str,
    step: int,
    *,
    B: int = 16,
    T: int = 24,
    G: int = 4,
    seed: int = 0,
    run_rule: dict | None = None,
    num_layers: int = 4,
) -> Path:
    """Write `<run_dir>/batches/step-<step>.safetensors` with random statistics."""
    kw = random_batch_tensors(B, T, G, seed + step)
    return save_batch(
        batch_path(run_dir, step),
        step,
        **kw,
        run_rule=run_rule or {"name": "stare", "params": {"H_tgt": 10.0}},
        rule_state={"step": step, "total_steps": 20, "seed": seed, "memory": {}},
        meta={
            "num_layers": num_layers,
            "attn_layers": [num_layers // 2],
            "synthetic": True,
            "trainer": {
                "epsilon_low": 0.2,
                "epsilon_high": 0.28,
                "beta": 0.0,
                "loss_type": "dapo",
                "num_generations": G,
            },
        },
    )
