"""TRL 1.16 with 2 processes lays a generation batch out as global statistics assume.

One real GRPOTrainer run (2 optimizer steps, gloo on CPU, rendezvous from environment variables
as submitit's `TorchDistributedEnvironment().export()` sets them): rank r's generation batch is
global rows r·B_local … (r+1)·B_local − 1, a prompt's G rollouts are consecutive global rows
(group = global row // G) and may span both ranks, and TRL's advantages are group-normalised over
exactly those rows. `global_token_stats`, given the accelerator, gathers them in that order.
"""

from __future__ import annotations

import pytest
import torch
from dist_worker_trl import B_LOCAL, G, completion_reward, spawn_env, trl_layout_worker

WORLD = 2


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl")
    spawn_env(trl_layout_worker, WORLD, out)
    return [torch.load(out / f"trl_rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_rows_of_a_group_are_consecutive_global_rows_across_ranks(records):
    from trl.trainer.utils import nanstd

    steps = len(records[0])
    assert steps == 2 and len(records[1]) == steps
    for step in range(steps):
        per_rank = [records[r][step] for r in range(WORLD)]
        assert [x["process_index"] for x in per_rank] == list(range(WORLD))
        assert all(x["num_processes"] == WORLD for x in per_rank)
        prompts = [p for x in per_rank for p in x["prompts"]]  # global row order = rank order
        assert len(prompts) == WORLD * B_LOCAL
        for g in range(len(prompts) // G):
            assert len(set(prompts[g * G : (g + 1) * G])) == 1, prompts
        assert len(set(prompts)) == len(prompts) // G
        assert per_rank[0]["prompts"][-1] == per_rank[1]["prompts"][0]  # B_local = 6, G = 4: group 1 is split
        # TRL's advantages: (r − mean) / (std + 1e-4) over global rows g·G … g·G + G − 1
        rewards = torch.tensor(completion_reward([c for x in per_rank for c in x["completions"]]))
        grouped = rewards.view(-1, G)
        mean = grouped.mean(1).repeat_interleave(G)
        std = nanstd(grouped, dim=1).repeat_interleave(G)
        expected = (rewards - mean) / (std + 1e-4)
        got = torch.cat([x["advantages"] for x in per_rank])
        assert torch.allclose(got, expected, atol=1e-6), (got, expected)
        # global_token_stats with the accelerator: the same global batch on both ranks, in that order
        for r, x in enumerate(per_rank):
            assert torch.equal(x["global_advantages"], got)
            assert torch.equal(x["global_group"], torch.arange(WORLD * B_LOCAL) // G)
            assert x["rows"][0] == slice(r * B_LOCAL, (r + 1) * B_LOCAL)
