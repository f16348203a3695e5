"""With a real engine, statistics ride TRL's own old-log-prob forward (signals/sources.py): a step makes
exactly the forwards plain TRL makes, and every rule's weights from the ridden forward equal those of
a separate statistics pass over the same batch."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import SMALL

from stare_lab.config.run_config import compose
from stare_lab.methods import RuleState, list_methods
from stare_lab.run.runner import build_grpo_config, build_trainer
from stare_lab.tasks.rewards import verifier_reward

pytestmark = pytest.mark.vllm


def _count_forwards(model) -> list[int]:
    """Every forward of the policy goes through its decoder (training, old-log-prob and statistics passes)."""
    count = [0]
    model.get_decoder().register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def _plain_trl(cfg, out_dir):
    from trl import GRPOTrainer

    from stare_lab.models import load_model_and_tokenizer
    from stare_lab.tasks import build_task

    task = build_task(cfg.task)
    model, tok = load_model_and_tokenizer(cfg.model.name_or_path, dtype=cfg.model.dtype)
    return GRPOTrainer(
        model=model,
        reward_funcs=[verifier_reward(task)],
        args=build_grpo_config(cfg, out_dir),
        train_dataset=task.train_dataset(),
        processing_class=tok,
    )


def test_a_step_makes_exactly_trls_forwards(tmp_path):
    cfg = compose(["method=top_entropy", "trainer.max_steps=2", *SMALL])
    ours = build_trainer(cfg, tmp_path / "ours")
    assert ours.stats_source() == "old_logp_forward"
    plain = _plain_trl(cfg, tmp_path / "plain")
    counts = []
    for trainer in (plain, ours):
        n = _count_forwards(trainer.model)
        trainer.train()
        counts.append(n[0])
    # per step: TRL's no-grad old-log-prob forward over the generation batch + one training forward
    assert counts[0] == counts[1] == 2 * 2, counts


def _rollout_inputs(trainer, prompts: int = 2):
    """A generation batch as TRL's sampler hands it over: each prompt repeated num_generations times."""
    G = trainer.num_generations
    return [trainer.train_dataset[i] for i in range(prompts) for _ in range(G)]


RIDING = [r for r in list_methods() if r != "full"]  # full reads nothing: its path is "none"


@pytest.mark.parametrize("rule", RIDING)
def test_ridden_weights_equal_a_separate_pass(rule, tmp_path):
    trainer = build_trainer(compose([f"method={rule}", "trainer.max_steps=1", *SMALL]), tmp_path)
    if trainer.stats_source() != "old_logp_forward":
        pytest.skip(f"{rule}: statistics source {trainer.stats_source()!r} (nothing to ride)")
    trainer.model.train()
    state = RuleState.from_dict(trainer.rule_state.to_dict())  # the rule updates its memory in place
    n = _count_forwards(trainer.model)
    out = trainer._generate_and_score_completions(_rollout_inputs(trainer))
    assert n[0] == 1, f"{rule}: {n[0]} forwards at generation time, expected TRL's one"
    stats, _ = trainer._token_stats(out, given=None)  # the separate pass over the same batch
    state.trainer = trainer.trainer_values
    passed = trainer.rule(stats, state).weights
    ridden = out["token_weights"]
    assert ridden.shape == passed.shape == out["completion_mask"].shape
    torch.testing.assert_close(ridden, passed.to(ridden.dtype), rtol=1e-5, atol=1e-6, msg=rule)
    assert torch.isfinite(ridden).all() and (ridden[out["completion_mask"] == 0] == 0).all()
