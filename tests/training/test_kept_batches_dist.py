"""The loss's record of a kept batch on 2 processes (CPU, gloo): every rank's rows are gathered after
each pass, the rank of each row is kept, the rule replayed per rank gives what each rank trained with,
and the trainer's tokens/trained_frac and touched_frac (summed over the ranks) follow from the record.
KL-Cov at scope microbatch selects in each rank's own micro-batch (microbatch_ranks process); Clip-Cov
with microbatch_ranks gathered selects over every rank's, which the page does not replay and says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dist_worker_train import G, rollout_func
from dist_worker_trl import completion_reward, spawn_env

WORLD, ROWS, STEPS = 2, 12, 2

pytestmark = pytest.mark.slow  # two processes, as the other distributed tests

CASES = {
    "kl_cov": ({}, "process"),
    "clip_cov": ({"ratio": 0.1, "lb": -100.0, "ub": 100.0}, "gathered"),
}


def train(name: str, out_dir: Path) -> list[dict]:
    """Two optimizer steps on one generation batch (num_iterations 2), keeping it; rank 0's log history."""
    import os

    from fixtures_trainer import builtin_lm, grpo_config, rule_trainer

    from stare_lab.methods import get_method
    from stare_lab.tasks.arithmetic import ArithmeticTask

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    params, ranks = CASES[name]
    args = grpo_config(
        out_dir / f"out-{name}",
        per_device_train_batch_size=ROWS // WORLD // 2,
        gradient_accumulation_steps=2,
        num_generations=G,
        num_iterations=2,
        max_completion_length=6,
        max_steps=STEPS,
        learning_rate=0.05,
        optim="sgd",
    )
    torch.manual_seed(0)
    tok, model = builtin_lm()
    trainer = rule_trainer(
        tok,
        model,
        args,
        ArithmeticTask(train_size=48, heldout_size=4).train_dataset(),
        get_method(name, **params),
        completion_reward,
        rollout_func=rollout_func,
        keep_batches_every=1,
        run_dir=out_dir / name,
        microbatch_ranks=ranks,
    )
    trainer.train()
    return trainer.state.log_history


def worker(rank: int, world_size: int, out_dir: Path) -> None:
    import json

    import torch.distributed as dist

    for name in CASES:
        history = train(name, out_dir)
        if rank == 0:
            (out_dir / f"{name}-history.json").write_text(json.dumps(history))
        dist.barrier()


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kept")
    spawn_env(worker, WORLD, folder)
    return folder


@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_keep_every_ranks_rows_of_each_pass(out, name):
    import json

    from stare_lab.training.token_weights import token_fractions
    from stare_lab.viewer import kept_steps, load_run_batch
    from stare_lab.viewer.selection import own_views

    assert kept_steps(out / name) == [0]
    batch = load_run_batch(out / name, 0)
    assert batch.shape[0] == ROWS and batch.loss_meta["num_processes"] == WORLD
    assert batch.process.tolist() == [0] * (ROWS // WORLD) + [1] * (ROWS // WORLD)
    assert [u.index for u in batch.updates] == [0, 1]
    valid = batch.mask > 0
    history = {e["step"]: e for e in json.loads((out / f"{name}-history.json").read_text()) if "loss" in e}
    for u in batch.updates:
        for p in range(WORLD):  # each rank's rows: its micro-batches 0 and 1, each of 3 rows in its order
            mine = batch.process == p
            assert sorted(u.micro_batch[mine].tolist()) == [0, 0, 0, 1, 1, 1]
            for mb in (0, 1):
                assert sorted(u.position[mine & (u.micro_batch == mb)].tolist()) == [0, 1, 2]
        assert not torch.isnan(u.weights[valid]).any() and u.steps == [u.index + 1] * 2
        # the trainer's per-micro-batch fractions sum over the ranks' micro-batch mb
        shares = []
        for mb in (0, 1):
            r = u.micro_batch == mb
            trained, touched = token_fractions(u.weights[r], batch.mask[r], {k: m[r] for k, m in u.touched.items()})
            n = float(valid[r].sum())
            shares.append((float(trained.sum()) / n, float(touched.sum()) / n))
        logged = history[u.index + 1]
        assert logged["tokens/trained_frac"] == pytest.approx(np.mean([s[0] for s in shares]), rel=1e-6)
        assert logged["tokens/touched_frac"] == pytest.approx(np.mean([s[1] for s in shares]), rel=1e-6)
    views = own_views(batch)
    assert len(views) == 2
    if name == "kl_cov":  # per rank, one penalised token per micro-batch at least: replayed per rank
        assert all(v.reproduces is True for v in views), [v.replay_note for v in views]
        for u in batch.updates:
            (how,) = u.touched
            for p in range(WORLD):
                for mb in (0, 1):
                    assert u.touched[how][(batch.process == p) & (u.micro_batch == mb)].sum() >= 1
    else:
        assert all(v.reproduces is None for v in views)
        assert views[0].replay_note == (
            "not replayed: the rule selected over the micro-batches of every rank (microbatch_ranks gathered)"
        )
        assert any((u.weights[valid] == 0).any() for u in batch.updates)  # it detached tokens
