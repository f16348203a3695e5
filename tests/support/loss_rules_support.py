"""The trainer-against-`token_loss` check, written once: a trainer with one rule on an off-policy
generation batch (`make_trainer`), the statistics its rule sees (`reference_stats`), and the check that
the trainer's loss equals `objective.token_loss` in value and gradient (`assert_trainer_equals_token_loss`).

Used by tests/training/test_loss_rules.py and tests/methods/test_dual_clip.py; the model, task and
batch come from loss_compose_support.py (its `setup` fixture).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from fixtures_trainer import TRL_DEFAULT, grpo_config
from loss_compose_support import G, current_logps, generation_batch, length_reward

from stare_lab.methods import get_method
from stare_lab.methods.registry import Rule
from stare_lab.training.objective import token_loss
from stare_lab.training.token_weights import apply_rule, microbatch_stats
from stare_lab.training.trainer import TokenRuleGRPOTrainer

T_MAX = 12


def make_trainer(setup, tmp_path, rule, **kw):
    tok, model, saved, task = setup
    ref = kw.pop("ref", False)
    vllm = kw.pop("vllm", None)
    args = grpo_config(tmp_path, num_generations=G, max_completion_length=T_MAX, logging_steps=TRL_DEFAULT, **kw)
    ds = task.train_dataset()
    trainer = TokenRuleGRPOTrainer(
        model=saved if ref else copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        rule=rule if isinstance(rule, Rule) else get_method(rule),
    )
    batch = generation_batch(trainer, ds, vllm)  # off-policy old and sampling log-probs, IS ratios
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    if vllm:
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
        trainer.vllm_importance_sampling_mode = vllm
    return trainer, batch


def grads(trainer, loss):
    trainer.model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def logp_with_grad(trainer, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    am = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    return trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, am, batch["completion_ids"].size(1), compute_entropy=True
    )[:2]


def reference_stats(trainer, batch):
    """The statistics the trainer's rule sees for this batch: the rollout pass (scope batch, group,
    sequence), or the training forward's own, detached (scope microbatch and token), with the batch's
    old log-probs; the current policy's entropy for a loss-changing rule's `loss` (token_loss reads it)."""
    rule = trainer.rule
    logp, entropies, _ = current_logps(trainer, batch)
    if trainer.selects_in_loss:
        stats = microbatch_stats(rule.needs_for(trainer.trainer_values), batch, entropies, logp, 0)
    else:
        stats, _ = trainer._token_stats(batch)
    if rule.changes_loss:
        stats = dataclasses.replace(stats, entropy=entropies.float())
    if stats.old_logp is None:
        stats = dataclasses.replace(stats, old_logp=batch["old_per_token_logps"])
    if trainer.beta != 0.0:
        stats = dataclasses.replace(stats, ref_logp=batch["ref_per_token_logps"])
    return stats


def assert_trainer_equals_token_loss(trainer, batch, iteration=0):
    rule = trainer.rule
    state = copy.deepcopy(trainer.rule_state)
    state.iteration = iteration
    if not trainer.selects_in_loss:  # the generation batch's weights, from the statistics with these old log-probs
        stats, _ = trainer._token_stats(batch)
        batch.update(apply_rule(rule, copy.deepcopy(state), stats, trainer.accelerator).inputs)
    stats = reference_stats(trainer, batch)
    loss = trainer._compute_loss(trainer.model, batch)
    got = grads(trainer, loss)
    logp, _ = logp_with_grad(trainer, batch)
    want_loss = token_loss(rule, stats, state, logp, max_completion_length=T_MAX)
    want = grads(trainer, want_loss)
    assert loss.item() == pytest.approx(want_loss.item(), rel=2e-5, abs=1e-7), rule.name
    assert len(got) == len(want) and any(g.abs().sum() > 0 for g in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-7)
    return loss
