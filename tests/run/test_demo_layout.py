"""The demo's layout makes PPO's clip act (issue 47): three optimizer steps per generation batch, so the
second and third steps of a batch train off-policy. The first step of each batch is on-policy (the ratio is
1 to the bit: nothing clipped); the later steps clip some tokens, and a rule that acts through the clip
(`archer`: its own clip ranges) then trains differently from `full`. Real TRL training on the built-in
testbed at the demo sweep's own resolved config, 6 steps (two generation batches), no evaluation."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import load_sweep
from stare_lab.run.runner import build_trainer

STEPS = 6


def demo_config(method: str):
    run = next(r for r in expand_sweep(load_sweep("demo")) if r.config["method"]["name"] == method and r.seed == 0)
    cfg = OmegaConf.create(run.config)
    cfg.trainer.max_steps, cfg.trainer.keep_batches_every, cfg.trainer.save_steps = STEPS, 0, 100
    cfg.logger.wandb, cfg.eval.enabled = False, False
    return cfg


def train(method: str, tmp_path):
    run_dir = tmp_path / method
    run_dir.mkdir()
    trainer = build_trainer(demo_config(method), run_dir)
    trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return [r for r in trainer.state.log_history if "clip_ratio/region_mean" in r], params


def test_the_demo_makes_three_steps_per_generation_batch():
    cfg = demo_config("full").trainer
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.steps_per_generation) == (16, 1, 3)
    assert 16 * 3 == 6 * cfg.num_generations  # 6 prompts × 8 rollouts per generation batch


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    return {m: train(m, tmp) for m in ("full", "archer")}


def test_clipping_acts_on_the_off_policy_steps_only(trained):
    rows, _ = trained["full"]
    clipped = {r["step"]: r["clip_ratio/region_mean"] for r in rows}  # TRL's logged value, as in metrics.jsonl
    assert sorted(clipped) == list(range(1, STEPS + 1))
    assert clipped[1] == 0.0 and clipped[4] == 0.0, clipped  # each batch's first step: the ratio is 1
    assert max(clipped[s] for s in (2, 3, 5, 6)) > 0.0, clipped


def test_a_rule_that_acts_through_the_clip_trains_differently_from_full(trained):
    (full_rows, full), (archer_rows, archer) = trained["full"], trained["archer"]
    assert full_rows[0]["loss"] == archer_rows[0]["loss"]  # the same first batch, the same on-policy step
    assert not torch.equal(full, archer)
